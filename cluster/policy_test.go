package cluster

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"pagoda/engine"
	"pagoda/executor"
	"pagoda/kvcache"
	"pagoda/model"
	"pagoda/sample"
	"pagoda/testutil"
	"pagoda/tokenizer"
)

// TestPoliciesAcrossWorkers: H2O as the engine's policy, and Quest and
// SnapKV chosen per request, run with their state on the workers'
// storage — two tensor-parallel ranks (each rank's policies see its own
// KV heads), two pipeline stages in micro-batches (each stage's see its
// own layers; Quest's dense first layer is the model's), or two stages of
// two ranks each — and the
// coordinator frees what every part evicted. Several sequences batched
// give the single-process engine's greedy tokens, and every block comes
// back at the end.
func TestPoliciesAcrossWorkers(t *testing.T) {
	dir := testutil.Shared(t, "golden/models")
	t.Run("tensor", func(t *testing.T) {
		// One layer: Quest with no dense layer.
		path := filepath.Join(dir, "g-llama-gqa.F32.gguf")
		coord, err := OpenShape(path, 2, model.Options{Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer coord.Close()
		addrs := startWorkers(t, path, 2)
		policiesAgainstWhole(t, path, coord, "quest:budget=8,dense=0", 0, func(kc kvcache.Config) (executor.Executor, error) {
			return Connect(addrs, GroupOptions{Model: &coord.Config, KV: kc, Threads: 1, Timeout: time.Minute})
		})
	})
	t.Run("tensor×pipeline", func(t *testing.T) {
		// Two stages of two ranks: a block dies only where all four
		// workers' heads and layers evicted it.
		path := testutil.Shared(t, "models/gguf/stories260K.gguf")
		coord, err := OpenGridShape(path, 2, model.Options{Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer coord.Close()
		addrs := startWorkers(t, path, 4)
		policiesAgainstWhole(t, path, coord, "quest:budget=8,dense=1", 0, func(kc kvcache.Config) (executor.Executor, error) {
			return ConnectPipeline(addrs, PipelineOptions{Model: &coord.Config, KV: kc, Threads: 1, MicroBatches: 2, Timeout: time.Minute, Tensor: 2})
		})
	})
	t.Run("pipeline", func(t *testing.T) {
		path := testutil.Shared(t, "models/gguf/stories260K.gguf")
		coord, err := OpenStageShape(path, model.Options{Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer coord.Close()
		addrs := startWorkers(t, path, 2)
		// With two steps in flight asked for, the engine runs one at a
		// time while a policy's state lives on the stages (here always:
		// H2O is the engine's).
		for _, inflight := range []int{0, 2} {
			policiesAgainstWhole(t, path, coord, "quest:budget=8,dense=1", inflight, func(kc kvcache.Config) (executor.Executor, error) {
				return ConnectPipeline(addrs, PipelineOptions{Model: &coord.Config, KV: kc, Threads: 1, MicroBatches: 2, Timeout: time.Minute})
			})
		}
	})
}

type closer interface{ Close() error }

func policiesAgainstWhole(t *testing.T, path string, coord *model.Model, quest string, inflight int, connect func(kvcache.Config) (executor.Executor, error)) {
	policy := kvcache.NewH2O(4, 4)
	reqs := []string{"", quest, "snapkv:capacity=6,window=2,kernel=3", ""}
	run := func(eng *engine.Engine, tok tokenizer.Tokenizer, reqs []string) []generated {
		prompts := []string{"Once upon a time there was a", "The little dog ran to the park and", "Lily liked to play with her ball in the", "Tom"}
		out := make([]generated, len(prompts))
		var wg sync.WaitGroup
		for i, p := range prompts {
			ids := tok.Encode(p, tokenizer.Options{AddSpecial: true})
			wg.Go(func() { out[i] = generatePolicy(t, eng, ids, 24, reqs[i]) })
		}
		wg.Wait()
		return out
	}
	start := func(m *model.Model, name string, p kvcache.Policy, ex func(kvcache.Config) (executor.Executor, error)) *engine.Engine {
		cfg := engine.ModelConfig(coord, name)
		if m != nil {
			cfg = engine.ModelConfig(m, name)
		}
		cfg.KVBlocks, cfg.KVPolicy, cfg.BlockSize, cfg.Executor, cfg.InFlight = 256, p, 4, ex, inflight
		eng, err := engine.New(m, coord.Tokenizer(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		eng.Start()
		return eng
	}

	whole, err := model.Open(path, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	ref := start(whole, "whole", policy, nil)
	want := run(ref, whole.Tokenizer(), reqs)
	ref.Stop(context.Background())
	// Each policy changes what full attention gives, or the comparison
	// below would show nothing.
	ref = start(whole, "whole", nil, nil)
	full := run(ref, whole.Tokenizer(), make([]string, len(reqs)))
	ref.Stop(context.Background())
	for i := range want {
		if equalLogprobs(want[i], full[i]) {
			t.Fatalf("request %d (%q) gives what full attention does", i, reqs[i])
		}
	}

	var ex executor.Executor
	eng := start(nil, "workers", policy, func(kc kvcache.Config) (executor.Executor, error) {
		var err error
		ex, err = connect(kc)
		return ex, err
	})
	defer func() {
		eng.Stop(context.Background())
		ex.(closer).Close()
	}()
	got := run(eng, coord.Tokenizer(), reqs)
	for i := range want {
		compareGreedy(t, reqs[i], want[i], got[i])
	}
	deadline := time.Now().Add(10 * time.Second)
	for eng.Stats().KVUsage != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if u := eng.Stats().KVUsage; u != 0 {
		t.Errorf("KV usage %.3f after the requests", u)
	}
}

func generatePolicy(t *testing.T, eng *engine.Engine, prompt []int32, n int, policy string) generated {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ch, err := eng.Submit(ctx, &engine.Request{Prompt: prompt, MaxTokens: n, Sampling: sample.Params{Temperature: 0},
		Logprobs: true, TopLogprobs: 2, KVPolicy: policy})
	if err != nil {
		t.Error(err)
		return generated{}
	}
	var g generated
	for ev := range ch {
		if ev.Err != nil {
			t.Error(ev.Err)
			return g
		}
		if !ev.Prompt {
			g.tokens = append(g.tokens, ev.Tokens...)
			g.top = append(g.top, ev.Top...)
		}
	}
	return g
}

func equalLogprobs(a, b generated) bool {
	if len(a.top) != len(b.top) {
		return false
	}
	for i := range a.top {
		if len(a.top[i]) == 0 || len(b.top[i]) == 0 || a.top[i][0] != b.top[i][0] {
			return false
		}
	}
	return true
}
