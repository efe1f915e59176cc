package engine

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"pagoda/kvcache"
	"pagoda/model"
	"pagoda/sample"
	"pagoda/testutil"
	"pagoda/tokenizer"
)

// flatGreedy generates greedily with the model's contiguous reference
// cache: one prefill, then one token at a time.
func flatGreedy(t *testing.T, m *model.Model, prompt []int32, n int) []int32 {
	t.Helper()
	kv := model.NewFlatCache(&m.Config, 1, len(prompt)+n)
	b := &model.Batch{}
	toks := append([]int32(nil), prompt...)
	var out []int32
	pos := 0
	for len(out) < n {
		b.Tokens, b.Pos, b.Seq = toks[pos:], nil, nil
		for i := range b.Tokens {
			b.Pos = append(b.Pos, int32(pos+i))
			b.Seq = append(b.Seq, 0)
		}
		logits, err := m.Forward(b, kv)
		if err != nil {
			t.Fatal(err)
		}
		pos = len(toks)
		next := greedyArgmax(logits)
		out = append(out, next)
		toks = append(toks, next)
	}
	return out
}

func greedyArgmax(l []float32) int32 {
	best := 0
	for i, v := range l {
		if v > l[best] {
			best = i
		}
	}
	return int32(best)
}

func modelConfig(m *model.Model) Config { return ModelConfig(m, "stories260K") }

// openStories opens the shared stories260K model for the test (skipping
// when the shared files are absent) and closes it when the test ends.
func openStories(t *testing.T) *model.Model {
	t.Helper()
	m, err := model.Open(testutil.Shared(t, "models/gguf/stories260K.gguf"), model.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestStories260K runs the real model: requests batched with chunked
// prefill, prefix hits and preemption give exactly the tokens of each
// request run alone, and those match the flat reference cache.
func TestStories260K(t *testing.T) {
	m := openStories(t)
	tok := m.Tokenizer()
	texts := []string{"Once upon a time", "Once upon a time there was a little girl", "The cat", "Lily and Ben went to the park. They saw a big dog", "One day", "Once upon a time, in a big forest, there lived"}
	var reqs []*Request
	for i, s := range texts {
		p := tok.Encode(s, tokenizer.Options{AddSpecial: true})
		reqs = append(reqs, &Request{ID: fmt.Sprint(i), Prompt: p, MaxTokens: 16 + 2*i, IgnoreEOS: true})
	}

	dtypes := []kvcache.DType{kvcache.F32, kvcache.F16}
	if testing.Short() {
		dtypes = dtypes[:1]
	}
	for _, dt := range dtypes {
		alone := modelConfig(m)
		alone.KVDType = dt
		alone.DisablePrefixCache = true
		alone.KVBlocks = 64
		ea, err := New(m, tok, alone)
		if err != nil {
			t.Fatal(err)
		}
		ea.Start()
		var want []result
		for _, r := range reqs {
			want = append(want, run(t, ea, r))
		}
		ea.Stop(context.Background())
		if dt == kvcache.F32 {
			// Parallel sampling over shared prompt blocks (copy-on-write)
			// equals separate seeded runs.
			sp := sample.Params{Temperature: 1, TopK: 40, Seed: 7, HasSeed: true}
			ea2, err := New(m, tok, alone)
			if err != nil {
				t.Fatal(err)
			}
			ea2.Start()
			multi := run(t, ea2, &Request{Prompt: reqs[1].Prompt, MaxTokens: 12, N: 3, Sampling: sp, IgnoreEOS: true})
			for i := 0; i < 3; i++ {
				sp1 := sp
				sp1.Seed += uint64(i)
				one := run(t, ea2, &Request{Prompt: reqs[1].Prompt, MaxTokens: 12, Sampling: sp1, IgnoreEOS: true})
				if fmt.Sprint(one.tokens[0]) != fmt.Sprint(multi.tokens[i]) {
					t.Fatalf("n=3 completion %d %v, alone %v", i, multi.tokens[i], one.tokens[0])
				}
			}
			ea2.Stop(context.Background())
			mustNoLeak(t, ea2)
			for i, r := range reqs {
				ref := flatGreedy(t, m, r.Prompt, r.MaxTokens)
				if fmt.Sprint(ref) != fmt.Sprint(want[i].tokens[0]) {
					t.Fatalf("request %d: paged f32 %v, flat reference %v", i, want[i].tokens[0], ref)
				}
				// The streamed text continues the prompt's decode.
				full, head := tok.Decode(append(append([]int32(nil), r.Prompt...), ref...)), tok.Decode(r.Prompt)
				if head+want[i].text[0] != full {
					t.Errorf("request %d text %q does not continue %q into %q", i, want[i].text[0], head, full)
				}
			}
			t.Logf("%q → %q", texts[1], want[1].text[0])
		}

		cfg := modelConfig(m)
		cfg.KVDType = dt
		cfg.MaxNumBatchedTokens = 12
		cfg.KVBlocks = 9
		cfg.BlockSize = 8
		e, err := New(m, tok, cfg)
		if err != nil {
			t.Fatal(err)
		}
		e.Start()
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
		// Request 1 again, now that its prompt's blocks are cached.
		run(t, e, reqs[1])
		again := run(t, e, reqs[1])
		if fmt.Sprint(again.tokens) != fmt.Sprint(want[1].tokens) || again.usage.CachedTokens != 8 {
			t.Fatalf("%v: prefix-cached rerun %v (cached %d), alone %v", dt, again.tokens, again.usage.CachedTokens, want[1].tokens)
		}
		e.Stop(context.Background())
		for i := range reqs {
			if fmt.Sprint(got[i].tokens) != fmt.Sprint(want[i].tokens) {
				t.Fatalf("%v request %d batched %v, alone %v", dt, i, got[i].tokens, want[i].tokens)
			}
		}
		mustNoLeak(t, e)
		st := e.Stats()
		t.Logf("%v: steps %d, preemptions %d, prefix hits %d/%d", dt, st.Steps, st.Preemptions, st.PrefixHits, st.PrefixQueries)
		if st.Preemptions == 0 || st.PrefixHits == 0 {
			t.Errorf("%v: the workload did not preempt (%d) or hit the prefix cache (%d)", dt, st.Preemptions, st.PrefixHits)
		}
	}
}

// BenchmarkStories260K serves 32 requests of varied lengths with
// continuous batching and with the static baseline.
func BenchmarkStories260K(b *testing.B) {
	path := testutil.Shared(b, "models/gguf/stories260K.gguf")
	m, err := model.Open(path, model.Options{Threads: 2})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	tok := m.Tokenizer()
	for _, static := range []bool{false, true} {
		name := "continuous"
		if static {
			name = "static"
		}
		b.Run(name, func(b *testing.B) {
			cfg := modelConfig(m)
			cfg.Static = static
			cfg.MaxNumSeqs = 16
			cfg.MaxNumBatchedTokens = 256
			e, err := New(m, tok, cfg)
			if err != nil {
				b.Fatal(err)
			}
			e.Start()
			defer e.Stop(context.Background())
			prompt := tok.Encode("Once upon a time", tokenizer.Options{AddSpecial: true})
			var gen int
			for i := 0; i < b.N; i++ {
				var wg sync.WaitGroup
				for j := 0; j < 32; j++ {
					ch, err := e.Submit(context.Background(), &Request{Prompt: prompt, MaxTokens: 16 + 8*(j%8), IgnoreEOS: true})
					if err != nil {
						b.Fatal(err)
					}
					gen += 16 + 8*(j%8)
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range ch {
						}
					}()
				}
				wg.Wait()
			}
			b.ReportMetric(float64(gen)/b.Elapsed().Seconds(), "gen-tok/s")
			b.ReportMetric(float64(e.Stats().Steps)/float64(b.N), "steps/op")
		})
	}
}
