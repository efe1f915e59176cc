package engine

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"pagoda/grammar"
	"pagoda/sample"
	"pagoda/tokenizer"
)

// TestRequestRoundTrip: a request is plain data. Requests using every
// field that used to be a live object (a KV policy, a constraint) and the
// rest (seeded sampling with bias and penalties, n > 1, stop tokens and
// strings, logprobs, prompt logprobs, a cache salt) survive encoding/json
// unchanged, and the decoded copies, run on a fresh engine, give exactly
// the events the originals give: tokens, text, logprobs, finish reasons
// and usage.
func TestRequestRoundTrip(t *testing.T) {
	m := openStories(t)
	tok := m.Tokenizer()
	prompt := tok.Encode("Once upon a time there was a little girl named Lily", tokenizer.Options{AddSpecial: true})
	reqs := []*Request{
		{ID: "json", Prompt: prompt, N: 2, MaxTokens: 40, TopLogprobs: 3, Logprobs: true,
			Sampling:   sample.Params{Temperature: 0.9, TopK: 40, Seed: 7, HasSeed: true, LogitBias: map[int32]float32{5: -2.5}},
			Constraint: &grammar.Spec{Kind: grammar.KindJSONSchema, Schema: `{"type":"object","properties":{"name":{"type":"string","maxLength":8}},"required":["name"]}`},
			KVPolicy:   "quest:budget=16,dense=1", CacheSalt: "tenant"},
		{ID: "text", Prompt: prompt, N: 2, MaxTokens: 48, PromptLogprobs: true, Logprobs: true, StopStrings: []string{"park", "zzz"},
			StopTokens: []int32{prompt[3]}, Sampling: sample.Params{Temperature: 0.7, TopP: 0.9, MinP: 0.02, FrequencyPenalty: 0.3, Seed: 11, HasSeed: true},
			KVPolicy: "none", SpecTokens: -1},
		{ID: "policy", Prompt: prompt[:6], MaxTokens: 30, IgnoreEOS: true, KVPolicy: "streaming:sinks=4,window=24"},
	}
	var back []*Request
	for _, r := range reqs {
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		var d Request
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if !reflect.DeepEqual(*r, d) {
			t.Fatalf("round trip changed the request:\n%+v\n%+v", *r, d)
		}
		back = append(back, &d)
	}
	cfg := modelConfig(m)
	cfg.BlockSize = 8
	got := runAll(t, startModelEngine(t, m, cfg), reqs)
	again := runAll(t, startModelEngine(t, m, cfg), back)
	for i := range reqs {
		a, b := outputs(got[i]), outputs(again[i])
		if a != b {
			t.Errorf("%s: decoded request gives\n%s\nthe original\n%s", reqs[i].ID, b, a)
		}
		if strings.Count(a, "finish") != max(reqs[i].N, 1) {
			t.Errorf("%s: %s", reqs[i].ID, a)
		}
	}
	t.Logf("%s\n%s", outputs(got[0]), outputs(got[1]))
}

// outputs prints everything a request's events said, per completion,
// whatever the events' grouping.
func outputs(r result) string {
	var sb strings.Builder
	lps := make([][]float32, len(r.tokens))
	tops := make([][][]TokenLogprob, len(r.tokens))
	prompt := 0
	for _, ev := range r.events {
		if ev.Prompt {
			prompt += len(ev.Tokens)
			continue
		}
		lps[ev.Index] = append(lps[ev.Index], ev.Logprob...)
		tops[ev.Index] = append(tops[ev.Index], ev.Top...)
	}
	for i := range r.tokens {
		fmt.Fprintf(&sb, "%d: %v %q finish %s logprobs %v top %v\n", i, r.tokens[i], r.text[i], r.finish[i], lps[i], tops[i])
	}
	fmt.Fprintf(&sb, "prompt logprobs %d; usage %+v", prompt, *r.usage)
	return sb.String()
}
