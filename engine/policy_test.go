package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"pagoda/kvcache"
	"pagoda/model"
	"pagoda/tokenizer"
)

// TestStreamingPastContext: under StreamingLLM the real model generates
// three times past the engine's context in a pool smaller than one
// context; several requests batched with shared prompt prefixes and
// preemption give the tokens each gives alone, the first tokens (before
// anything leaves the window) equal the full cache's, and no block leaks.
func TestStreamingPastContext(t *testing.T) {
	m := openStories(t)
	tok := m.Tokenizer()
	const ctxLen = 64
	pol := kvcache.StreamingPolicy{Sinks: 4, Window: 24}
	texts := []string{"Once upon a time", "Once upon a time there was a little girl", "The cat sat"}
	var reqs []*Request
	for i, s := range texts {
		p := tok.Encode(s, tokenizer.Options{AddSpecial: true})
		reqs = append(reqs, &Request{ID: fmt.Sprint(i), Prompt: p, MaxTokens: 3 * ctxLen, IgnoreEOS: true})
	}
	base := modelConfig(m)
	base.ContextLen = ctxLen
	base.KVDType = kvcache.F32
	base.BlockSize = 8

	full := base
	full.KVBlocks = 64
	ef, err := New(m, tok, full)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ef.Submit(context.Background(), reqs[0]); !errors.Is(err, ErrTooLong) {
		t.Fatalf("a full cache took max_tokens past the context: %v", err)
	}

	alone := base
	alone.KVPolicy = pol
	alone.KVBlocks = 7 // 56 tokens: less than the context
	alone.MaxNumBatchedTokens = 16
	alone.DisablePrefixCache = true
	ea := startModelEngine(t, m, alone)
	var want []result
	for _, r := range reqs {
		res := run(t, ea, r)
		if len(res.tokens[0]) != 3*ctxLen || res.finish[0] != FinishLength {
			t.Fatalf("request %s: %d tokens, finish %v", r.ID, len(res.tokens[0]), res.finish[0])
		}
		want = append(want, res)
	}
	mustNoLeak(t, ea)
	// Until the first token leaves the window, attention is the full cache's.
	for i, r := range reqs {
		n := pol.Sinks + pol.Window - len(r.Prompt)
		ref := flatGreedy(t, m, r.Prompt, n)
		if fmt.Sprint(ref) != fmt.Sprint(want[i].tokens[0][:n]) {
			t.Fatalf("request %d: streaming %v, full %v", i, want[i].tokens[0][:n], ref)
		}
	}

	batched := base
	batched.KVPolicy = pol
	batched.KVBlocks = 12
	batched.MaxNumBatchedTokens = 16
	e := startModelEngine(t, m, batched)
	got := make([]result, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		ch, err := e.Submit(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); got[i] = collect(t, ch, 1) }()
	}
	wg.Wait()
	for i := range reqs {
		if fmt.Sprint(got[i].tokens) != fmt.Sprint(want[i].tokens) {
			t.Fatalf("request %d batched %v, alone %v", i, got[i].tokens, want[i].tokens)
		}
	}
	mustNoLeak(t, e)
	t.Logf("preemptions %d, prefix hits %d tokens", e.Stats().Preemptions, e.Stats().PrefixHits)
}

func startModelEngine(t *testing.T, m *model.Model, cfg Config) *Engine {
	t.Helper()
	e, err := New(m, m.Tokenizer(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.Start()
	t.Cleanup(func() { e.Stop(context.Background()) })
	return e
}
