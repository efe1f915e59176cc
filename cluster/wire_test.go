package cluster

import (
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"pagoda/executor"
	"pagoda/kvcache"
	"pagoda/model"
	"pagoda/quant"
	"pagoda/synth"
	"pagoda/testutil"
)

// meshes connects n ranks over 127.0.0.1 and gives each its wire form.
func meshes(t *testing.T, wires []WireDType) []*Mesh {
	t.Helper()
	n := len(wires)
	conns := loopbackConns(t, n)
	out := make([]*Mesh, n)
	for r := range out {
		out[r] = NewMesh(r, conns[r])
		out[r].SetWire(wires[r])
		out[r].timeout = 10 * time.Second
		t.Cleanup(out[r].Close)
	}
	return out
}

// TestMeshWireDTypes: an all-reduce with f16 or bf16 payloads gives every
// rank the same bits, equal to the f32 sum (in rank order) of each rank's
// values rounded to the wire form, and moves half the bytes; an
// all-gather (logits) carries exact f32 values; ranks told different
// forms fail the exchange with both names.
func TestMeshWireDTypes(t *testing.T) {
	const n, size = 3, 1000
	in := make([][]float32, n)
	for r := range in {
		in[r] = make([]float32, size)
		for i := range in[r] {
			in[r][i] = float32(math.Sin(float64(r*size+i))) * float32(1+i%7)
		}
	}
	for _, d := range []WireDType{WireF32, WireF16, WireBF16} {
		ms := meshes(t, []WireDType{d, d, d})
		want := make([]float32, size)
		for r := range n {
			x := append([]float32(nil), in[r]...)
			c := codec{d: d}
			c.round(x)
			for i, v := range x {
				want[i] += v
			}
		}
		got := make([][]float32, n)
		full := make([][]float32, n)
		var wg sync.WaitGroup
		for r, m := range ms {
			got[r] = append([]float32(nil), in[r]...)
			full[r] = make([]float32, n*size)
			wg.Go(func() {
				m.AllReduce(r, got[r])
				m.AllGather(r, append([]float32(nil), in[r]...), full[r], 1)
			})
		}
		wg.Wait()
		for r, m := range ms {
			if err := m.Err(); err != nil {
				t.Fatalf("%s: rank %d: %v", d, r, err)
			}
			for i := range want {
				if math.Float32bits(got[r][i]) != math.Float32bits(want[i]) {
					t.Fatalf("%s: rank %d value %d: %g, want %g", d, r, i, got[r][i], want[i])
				}
			}
			// All-gathers (the output head's logits) travel in f32.
			for q := range n {
				x := in[q]
				for i := range x {
					if math.Float32bits(full[r][q*size+i]) != math.Float32bits(x[i]) {
						t.Fatalf("%s: rank %d gathered rank %d's value %d as %g, want %g", d, r, q, i, full[r][q*size+i], x[i])
					}
				}
			}
			// Two operations, each to n−1 peers: a 10-byte header and
			// the values, the all-reduce's in the wire form, the
			// all-gather's in f32.
			if want := int64((n - 1) * (10 + size*d.Size() + 10 + size*4)); m.Sent() != want {
				t.Errorf("%s: rank %d sent %d bytes, want %d", d, r, m.Sent(), want)
			}
		}
		if d != WireF32 {
			worst := 0.0
			for i := range want {
				var exact float32
				for r := range n {
					exact += in[r][i]
				}
				worst = max(worst, math.Abs(float64(exact-want[i])))
			}
			t.Logf("%s: all-reduce of 3 ranks, max |Δ| against f32 payloads %.3g", d, worst)
		}
	}
	ms := meshes(t, []WireDType{WireF16, WireBF16})
	var wg sync.WaitGroup
	for r, m := range ms {
		wg.Go(func() { m.AllReduce(r, append([]float32(nil), in[r]...)) })
	}
	wg.Wait()
	named := false
	for r, m := range ms {
		err := m.Err()
		if err == nil {
			t.Errorf("rank %d with mismatched wire forms: no error", r)
		} else {
			named = named || strings.Contains(err.Error(), "sends f16 on the wire, this rank expects bf16") ||
				strings.Contains(err.Error(), "sends bf16 on the wire, this rank expects f16")
		}
	}
	if !named {
		t.Error("no rank names the mismatched wire forms")
	}
}

// TestCodecHidden: a pipeline hand-off round-trips in every form (f32
// exactly, as an executor output frame), and a stage told another form
// than its neighbour's refuses the frame.
func TestCodecHidden(t *testing.T) {
	x := []float32{1, -2.5, 3.14159, 65504, 1e-8, float32(math.Inf(-1))}
	for _, d := range []WireDType{WireF32, WireF16, WireBF16} {
		c := codec{d: d}
		p := c.appendHidden(nil, x)
		var out executor.StepOutput
		if err := c.decodeHidden(p, &out); err != nil {
			t.Fatalf("%s: %v", d, err)
		}
		want := append([]float32(nil), x...)
		c.round(want)
		if fmt.Sprint(out.Logits) != fmt.Sprint(want) {
			t.Errorf("%s: %v, want %v", d, out.Logits, want)
		}
		for _, o := range []WireDType{WireF32, WireF16, WireBF16} {
			if o == d {
				continue
			}
			if err := (&codec{d: o}).decodeHidden(p, &out); err == nil || !strings.Contains(err.Error(), "on the wire") {
				t.Errorf("%s frame read as %s: %v", d, o, err)
			}
		}
	}
	if _, err := ParseWireDType("fp8"); err == nil {
		t.Error("fp8 parsed")
	}
}

// startWorkersW is startWorkers that also returns the workers (for their
// byte counts).
func startWorkersW(t *testing.T, path string, n int, wire string) ([]string, []*Worker) {
	t.Helper()
	var addrs []string
	var ws []*Worker
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		w := &Worker{Model: path, Options: model.Options{Threads: 1}, JoinTimeout: 20 * time.Second, Wire: wire}
		go w.Serve(ln)
		t.Cleanup(func() { ln.Close() })
		addrs = append(addrs, ln.Addr().String())
		ws = append(ws, w)
	}
	return addrs, ws
}

// run is one greedy generation driven step by step through an executor,
// the coordinator's KV manager planning every step.
type run struct {
	tokens  []int32     // generated
	rows    [][]float32 // the logits of every step
	prefill time.Duration
	decode  time.Duration // summed over the decode steps
	// bytes the workers sent during the prefill and the decode steps
	// (when drive is given a counter)
	prefillBytes, decodeBytes int64
}

// drive generates n tokens greedily after prompt, or, with force, feeds
// force's tokens instead of its own argmax (teacher forcing, so two
// executors' logits are compared on the same inputs).
func drive(t *testing.T, ex executor.Executor, kc kvcache.Config, prompt []int32, n int, force []int32, sent func() int64) run {
	t.Helper()
	mgr, err := kvcache.New(kc)
	if err != nil {
		t.Fatal(err)
	}
	defer mgr.Close()
	var r run
	pos := 0
	step := func(toks []int32) []float32 {
		in := &executor.StepInput{Tokens: toks}
		for i := range toks {
			in.Pos = append(in.Pos, int32(pos+i))
			in.Seq = append(in.Seq, 0)
		}
		if !mgr.Allocate(0, nil, pos, pos+len(toks)) {
			t.Fatal("KV manager: no room")
		}
		in.KV = new(model.KVPlan)
		if err := mgr.Plan(in.Pos, in.Seq, nil, in.KV); err != nil {
			t.Fatal(err)
		}
		out, err := ex.Execute(in)
		if err != nil {
			t.Fatal(err)
		}
		pos += len(toks)
		return append([]float32(nil), out.Logits...)
	}
	if sent == nil {
		sent = func() int64 { return 0 }
	}
	b0 := sent()
	start := time.Now()
	row := step(prompt)
	r.prefill = time.Since(start)
	b1 := sent()
	r.prefillBytes = b1 - b0
	for i := 0; i < n; i++ {
		r.rows = append(r.rows, row)
		next := argmax(row)
		r.tokens = append(r.tokens, next)
		if i == n-1 {
			break
		}
		if force != nil {
			next = force[i]
		}
		start = time.Now()
		row = step([]int32{next})
		r.decode += time.Since(start)
	}
	r.decodeBytes = sent() - b1
	return r
}

func argmax(x []float32) int32 {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return int32(best)
}

// agreement compares two runs' logits row by row: the largest absolute
// difference, the mean KL(ref ‖ got) of the softmaxes and the share of
// rows with the same argmax.
func agreement(ref, got run) (maxAbs, kl, top1 float64) {
	same := 0
	for i := range ref.rows {
		a, b := ref.rows[i], got.rows[i]
		for j := range a {
			maxAbs = max(maxAbs, math.Abs(float64(a[j]-b[j])))
		}
		pa, pb := logSoftmax(a), logSoftmax(b)
		for j := range pa {
			kl += math.Exp(pa[j]) * (pa[j] - pb[j])
		}
		if argmax(a) == argmax(b) {
			same++
		}
	}
	return maxAbs, kl / float64(len(ref.rows)), float64(same) / float64(len(ref.rows))
}

func logSoftmax(x []float32) []float64 {
	m := float64(x[argmax(x)])
	s := 0.0
	for _, v := range x {
		s += math.Exp(float64(v) - m)
	}
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v) - m - math.Log(s)
	}
	return out
}

// firstDiff is the index of the first differing token, or -1.
func firstDiff(a, b []int32) int {
	for i := range a {
		if i >= len(b) || a[i] != b[i] {
			return i
		}
	}
	return -1
}

// TestWireDTypeModels: stories260K (tensor parallel 2 and pipeline 2)
// with f32, f16 and bf16 activations on the wire against one process,
// 64 greedy tokens after a prompt. f32 is exact for the pipeline and
// within rounding for tensor parallelism; f16/bf16 are measured (logits
// max |Δ|, KL and top-1 under teacher forcing, whether free-running
// greedy stays identical) and bounded loosely; the bytes the workers
// moved must shrink to about half.
// oneProcess is the reference a group is held to: path driven greedily
// over prompt for n tokens in this process. It returns the KV
// configuration the groups use too (without the model's kernels), the
// run, its largest |logit|, and the model's configuration.
func oneProcess(t *testing.T, path string, prompt []int32, n int) (kvcache.Config, run, float64, model.Config) {
	t.Helper()
	whole, err := model.Open(path, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	c := &whole.Config
	kc := kvcache.Config{NLayer: c.NLayer, NKVHead: c.NKVHead, HeadDim: c.HeadDim, BlockSize: 16, NumBlocks: (len(prompt)+n)/16 + 2, DType: kvcache.F32}
	local := kc
	local.Ops = whole.Ops()
	refKV, err := kvcache.New(local)
	if err != nil {
		t.Fatal(err)
	}
	defer refKV.Close()
	ref := drive(t, executor.NewLocal(whole, refKV), kc, prompt, n, nil, nil)
	scale := 0.0
	for _, row := range ref.rows {
		for _, v := range row {
			scale = max(scale, math.Abs(float64(v)))
		}
	}
	return kc, ref, scale, *c
}

func TestWireDTypeModels(t *testing.T) {
	path := filepath.Join(testutil.Shared(t, "models/gguf"), "stories260K.gguf")
	wireModel(t, path, 64, []int32{1, 403, 407, 261, 378, 300, 2}, 1e-4, 0.5)
}

// TestWireDTypeSynth: the same on a TinyLlama-shaped synthetic model (its
// heads, width and vocabulary; 2 layers), a measurement: set
// PAGODA_TIMING=1.
func TestWireDTypeSynth(t *testing.T) {
	if os.Getenv("PAGODA_TIMING") == "" {
		t.Skip("a measurement (set PAGODA_TIMING=1): a 2-layer TinyLlama-shaped model at Q8_0")
	}
	sh, err := synth.Preset("tinyllama-1.1b")
	if err != nil {
		t.Fatal(err)
	}
	sh.Layers = 2
	path := filepath.Join(t.TempDir(), "tl.gguf")
	if err := synth.Write(path, synth.Options{Shape: sh, Type: quant.Q8_0, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	// Q8_0 rows split across ranks sum in another order: tensor
	// parallelism in f32 already moves these logits by a few 1e-2.
	wireModel(t, path, 32, []int32{1, 450, 4996, 17354, 1701, 29916}, 0.1, 5)
}

// wireModel compares tensor parallel 2 and pipeline parallel 2 with each
// wire form against one process: tp32 bounds the f32 group's logits
// difference, bound the 16-bit forms'.
func wireModel(t *testing.T, path string, n int, prompt []int32, tp32, bound float64) {
	kc, ref, scale, whole := oneProcess(t, path, prompt, n)
	c := &whole
	t.Logf("one process: largest |logit| %.3g; load average %s", scale, loadAvg())
	shard, err := OpenShape(path, 2, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer shard.Close()
	var lastSent int64
	for _, mode := range []string{"tp", "pp"} {
		var f32Bytes int64
		for _, d := range []WireDType{WireF32, WireF16, WireBF16} {
			addrs, ws := startWorkersW(t, path, 2, "")
			var ex interface {
				executor.Executor
				Close() error
			}
			if mode == "tp" {
				ex, err = Connect(addrs, GroupOptions{Model: &shard.Config, KV: kc, Threads: 1, Timeout: time.Minute, Wire: d})
			} else {
				ex, err = ConnectPipeline(addrs, PipelineOptions{Model: c, KV: kc, Threads: 1, Timeout: time.Minute, Wire: d})
			}
			if err != nil {
				t.Fatal(err)
			}
			free := drive(t, ex, kc, prompt, n, nil, func() int64 { return ws[0].Sent() + ws[1].Sent() })
			lastSent = free.prefillBytes + free.decodeBytes
			ex.Close()
			// A fresh group for the teacher-forced run (the KV storage
			// holds the first run's sequence).
			addrs, _ = startWorkersW(t, path, 2, "")
			if mode == "tp" {
				ex, err = Connect(addrs, GroupOptions{Model: &shard.Config, KV: kc, Threads: 1, Timeout: time.Minute, Wire: d})
			} else {
				ex, err = ConnectPipeline(addrs, PipelineOptions{Model: c, KV: kc, Threads: 1, Timeout: time.Minute, Wire: d})
			}
			if err != nil {
				t.Fatal(err)
			}
			forced := drive(t, ex, kc, prompt, n, ref.tokens, nil)
			ex.Close()
			maxAbs, kl, top1 := agreement(ref, forced)
			diff := firstDiff(ref.tokens, free.tokens)
			t.Logf("%s %s: %d greedy tokens identical: %v (first difference at %d); teacher-forced logits max |Δ| %.3g, mean KL %.3g, top-1 %.3f; workers sent %d bytes in the %d-token prefill, %.0f per decode step; prefill %v, decode %.2f ms/token",
				mode, d, n, diff < 0, diff, maxAbs, kl, top1, free.prefillBytes, len(prompt), float64(free.decodeBytes)/float64(n-1),
				free.prefill.Round(time.Millisecond), float64(free.decode.Microseconds())/1000/float64(n-1))
			switch {
			case d == WireF32 && mode == "pp" && maxAbs != 0:
				t.Errorf("pp f32: logits differ from one process by %g (want bit-identical)", maxAbs)
			case d == WireF32 && maxAbs > tp32:
				t.Errorf("%s f32: logits differ from one process by %g", mode, maxAbs)
			case d == WireF32 && diff >= 0:
				t.Errorf("%s f32: greedy tokens differ from one process at %d", mode, diff)
			case maxAbs > bound:
				t.Errorf("%s %s: logits differ from one process by %g (bound %g)", mode, d, maxAbs, bound)
			case top1 < 0.9:
				t.Errorf("%s %s: top-1 agreement %.3f", mode, d, top1)
			}
			// Activations halve; the logits all-gather stays f32, so a
			// tensor-parallel step moves between half and all of f32's.
			lo, hi := 0.45, 0.6
			if mode == "tp" {
				lo, hi = 0.45, 0.95
			}
			if d == WireF32 {
				f32Bytes = lastSent
			} else if r := float64(lastSent) / float64(f32Bytes); r < lo || r > hi {
				t.Errorf("%s %s: %d bytes against f32's %d (ratio %.3f, want [%.2f, %.2f])", mode, d, lastSent, f32Bytes, r, lo, hi)
			}
		}
	}
}

// TestWireDTypeRefusals: a worker started with one wire form refuses a
// coordinator asking for another, by name, and serves the next group.
func TestWireDTypeRefusals(t *testing.T) {
	path := filepath.Join(testutil.Shared(t, "models/gguf"), "stories260K.gguf")
	coord, err := OpenShape(path, 2, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer coord.Close()
	c := &coord.Config
	kc := kvcache.Config{NLayer: c.NLayer, NKVHead: c.NKVHead, HeadDim: c.HeadDim, BlockSize: 16, NumBlocks: 8}
	pinned, _ := startWorkersW(t, path, 1, "bf16")
	free, _ := startWorkersW(t, path, 1, "")
	// The pinned worker first: it refuses at once, and the other rank
	// does not wait for it to join.
	addrs := append(pinned, free...)
	_, err = Connect(addrs, GroupOptions{Model: c, KV: kc, Threads: 1, Timeout: time.Minute, Wire: WireF16})
	if err == nil || !strings.Contains(err.Error(), "asks for f16 activations on the wire, this worker is started with --wire-dtype bf16") {
		t.Errorf("f16 coordinator, bf16 worker: %v", err)
	}
	// In a pipeline the first stage does not wait for the next to load.
	stage, err := OpenStageShape(path, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer stage.Close()
	_, err = ConnectPipeline([]string{free[0], pinned[0]}, PipelineOptions{Model: &stage.Config, KV: kc, Threads: 1, Timeout: time.Minute})
	if err == nil || !strings.Contains(err.Error(), "asks for f32") {
		t.Errorf("f32 pipeline, bf16 worker: %v", err)
	}
	g, err := Connect(addrs, GroupOptions{Model: c, KV: kc, Threads: 1, Timeout: time.Minute, Wire: WireBF16})
	if err != nil {
		t.Fatalf("bf16 group after refusals: %v", err)
	}
	g.Close()
}

// loadAvg is the machine's load average, for timings' context.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}
