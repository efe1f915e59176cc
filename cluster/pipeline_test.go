package cluster

import (
	"context"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"pagoda/engine"
	"pagoda/executor"
	"pagoda/kvcache"
	"pagoda/model"
	"pagoda/quant"
	"pagoda/synth"
	"pagoda/testutil"
)

// ppEngine is an engine whose steps run through a pipeline of the
// workers at addrs, each step cut into micro micro-batches, with the
// coordinator holding only the first layer for its shapes and tokenizer.
func ppEngine(t *testing.T, path string, addrs []string, micro, blocks int) (*engine.Engine, *Pipeline) {
	t.Helper()
	coord, err := OpenStageShape(path, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { coord.Close() })
	cfg := engine.ModelConfig(coord, "pp")
	cfg.KVBlocks = blocks
	var p *Pipeline
	cfg.Executor = func(kc kvcache.Config) (executor.Executor, error) {
		var err error
		p, err = ConnectPipeline(addrs, PipelineOptions{Model: &coord.Config, KV: kc, Threads: 1, MicroBatches: micro, Timeout: time.Minute})
		return p, err
	}
	eng, err := engine.New(nil, coord.Tokenizer(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	eng.Start()
	t.Cleanup(func() {
		eng.Stop(context.Background())
		p.Close()
	})
	return eng, p
}

// TestPipelineEngine: the golden llamas cut into 2 and 3 stages on
// workers over TCP, several sequences in one continuous batch through
// the coordinator's paged KV manager, steps whole or in micro-batches,
// give the single-process engine's greedy tokens and log-probabilities
// exactly: each layer runs the same arithmetic, in another process.
// MQA and the mixtures of experts, which tensor parallelism refuses,
// split by layers; so does stories260K (5 layers: 3 + 2).
func TestPipelineEngine(t *testing.T) {
	dir := testutil.Shared(t, "golden/models")
	for _, c := range []struct {
		file          string
		stages, micro int
	}{
		{"g-llama3-ropefreqs.F32.gguf", 2, 1},
		{"g-llama3-ropefreqs.F32.gguf", 2, 3},
		{"g-llama-mqa.F16.gguf", 3, 2},
		{"g-qwen2.F32.gguf", 2, 2},
		{"g-qwen2moe.Q8_0.gguf", 2, 2},
		{"g-mixtral.F32.gguf", 2, 1},
		{"../../models/gguf/stories260K.gguf", 2, 2},
		{"g-deepseek2.F32.gguf", 3, 2},
	} {
		t.Run(fmt.Sprintf("%s/%dstages/%dmicro", c.file, c.stages, c.micro), func(t *testing.T) {
			path := filepath.Join(dir, c.file)
			pp, pl := ppEngine(t, path, startWorkers(t, path, c.stages), c.micro, 64)
			prompts, want, got := againstWhole(t, path, pp)
			for i := range prompts {
				if fmt.Sprint(got[i].tokens) != fmt.Sprint(want[i].tokens) {
					t.Fatalf("%q: tokens %v, want %v", prompts[i], got[i].tokens, want[i].tokens)
				}
				for j := range want[i].top {
					if fmt.Sprint(got[i].top[j]) != fmt.Sprint(want[i].top[j]) {
						t.Fatalf("%q token %d: top log-probabilities %v, want %v", prompts[i], j, got[i].top[j], want[i].top[j])
					}
				}
			}
			st := pl.Stats()
			t.Logf("%d steps in %d micro-batches: tokens and log-probabilities identical; bubble %.2f", st.Steps, st.MicroBatches, st.Bubble())
		})
	}
}

// TestPipelineRefusals: more stages than layers, a stage with another
// model file, and a step a stage fails are errors naming the stage and
// the reason; a failed step breaks the pipeline (later steps get the same
// error, nothing waits), and the workers serve the next pipeline.
func TestPipelineRefusals(t *testing.T) {
	dir := testutil.Shared(t, "golden/models")
	path := filepath.Join(dir, "g-llama3-ropefreqs.F32.gguf")
	coord, err := OpenStageShape(path, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer coord.Close()
	c := &coord.Config
	kc := kvcache.Config{NLayer: c.NLayer, NKVHead: c.NKVHead, HeadDim: c.HeadDim, BlockSize: 16, NumBlocks: 16}
	o := PipelineOptions{Model: c, KV: kc, Threads: 1, Timeout: time.Minute}
	if _, err := ConnectPipeline(startWorkers(t, path, 3), o); err == nil || !strings.Contains(err.Error(), "3 stages for a model of 2 layers") {
		t.Errorf("3 stages of 2 layers: %v", err)
	}
	mixed := append(startWorkers(t, path, 1), startWorkers(t, filepath.Join(dir, "g-llama-mqa.F16.gguf"), 1)...)
	if _, err := ConnectPipeline(mixed, o); err == nil || !strings.Contains(err.Error(), "stage 1") || !strings.Contains(err.Error(), "is not the coordinator's") {
		t.Errorf("another model on stage 1: %v", err)
	}
	good := startWorkers(t, path, 2)
	p, err := ConnectPipeline(good, o)
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := kvcache.NewManager(kc)
	if err != nil {
		t.Fatal(err)
	}
	if !mgr.Allocate(0, nil, 0, 2) {
		t.Fatal("no room")
	}
	bad := &executor.StepInput{Tokens: []int32{1, int32(c.VocabSize)}, Pos: []int32{0, 1}, Seq: []int32{0, 0}, KV: new(model.KVPlan)}
	if err := mgr.Plan(bad.Pos, bad.Seq, nil, bad.KV); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := p.Execute(bad); done <- err }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "stage 0") || !strings.Contains(err.Error(), "out of range") {
			t.Errorf("a token out of range: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("a failing step hung the pipeline")
	}
	bad.Tokens[1] = 5
	if _, err := p.Execute(bad); err == nil || !strings.Contains(err.Error(), "out of range") {
		t.Errorf("after a failed step: %v", err)
	}
	p.Close()
	p, err = ConnectPipeline(good, o)
	if err != nil {
		t.Fatalf("the workers after a broken pipeline: %v", err)
	}
	p.Close()
}

// bubbleWorkload drives a pipeline the way the engine would, without it:
// a KV manager on this side plans a prefill of seqs prompts of plen tokens
// in one step, then decode steps of all of them, and the logits of every
// step come back.
func bubbleWorkload(t *testing.T, ex executor.Executor, kc kvcache.Config, vocab, seqs, plen, decode int) [][]float32 {
	t.Helper()
	mgr, err := kvcache.NewManager(kc)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]float32
	step := func(in *executor.StepInput) {
		in.KV = new(model.KVPlan)
		for i, s := range in.Seq {
			if !mgr.Allocate(s, nil, 0, int(in.Pos[i])+1) {
				t.Fatal("no room")
			}
		}
		if err := mgr.Plan(in.Pos, in.Seq, nil, in.KV); err != nil {
			t.Fatal(err)
		}
		o, err := ex.Execute(in)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, append([]float32(nil), o.Logits...))
	}
	var pre executor.StepInput
	for s := range seqs {
		for p := range plen {
			pre.Tokens = append(pre.Tokens, int32((s*131+p*17)%vocab))
			pre.Pos = append(pre.Pos, int32(p))
			pre.Seq = append(pre.Seq, int32(s))
			pre.Logits = append(pre.Logits, p == plen-1)
		}
	}
	step(&pre)
	for d := range decode {
		var in executor.StepInput
		for s := range seqs {
			in.Tokens = append(in.Tokens, int32((s*7+d*3)%vocab))
			in.Pos = append(in.Pos, int32(plen+d))
			in.Seq = append(in.Seq, int32(s))
			in.Logits = append(in.Logits, true)
		}
		step(&in)
	}
	return out
}

// TestPipelineBubbleSimulated measures the schedule's bubble apart from
// the machine: every stage's compute is extended by a sleep per row (a
// device that takes no core from the other stages), 2 ms per row against
// the model's fraction of a millisecond, so the stages truly overlap and
// the bubble follows GPipe's (M−1)/(k+M−1) plus the hand-offs. It checks
// that the bubble (of the fastest of three runs) stays within 0.15 above
// that bound; for whole steps the bound is 1 − 1/M.
func TestPipelineBubbleSimulated(t *testing.T) {
	path, coord, kc := simulatedPipeline(t)
	for _, stages := range []int{2, 3} {
		var addrs []string
		for range stages {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			w := &Worker{Model: path, Options: model.Options{Threads: 1}, JoinTimeout: 20 * time.Second, stageRowTime: 2 * time.Millisecond}
			go w.Serve(ln)
			t.Cleanup(func() { ln.Close() })
			addrs = append(addrs, ln.Addr().String())
		}
		for _, micro := range []int{1, 2, 4, 8} {
			// The best of three runs: other jobs on the machine only
			// ever make a run slower.
			var st PipelineStats
			for range 3 {
				p, err := ConnectPipeline(addrs, PipelineOptions{Model: &coord.Config, KV: kc, Threads: 1, MicroBatches: micro, Timeout: time.Minute})
				if err != nil {
					t.Fatal(err)
				}
				bubbleWorkload(t, p, kc, coord.Config.VocabSize, 8, 16, 4)
				if run := p.Stats(); st.Wall == 0 || run.Wall < st.Wall {
					st = run
				}
				p.Close()
			}
			ideal := float64(stages-1) / float64(micro+stages-1)
			t.Logf("%d stages, %d micro-batches: %d steps in %v, stages busy %v, bubble %.3f (GPipe bound %.3f)",
				stages, micro, st.Steps, st.Wall.Round(time.Millisecond), roundAll(st.Busy), st.Bubble(), ideal)
			if st.Bubble() < ideal-0.02 || st.Bubble() > ideal+0.15 {
				t.Errorf("%d stages, %d micro-batches: bubble %.3f, GPipe's bound %.3f", stages, micro, st.Bubble(), ideal)
			}
		}
	}
}

// TestPipelineBubble measures the bubble fraction — the share of the
// stages' time spent idle — of a synthetic 4-layer llama in 2 and 4
// stages (one thread each, workers over loopback TCP), with each step
// whole and in micro-batches, and checks the logits do not depend on the
// micro-batching. The numbers are logged (they depend on the machine's
// free cores): without micro-batches only one stage computes at a time,
// so the bubble is near 1 − 1/stages; with k micro-batches GPipe's
// schedule bounds it by (stages−1)/(k+stages−1).
func TestPipelineBubble(t *testing.T) {
	if os.Getenv("PAGODA_TIMING") == "" {
		t.Skip("a timing measurement (set PAGODA_TIMING=1 to run it): timings are measured, not asserted, in the default suite")
	}
	path := filepath.Join(t.TempDir(), "pp.gguf")
	shape := synth.Shape{Arch: "llama", Layers: 4, Dim: 512, Heads: 8, KVHeads: 8, HeadDim: 64, FFN: 1536, Vocab: 512, Context: 1024, RopeTheta: 10000, RMSEps: 1e-5}
	if err := synth.Write(path, synth.Options{Shape: shape, Type: quant.Q8_0, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	coord, err := OpenStageShape(path, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer coord.Close()
	c := &coord.Config
	kc := kvcache.Config{NLayer: c.NLayer, NKVHead: c.NKVHead, HeadDim: c.HeadDim, BlockSize: 16, NumBlocks: 256}
	var want [][]float32
	for _, stages := range []int{2, 4} {
		addrs := startWorkers(t, path, stages)
		var whole time.Duration
		for _, micro := range []int{1, 2, 4, 8} {
			// The best of three runs: other jobs on the machine only
			// ever make a run slower.
			var best PipelineStats
			for range 3 {
				st, got := bubbleRun(t, addrs, PipelineOptions{Model: &coord.Config, KV: kc, Threads: 1, MicroBatches: micro, Timeout: time.Minute})
				if want == nil {
					want = got
				}
				for i := range want {
					for j := range want[i] {
						if math.Float32bits(got[i][j]) != math.Float32bits(want[i][j]) {
							t.Fatalf("%d stages, %d micro-batches: step %d logit %d is %g, want %g", stages, micro, i, j, got[i][j], want[i][j])
						}
					}
				}
				if best.Wall == 0 || st.Wall < best.Wall {
					best = st
				}
			}
			busy := sum(best.Busy)
			if micro == 1 {
				whole = busy
			}
			ideal := float64(stages-1) / float64(micro+stages-1)
			t.Logf("%d stages, %d micro-batches: %d steps in %v, stages busy %v (%.2f× whole steps'), bubble %.3f (GPipe bound %.3f)",
				stages, micro, best.Steps, best.Wall.Round(time.Millisecond), roundAll(best.Busy), float64(busy)/float64(whole), best.Bubble(), ideal)
		}
	}
}

// bubbleRun connects a pipeline, runs the workload through it and closes
// it.
func bubbleRun(t *testing.T, addrs []string, o PipelineOptions) (PipelineStats, [][]float32) {
	t.Helper()
	p, err := ConnectPipeline(addrs, o)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	got := bubbleWorkload(t, p, o.KV, o.Model.VocabSize, 8, 32, 16)
	return p.Stats(), got
}

func sum(ds []time.Duration) time.Duration {
	var s time.Duration
	for _, d := range ds {
		s += d
	}
	return s
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}

// TestStageKVGroups: a stage's KV storage takes the manager's layer groups
// renumbered to its own layers, and refuses a stage that holds no layer
// of some group (the step's plan carries spans for every group).
func TestStageKVGroups(t *testing.T) {
	c := &model.Config{NLayer: 4, NKVHead: 1, HeadDim: 8}
	kc := kvcache.Config{NumBlocks: 8, BlockSize: 16, Groups: []kvcache.GroupSpec{
		{Layers: []int{0, 2}, NKVHead: 1, KDim: 8},
		{Layers: []int{1, 3}, NKVHead: 2, KDim: 4, VDim: 4},
	}}
	spec, err := specOf(kc, "pipeline parallel", true)
	if err != nil {
		t.Fatal(err)
	}
	got, err := spec.config(c, model.Stage{Lo: 2, Hi: 4})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Groups) != 2 || fmt.Sprint(got.Groups[0].Layers, got.Groups[1].Layers) != "[0] [1]" ||
		got.Groups[1].NKVHead != 2 || got.Groups[1].VDim != 4 || got.NLayer != 2 {
		t.Errorf("stage [2, 4): %+v", got)
	}
	if _, err := kvcache.NewStorage(got); err != nil {
		t.Errorf("stage [2, 4) storage: %v", err)
	}
	if _, err := spec.config(c, model.Stage{Lo: 3, Hi: 4}); err == nil || !strings.Contains(err.Error(), "KV group 0 has no layer") {
		t.Errorf("a stage without a layer of group 0: %v", err)
	}
	if _, err := specOf(kc, "tensor parallel", false); err == nil || !strings.Contains(err.Error(), "KV cache groups") {
		t.Errorf("groups across tensor-parallel ranks: %v", err)
	}
}

// TestMicroBatches: a step is cut into at most k row ranges of at least
// minRows rows, as equal as they can be, covering it in order.
func TestMicroBatches(t *testing.T) {
	in := &executor.StepInput{}
	for i := range 10 {
		in.Tokens, in.Pos, in.Seq = append(in.Tokens, 1), append(in.Pos, int32(i)), append(in.Seq, 0)
	}
	for _, c := range []struct {
		T, k, minRows int
		want          string
	}{
		{10, 4, 1, "[2 3 2 3]"},
		{10, 4, 4, "[5 5]"},
		{10, 4, 6, "[10]"},
		{3, 4, 1, "[1 1 1]"},
		{3, 4, 4, "[3]"},
		{1, 8, 0, "[1]"},
	} {
		step := &executor.StepInput{Tokens: in.Tokens[:c.T], Pos: in.Pos[:c.T], Seq: in.Seq[:c.T]}
		mbs, err := microBatches(step, c.k, c.minRows)
		if err != nil {
			t.Fatal(err)
		}
		var sizes []int
		next := int32(0)
		for _, mb := range mbs {
			sizes = append(sizes, len(mb.Tokens))
			if mb.Pos[0] != next {
				t.Errorf("%+v: a micro-batch starts at row %d, want %d", c, mb.Pos[0], next)
			}
			next = mb.Pos[len(mb.Pos)-1] + 1
		}
		if fmt.Sprint(sizes) != c.want {
			t.Errorf("%d rows, k %d, at least %d: %v, want %s", c.T, c.k, c.minRows, sizes, c.want)
		}
	}
}

// simulatedPipeline is the set-up of the simulated-device timing tests
// (skipped unless PAGODA_TIMING is set): the model file, the coordinator's
// shape of it (closed when the test ends) and its KV configuration.
func simulatedPipeline(t *testing.T) (string, *model.Model, kvcache.Config) {
	t.Helper()
	if os.Getenv("PAGODA_TIMING") == "" {
		t.Skip("a timing measurement (set PAGODA_TIMING=1 to run it): timings are measured, not asserted, in the default suite")
	}
	path := filepath.Join(testutil.Shared(t, "golden/models"), "g-llama-mqa.F16.gguf")
	coord, err := OpenStageShape(path, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { coord.Close() })
	c := &coord.Config
	return path, coord, kvcache.Config{NLayer: c.NLayer, NKVHead: c.NKVHead, HeadDim: c.HeadDim, BlockSize: 16, NumBlocks: 128}
}
