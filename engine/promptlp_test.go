package engine

import (
	"context"
	"fmt"
	"math"
	"testing"

	"pagoda/generate"
	"pagoda/kvcache"
	"pagoda/tokenizer"
)

// TestPromptLogprobs checks prompt logprobs computed over a chunked
// prefill against teacher-forced scoring of the same tokens, with the
// prompt already in the prefix cache (which such a request must not use)
// and two completions that each get a copy.
func TestPromptLogprobs(t *testing.T) {
	m := openStories(t)
	tok := m.Tokenizer()
	prompt := tok.Encode("Lily and Ben went to the park. They saw a big dog", tokenizer.Options{AddSpecial: true})
	ref, err := generate.ScoreTokens(m, prompt, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	cfg := modelConfig(m)
	cfg.MaxNumBatchedTokens = 5 // several prefill chunks
	cfg.KVDType = kvcache.F32   // as ScoreTokens keeps it
	cfg.KVBlocks = 64
	e, err := New(m, tok, cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.Start()
	plain := run(t, e, &Request{Prompt: prompt, MaxTokens: 4, IgnoreEOS: true})
	got := run(t, e, &Request{Prompt: prompt, MaxTokens: 4, N: 2, IgnoreEOS: true, PromptLogprobs: true, Logprobs: true, TopLogprobs: 3})
	e.Stop(context.Background())
	mustNoLeak(t, e)

	if got.usage.CachedTokens != 0 {
		t.Errorf("prompt-logprobs request used %d cached tokens", got.usage.CachedTokens)
	}
	for c := range 2 {
		if fmt.Sprint(got.tokens[c]) != fmt.Sprint(plain.tokens[0]) {
			t.Errorf("completion %d %v, without prompt logprobs %v", c, got.tokens[c], plain.tokens[0])
		}
		var toks []int32
		var lps []float32
		var tops [][]TokenLogprob
		for _, ev := range got.events {
			if ev.Index != c || !ev.Prompt {
				continue
			}
			if len(toks) == 0 && ev.Text != "" {
				t.Errorf("prompt event carries text %q", ev.Text)
			}
			toks, lps, tops = append(toks, ev.Tokens...), append(lps, ev.Logprob...), append(tops, ev.Top...)
		}
		if fmt.Sprint(toks) != fmt.Sprint(prompt[1:]) {
			t.Fatalf("completion %d prompt tokens %v, want %v", c, toks, prompt[1:])
		}
		for i, lp := range lps {
			if math.Abs(float64(lp)-ref.Logprobs[i]) > 1e-4 {
				t.Errorf("completion %d prompt token %d: logprob %v, ScoreTokens %v", c, i+1, lp, ref.Logprobs[i])
			}
			if len(tops[i]) != 3 || tops[i][0].Logprob < lp-1e-6 {
				t.Errorf("completion %d prompt token %d: top %v does not bound %v", c, i+1, tops[i], lp)
			}
		}
	}
}
