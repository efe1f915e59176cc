package cluster

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"pagoda/engine"
	"pagoda/executor"
	"pagoda/kvcache"
	"pagoda/model"
	"pagoda/testutil"
)

// gridEngine is an engine whose steps run through a pipeline of stages,
// each a tensor-parallel group of tensor ranks (the workers at addrs,
// stage-major), with the coordinator holding rank 0's shard of the first
// layer for its shapes and tokenizer.
func gridEngine(t *testing.T, path string, addrs []string, tensor, micro, blocks int) (*engine.Engine, *Pipeline) {
	t.Helper()
	coord, err := OpenGridShape(path, tensor, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { coord.Close() })
	cfg := engine.ModelConfig(coord, "tpxpp")
	cfg.KVBlocks = blocks
	var p *Pipeline
	cfg.Executor = func(kc kvcache.Config) (executor.Executor, error) {
		var err error
		p, err = ConnectPipeline(addrs, PipelineOptions{Model: &coord.Config, KV: kc, Threads: 1, MicroBatches: micro,
			Timeout: time.Minute, Tensor: tensor})
		return p, err
	}
	eng, err := engine.New(nil, coord.Tokenizer(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	eng.Start()
	t.Cleanup(func() {
		eng.Stop(context.Background())
		if p != nil {
			p.Close()
		}
	})
	return eng, p
}

// tpxppFiles are the models TP=2 × PP=2 is checked on: every one has at
// least two layers and heads that split across two ranks. g-llama-gqa
// has one layer (refused below).
var tpxppFiles = []string{
	"../../models/gguf/stories260K.gguf", // 5 layers: 3 + 2
	"g-llama3-ropefreqs.F32.gguf",        // llama GQA 4:2, separate head
	"g-qwen2.F32.gguf",                   // GQA 8:2, q/k/v biases
	"g-qwen3.F32.gguf",                   // per-head q/k norm, tied head
	"g-llama-mqa.F16.gguf",               // one KV head replicated, 3 layers: 2 + 1
	"g-llama-mqa.Q8_0.gguf",              // quantized: each rank's activations quantize its own slice
	"g-qwen3.Q8_0.gguf",
}

// TestTPxPPEngine: the models as 2 pipeline stages of 2 tensor-parallel
// ranks each (4 workers over TCP), three sequences batched through the
// coordinator's paged KV manager, steps in 2 micro-batches, give the
// single-process engine's greedy tokens and log-probabilities within
// 5e-3 (the partial sums add in another order, as under tensor
// parallelism alone; a token may differ only at a tie).
func TestTPxPPEngine(t *testing.T) {
	dir := testutil.Shared(t, "golden/models")
	for _, file := range tpxppFiles {
		t.Run(filepath.Base(file), func(t *testing.T) {
			path := filepath.Join(dir, file)
			eng, p := gridEngine(t, path, startWorkers(t, path, 4), 2, 2, 64)
			prompts, want, got := againstWhole(t, path, eng)
			for i := range prompts {
				if fmt.Sprint(got[i].tokens) != fmt.Sprint(want[i].tokens) {
					t.Errorf("%q: tokens %v, want %v", prompts[i], got[i].tokens, want[i].tokens)
				}
				compareGreedy(t, prompts[i], want[i], got[i])
			}
			st := p.Stats()
			t.Logf("%d steps in %d micro-batches over %d workers; bubble %.2f", st.Steps, st.MicroBatches, len(st.Busy), st.Bubble())
		})
	}
}

// TestTPxPPLogits: driven step by step (a 7-token prompt, then 32 greedy
// tokens), TP=2 × PP=2 gives the logits of TP=2 alone bit for bit — each
// stage's ranks run the same arithmetic on the same rows as the whole
// group's, the hand-off is raw f32 bits — and so stays within f32
// rounding of one process: |Δ| ≤ 1e-4 × the largest |logit| (measured
// below 1e-6 relative), with the same greedy tokens. Whole steps and 2
// micro-batches alike.
func TestTPxPPLogits(t *testing.T) {
	dir := testutil.Shared(t, "golden/models")
	prompt := []int32{1, 403, 407, 261, 378, 300, 2}
	const n = 32
	for _, file := range tpxppFiles {
		t.Run(filepath.Base(file), func(t *testing.T) {
			path := filepath.Join(dir, file)
			kc, ref, scale, _ := oneProcess(t, path, prompt, n)
			shard, err := OpenGridShape(path, 2, model.Options{Threads: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer shard.Close()
			g, err := Connect(startWorkers(t, path, 2), GroupOptions{Model: &shard.Config, KV: kc, Threads: 1, Timeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			tp := drive(t, g, kc, prompt, n, nil, nil)
			g.Close()
			addrs := startWorkers(t, path, 4)
			for _, micro := range []int{1, 2} {
				p, err := ConnectPipeline(addrs, PipelineOptions{Model: &shard.Config, KV: kc, Threads: 1, Timeout: time.Minute,
					Tensor: 2, MicroBatches: micro})
				if err != nil {
					t.Fatal(err)
				}
				grid := drive(t, p, kc, prompt, n, nil, nil)
				p.Close()
				if d := firstDiff(ref.tokens, grid.tokens); d >= 0 {
					t.Errorf("%d micro-batches: greedy tokens differ from one process at %d: %v, want %v", micro, d, grid.tokens, ref.tokens)
				}
				same := true
				for i := range tp.rows {
					for j := range tp.rows[i] {
						if math.Float32bits(tp.rows[i][j]) != math.Float32bits(grid.rows[i][j]) {
							same = false
						}
					}
				}
				if !same {
					t.Errorf("%d micro-batches: logits are not TP=2's bit for bit", micro)
				}
				maxAbs, kl, top1 := agreement(ref, grid)
				t.Logf("%d micro-batches: %d greedy tokens as one process; logits max |Δ| %.3g (largest |logit| %.3g, relative %.2g), mean KL %.2g, top-1 %.3f; TP=2's bits: %v",
					micro, n, maxAbs, scale, maxAbs/scale, kl, top1, same)
				if maxAbs > 1e-4*scale {
					t.Errorf("%d micro-batches: logits differ from one process by %g (largest |logit| %g)", micro, maxAbs, scale)
				}
			}
		})
	}
}

// TestTPxPPRefusals: what TP × PP cannot split is refused at connection
// time, naming the reason: more stages than layers, query heads that do
// not split across the ranks, a worker count that is not stages × ranks,
// mixtures of experts and MLA (tensor parallelism does not split them);
// the workers serve the next group after.
func TestTPxPPRefusals(t *testing.T) {
	dir := testutil.Shared(t, "golden/models")
	two := filepath.Join(dir, "g-llama3-ropefreqs.F32.gguf") // 2 layers, 4 heads over 2 KV heads
	coord, err := OpenGridShape(two, 2, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer coord.Close()
	c := &coord.Config
	kc := kvcache.Config{NLayer: c.NLayer, NKVHead: c.NKVHead, HeadDim: c.HeadDim, BlockSize: 16, NumBlocks: 16}
	o := PipelineOptions{Model: c, KV: kc, Threads: 1, Timeout: time.Minute, Tensor: 2}
	refuse := func(name string, addrs []string, o PipelineOptions, want ...string) {
		t.Helper()
		p, err := ConnectPipeline(addrs, o)
		if err == nil {
			p.Close()
			t.Errorf("%s: connected", name)
			return
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v (want %q)", name, err, w)
				return
			}
		}
		t.Logf("%s: %v", name, err)
	}
	good := startWorkers(t, two, 6)
	refuse("3 stages of 2 ranks, 2 layers", good, o, "3 stages for a model of 2 layers")
	refuse("5 workers in stages of 2", good[:5], o, "5 workers are not stages of 2 ranks")
	refuse("TP=3 × PP=2, 4 heads", good, PipelineOptions{Model: c, KV: kc, Threads: 1, Timeout: time.Minute, Tensor: 3},
		"stage 0 rank 0", "4 query heads do not split whole across 3 ranks")
	gqa := filepath.Join(dir, "g-llama-gqa.F32.gguf") // one layer
	one, err := OpenGridShape(gqa, 2, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	oc := &one.Config
	refuse("TP=2 × PP=2 of a 1-layer model", startWorkers(t, gqa, 4), PipelineOptions{Model: oc, Threads: 1, Timeout: time.Minute, Tensor: 2,
		KV: kvcache.Config{NLayer: oc.NLayer, NKVHead: oc.NKVHead, HeadDim: oc.HeadDim, BlockSize: 16, NumBlocks: 16}}, "2 stages for a model of 1 layers")
	one.Close()
	for _, moe := range []struct{ file, want string }{
		{"g-qwen2moe.F32.gguf", "mixture-of-experts models (qwen2moe) do not split yet"},
		{"g-deepseek2.F32.gguf", "deepseek2's mixture of experts and multi-head latent attention do not split yet"},
		{"g-deepseek2-lite.F32.gguf", "multi-head latent attention do not split yet"},
	} {
		path := filepath.Join(dir, moe.file)
		// The coordinator cannot open rank 0's shard either: serve
		// refuses there, before any worker starts.
		if m, err := OpenGridShape(path, 2, model.Options{Threads: 1}); err == nil || !strings.Contains(err.Error(), moe.want) {
			if m != nil {
				m.Close()
			}
			t.Errorf("%s: rank 0's shard: %v", moe.file, err)
		}
		whole, err := OpenStageShape(path, model.Options{Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		wc := &whole.Config
		mkc := kvcache.Config{NLayer: wc.NLayer, NKVHead: wc.NKVHead, HeadDim: wc.HeadDim, BlockSize: 16, NumBlocks: 16}
		refuse(moe.file, startWorkers(t, path, 4), PipelineOptions{Model: wc, KV: mkc, Threads: 1, Timeout: time.Minute, Tensor: 2},
			"stage 0 rank 0", moe.want)
		whole.Close()
	}
	// Layer groups of the KV manager split by layers, not by heads.
	grouped := o
	grouped.KV.Groups = []kvcache.GroupSpec{{Layers: []int{0, 1}, NKVHead: 1, KDim: 64, VDim: 64}}
	refuse("KV layer groups", good[:4], grouped, "tensor × pipeline parallel: KV cache groups")
	// The workers serve the next group, after refusals and after one.
	for range 2 {
		p, err := ConnectPipeline(good[:4], o)
		if err != nil {
			t.Fatalf("after refusals: %v", err)
		}
		p.Close()
	}
}

// TestTPxPPFailedStep: a step every rank of stage 0 fails (a token out of
// range) fails on the coordinator within the test's minute, naming the
// worker and the reason, and breaks the pipeline (the next step gets the
// same error at once); the coordinator closing a worker's connection in
// the middle of a pipeline fails the next step naming that worker, with
// no wait on the stages' exchanges; the workers serve the next pipeline.
func TestTPxPPFailedStep(t *testing.T) {
	path := filepath.Join(testutil.Shared(t, "golden/models"), "g-llama3-ropefreqs.F32.gguf")
	coord, err := OpenGridShape(path, 2, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer coord.Close()
	c := &coord.Config
	kc := kvcache.Config{NLayer: c.NLayer, NKVHead: c.NKVHead, HeadDim: c.HeadDim, BlockSize: 16, NumBlocks: 16}
	o := PipelineOptions{Model: c, KV: kc, Threads: 1, Timeout: time.Minute, Tensor: 2, MicroBatches: 2}
	addrs := startWorkers(t, path, 4)
	step := func(p *Pipeline, toks []int32) error {
		t.Helper()
		mgr, err := kvcache.NewManager(kc)
		if err != nil {
			t.Fatal(err)
		}
		in := &executor.StepInput{Tokens: toks, KV: new(model.KVPlan)}
		for i := range toks {
			in.Pos, in.Seq = append(in.Pos, int32(i)), append(in.Seq, 0)
		}
		if !mgr.Allocate(0, nil, 0, len(toks)) {
			t.Fatal("no room")
		}
		if err := mgr.Plan(in.Pos, in.Seq, nil, in.KV); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		start := time.Now()
		go func() { _, err := p.Execute(in); done <- err }()
		select {
		case err := <-done:
			t.Logf("step %v: %v in %v", toks, err, time.Since(start).Round(time.Millisecond))
			return err
		case <-time.After(time.Minute):
			t.Fatal("a step hung the pipeline")
		}
		return nil
	}
	p, err := ConnectPipeline(addrs, o)
	if err != nil {
		t.Fatal(err)
	}
	bad := []int32{1, int32(c.VocabSize), 3, 4}
	if err := step(p, bad); err == nil || !strings.Contains(err.Error(), "pipeline parallel: stage 0 rank 0") || !strings.Contains(err.Error(), "out of range") {
		t.Errorf("a token out of range: %v", err)
	}
	if err := step(p, []int32{1, 2, 3, 4}); err == nil || !strings.Contains(err.Error(), "out of range") {
		t.Errorf("after a failed step: %v", err)
	}
	p.Close()
	p, err = ConnectPipeline(addrs, o)
	if err != nil {
		t.Fatalf("the workers after a broken pipeline: %v", err)
	}
	if err := step(p, []int32{1, 2, 3, 4}); err != nil {
		t.Fatal(err)
	}
	p.conns[1].Close() // stage 0 rank 1's link
	if err := step(p, []int32{1, 2, 3, 4}); err == nil || !strings.Contains(err.Error(), "pipeline parallel: stage 0 rank 1") {
		t.Errorf("a cut link: %v", err)
	}
	p.Close()
	p, err = ConnectPipeline(addrs, o)
	if err != nil {
		t.Fatalf("the workers after a cut link: %v", err)
	}
	p.Close()
}

// TestTPxPPWire: TP=2 × PP=2 on stories260K with f16 and bf16 activations
// on the wire (the stages' all-reduces and the hand-offs): against one
// process under teacher forcing, the logits' max |Δ|, mean KL and top-1
// agreement, bounded loosely (a measurement, like TestWireDTypeModels);
// the workers' bytes against f32's.
func TestTPxPPWire(t *testing.T) {
	path := filepath.Join(testutil.Shared(t, "models/gguf"), "stories260K.gguf")
	prompt := []int32{1, 403, 407, 261, 378, 300, 2}
	const n = 64
	kc, ref, _, _ := oneProcess(t, path, prompt, n)
	shard, err := OpenGridShape(path, 2, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer shard.Close()
	var f32Bytes int64
	for _, d := range []WireDType{WireF32, WireF16, WireBF16} {
		addrs, ws := startWorkersW(t, path, 4, "")
		sent := func() (b int64) {
			for _, w := range ws {
				b += w.Sent()
			}
			return b
		}
		connect := func() *Pipeline {
			p, err := ConnectPipeline(addrs, PipelineOptions{Model: &shard.Config, KV: kc, Threads: 1, Timeout: time.Minute, Tensor: 2, Wire: d})
			if err != nil {
				t.Fatal(err)
			}
			return p
		}
		p := connect()
		free := drive(t, p, kc, prompt, n, nil, sent)
		p.Close()
		p = connect()
		forced := drive(t, p, kc, prompt, n, ref.tokens, nil)
		p.Close()
		maxAbs, kl, top1 := agreement(ref, forced)
		diff := firstDiff(ref.tokens, free.tokens)
		bytes := free.prefillBytes + free.decodeBytes
		t.Logf("%s: %d greedy tokens identical: %v (first difference at %d); teacher-forced logits max |Δ| %.3g, mean KL %.3g, top-1 %.3f; workers sent %d bytes in the prefill, %.0f per decode step",
			d, n, diff < 0, diff, maxAbs, kl, top1, free.prefillBytes, float64(free.decodeBytes)/float64(n-1))
		switch {
		case d == WireF32 && (diff >= 0 || maxAbs > 1e-4):
			t.Errorf("f32: first difference at %d, logits max |Δ| %g", diff, maxAbs)
		case maxAbs > 0.5 || top1 < 0.9:
			t.Errorf("%s: logits max |Δ| %g, top-1 %.3f", d, maxAbs, top1)
		}
		if d == WireF32 {
			f32Bytes = bytes
		} else if r := float64(bytes) / float64(f32Bytes); r < 0.45 || r > 0.95 {
			t.Errorf("%s: %d bytes against f32's %d (ratio %.3f)", d, bytes, f32Bytes, r)
		}
	}
}
