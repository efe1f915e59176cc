package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

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
	ea.Stop(context.Background())
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
	got := runAll(t, e, reqs)
	for i := range reqs {
		if fmt.Sprint(got[i].tokens) != fmt.Sprint(want[i].tokens) {
			t.Fatalf("request %d batched %v, alone %v", i, got[i].tokens, want[i].tokens)
		}
	}
	e.Stop(context.Background())
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

// TestPoliciesServe runs every policy through the serving engine on the
// real model: batched requests (with a second round hitting the prefix
// cache) give the tokens each gives alone; a small pool forces chunked
// prefill and preemption, and cancellation mid-stream; no block leaks.
// Streaming must match its alone run even under preemption (its K/V are a
// function of the token prefix); the score- and selection-driven policies
// recompute a preempted sequence's decoded tokens as a prompt, which they
// treat differently, so there only completion and leaks are checked.
func TestPoliciesServe(t *testing.T) {
	m := openStories(t)
	tok := m.Tokenizer()
	shared := tok.Encode("Once upon a time there was a little girl named Lily. She loved to play outside in the park with her friends.", tokenizer.Options{AddSpecial: true})
	var reqs []*Request
	for i := 0; i < 5; i++ {
		p := append(append([]int32(nil), shared[:12+5*i]...), tok.Encode(fmt.Sprintf(" One day %d", i), tokenizer.Options{})...)
		reqs = append(reqs, &Request{ID: fmt.Sprint(i), Prompt: p, MaxTokens: 40, IgnoreEOS: true})
	}
	for _, spec := range []string{"streaming:sinks=4,window=24", "quest:budget=24,dense=2", "h2o:heavy=12,recent=12", "snapkv:capacity=24,window=8"} {
		t.Run(spec, func(t *testing.T) {
			pol, err := kvcache.ParsePolicy(spec)
			if err != nil {
				t.Fatal(err)
			}
			base := modelConfig(m)
			base.KVPolicy = pol
			base.BlockSize = 8
			base.KVDType = kvcache.F32

			alone := base
			alone.KVBlocks = 64
			alone.DisablePrefixCache = true
			ea := startModelEngine(t, m, alone)
			var want []result
			for _, r := range reqs {
				want = append(want, run(t, ea, r))
			}
			ea.Stop(context.Background())
			mustNoLeak(t, ea)

			batched := base
			batched.KVBlocks = 80
			e := startModelEngine(t, m, batched)
			for round := 0; round < 2; round++ {
				got := runAll(t, e, reqs)
				for i := range reqs {
					if fmt.Sprint(got[i].tokens) != fmt.Sprint(want[i].tokens) {
						t.Fatalf("round %d request %d batched %v, alone %v", round, i, got[i].tokens, want[i].tokens)
					}
				}
				settled(t, e)
			}
			e.Stop(context.Background())
			mustNoLeak(t, e)
			if _, isH2O := pol.(*kvcache.H2OPolicy); !isH2O && e.Stats().PrefixHits == 0 {
				t.Fatal("the second round hit no cached prefix")
			}

			small := base
			small.KVBlocks = 16
			small.MaxNumBatchedTokens = 32
			es := startModelEngine(t, m, small)
			got := runAll(t, es, reqs)
			for i, r := range reqs {
				if len(got[i].tokens[0]) != r.MaxTokens {
					t.Fatalf("request %d under pressure: %d tokens", i, len(got[i].tokens[0]))
				}
				if _, ok := pol.(kvcache.StreamingPolicy); ok && fmt.Sprint(got[i].tokens) != fmt.Sprint(want[i].tokens) {
					t.Fatalf("request %d under preemption %v, alone %v", i, got[i].tokens, want[i].tokens)
				}
			}
			if es.Stats().Preemptions == 0 {
				t.Fatal("the small pool preempted nothing")
			}
			settled(t, es)

			// Cancel one request after its first token.
			ctx, cancel := context.WithCancel(context.Background())
			ch, err := es.Submit(ctx, &Request{Prompt: reqs[4].Prompt, MaxTokens: 80, IgnoreEOS: true})
			if err != nil {
				t.Fatal(err)
			}
			<-ch
			cancel()
			for range ch {
			}
			es.Stop(context.Background())
			mustNoLeak(t, es)
		})
	}
}

// runAll submits every request at once and collects all completions.
// runLoad runs reqs through e one after another ("solo") or all at once.
func runLoad(t *testing.T, e *Engine, reqs []*Request, load string) []result {
	t.Helper()
	if load != "solo" {
		return runAll(t, e, reqs)
	}
	var got []result
	for _, r := range reqs {
		got = append(got, run(t, e, r))
	}
	return got
}

func runAll(t *testing.T, e *Engine, reqs []*Request) []result {
	t.Helper()
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
	wg.Wait()
	return got
}

// settled waits until the engine has freed every finished request's
// blocks (the final event reaches the client before the step that
// produced it frees them) and checks none is held.
func settled(t *testing.T, e *Engine) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := e.Stats()
		if st.Running == 0 && st.Waiting == 0 && st.KV.Seqs == 0 {
			if st.KV.Used != 0 {
				t.Fatalf("blocks leaked: %+v", st.KV)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("engine not idle: %+v", st)
		}
		time.Sleep(time.Millisecond)
	}
}
