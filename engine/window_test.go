package engine

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"pagoda/tokenizer"
)

// TestSlidingWindowMatchesFullCache: with a windowed model the engine
// releases blocks behind the window, so requests longer than the whole
// pool run, each sequence stays within its block bound at every forward
// pass, and the output equals the engine that keeps every block — under
// chunked prefill, prefix hits, preemption and parallel sampling.
func TestSlidingWindowMatchesFullCache(t *testing.T) {
	const W = 10
	rng := rand.New(rand.NewPCG(31, 7))
	shared := randPrompt(rng, nil, 48)
	var reqs []*Request
	for i := 0; i < 14; i++ {
		p := randPrompt(rng, shared[:8+rng.IntN(40)], 20+rng.IntN(40))
		if i%3 == 2 {
			p = randPrompt(rng, nil, 2+rng.IntN(50))
		}
		r := &Request{ID: fmt.Sprint(i), Prompt: p, MaxTokens: 20 + rng.IntN(130), IgnoreEOS: true}
		if i%5 == 4 {
			r.N = 2
			r.Sampling.Temperature = 1
			r.Sampling.Seed, r.Sampling.HasSeed = uint64(i), true
		}
		reqs = append(reqs, r)
	}
	// The reference keeps every block: same windowed attention, no release.
	ref := fakeConfig()
	ref.DisablePrefixCache = true
	ref.KVBlocks = 200
	re := startEngine(t, &fakeModel{window: W}, ref)
	var want []result
	for _, r := range reqs {
		want = append(want, run(t, re, r))
	}

	cfg := fakeConfig()
	cfg.BlockSize = 4
	cfg.KVBlocks = 14 // 56 tokens: less than most requests need without the window
	cfg.MaxNumBatchedTokens = 16
	cfg.MaxNumSeqs = 6
	cfg.SlidingWindow = W
	fm := &fakeModel{window: W, check: true, budget: 16}
	e, err := New(fm, newFakeTok(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := e.kv.MaxSeqBlocks(1); got != 4 { // ceil(10/4)+1
		t.Fatalf("decode bound %d blocks, want 4", got)
	}
	fm.bound = e.kv.MaxSeqBlocks
	t.Cleanup(func() { e.Stop(context.Background()) })
	got := make([]result, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		ch, err := e.Submit(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); got[i] = collect(t, ch, max(r.N, 1)) }()
	}
	// Started once every request is queued, so the schedule (and with it
	// the preemptions and prefix hits asserted below) does not depend on
	// how fast this goroutine submits.
	e.Start()
	wg.Wait()
	if err := e.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	long := 0
	for i, r := range reqs {
		if fmt.Sprint(got[i].tokens) != fmt.Sprint(want[i].tokens) {
			t.Fatalf("request %d: windowed %v, full cache %v", i, got[i].tokens, want[i].tokens)
		}
		if len(r.Prompt)+r.MaxTokens > cfg.KVBlocks*cfg.BlockSize {
			long++
		}
	}
	if fm.violation != "" {
		t.Fatal(fm.violation)
	}
	mustNoLeak(t, e)
	st := e.Stats()
	t.Logf("%d of %d requests longer than the pool; steps %d, preemptions %d, prefix hits %d/%d",
		long, len(reqs), st.Steps, st.Preemptions, st.PrefixHits, st.PrefixQueries)
	if long == 0 || st.Preemptions == 0 || st.PrefixHits == 0 {
		t.Fatalf("workload too weak: %d long requests, %d preemptions, %d prefix hits", long, st.Preemptions, st.PrefixHits)
	}

	// Without the window the same pool refuses the long requests.
	cfg.SlidingWindow = 0
	nw := startEngine(t, &fakeModel{window: W}, cfg)
	for _, r := range reqs {
		if len(r.Prompt)+r.MaxTokens > cfg.KVBlocks*cfg.BlockSize {
			if _, err := nw.Submit(context.Background(), r); !errors.Is(err, ErrTooLong) {
				t.Fatalf("a %d-token request in a %d-token pool without window: %v", len(r.Prompt)+r.MaxTokens, cfg.KVBlocks*cfg.BlockSize, err)
			}
			break
		}
	}
}

// TestSlidingWindowStories260K gives the real model a window shorter than
// its generations: the paged engine, releasing blocks, produces the tokens
// of the flat reference cache with the same window.
func TestSlidingWindowStories260K(t *testing.T) {
	m := openStories(t)
	m.Config.SlidingWindow = 20
	tok := m.Tokenizer()
	cfg := modelConfig(m)
	if cfg.SlidingWindow != 20 {
		t.Fatalf("ModelConfig dropped the window: %d", cfg.SlidingWindow)
	}
	cfg.BlockSize = 8
	cfg.KVBlocks = 10 // 80 tokens
	cfg.MaxNumBatchedTokens = 12
	e, err := New(m, tok, cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.Start()
	defer e.Stop(context.Background())
	texts := []string{"Once upon a time", "Lily and Ben went to the park. They saw a big dog"}
	var reqs []*Request
	for _, s := range texts {
		reqs = append(reqs, &Request{Prompt: tok.Encode(s, tokenizer.Options{AddSpecial: true}), MaxTokens: 90, IgnoreEOS: true})
	}
	got := runAll(t, e, reqs)
	for i, r := range reqs {
		want := flatGreedy(t, m, r.Prompt, r.MaxTokens)
		if fmt.Sprint(got[i].tokens[0]) != fmt.Sprint(want) {
			t.Fatalf("request %d: paged windowed %v, flat reference %v", i, got[i].tokens[0], want)
		}
	}
	e.Stop(context.Background())
	mustNoLeak(t, e)
}

// TestCacheSalt: prompt blocks are shared only between requests with the
// same salt; an empty salt shares with other unsalted requests.
func TestCacheSalt(t *testing.T) {
	cfg := fakeConfig()
	cfg.KVBlocks = 64
	e := startEngine(t, &fakeModel{check: true}, cfg)
	rng := rand.New(rand.NewPCG(5, 6))
	p := randPrompt(rng, nil, 50)
	var first []int32
	for i, tc := range []struct {
		salt   string
		cached int
	}{{"alice", 0}, {"alice", 48}, {"bob", 0}, {"", 0}, {"", 48}, {"bob", 48}, {"alice", 48}} {
		r := run(t, e, &Request{Prompt: p, MaxTokens: 5, IgnoreEOS: true, CacheSalt: tc.salt})
		if r.usage.CachedTokens != tc.cached {
			t.Fatalf("request %d (salt %q): %d cached tokens, want %d", i, tc.salt, r.usage.CachedTokens, tc.cached)
		}
		if first == nil {
			first = r.tokens[0]
		} else if fmt.Sprint(r.tokens[0]) != fmt.Sprint(first) {
			t.Fatalf("request %d (salt %q) generated %v, first %v", i, tc.salt, r.tokens[0], first)
		}
	}
	e.Stop(context.Background())
	mustNoLeak(t, e)
}
