package engine

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"pagoda/kvcache"
	"pagoda/spec"
	"pagoda/tokenizer"
)

// reqPolicySpecs are the policies the per-request tests mix.
var reqPolicySpecs = []string{"quest:budget=16,dense=1", "h2o:heavy=12,recent=12", "streaming:sinks=4,window=24", "snapkv:capacity=24,window=8"}

func mustPolicy(t *testing.T, s string) kvcache.Policy {
	t.Helper()
	p, err := kvcache.ParsePolicy(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// reqPolicyPrompts are prompts sharing a prefix of one to three blocks of 8.
func reqPolicyPrompts(t *testing.T, tok tokenizer.Tokenizer, n int) [][]int32 {
	shared := tok.Encode("Once upon a time there was a little girl named Lily. She loved to play outside in the park with her friends.", tokenizer.Options{AddSpecial: true})
	var out [][]int32
	for i := 0; i < n; i++ {
		out = append(out, append(append([]int32(nil), shared[:10+6*(i%3)]...), tok.Encode(fmt.Sprintf(" One day %d", i), tokenizer.Options{})...))
	}
	return out
}

// TestRequestPolicies: requests choosing different KV policies (and none)
// batched in one engine, with prefix hits across them and a forked n=2
// request, each give exactly the tokens they give alone on an engine
// whose --kv-policy is theirs; "none" beside them gives the plain
// engine's tokens, also when the engine's default is a policy. A small
// pool preempts and a request is cancelled mid-stream; nothing leaks.
func TestRequestPolicies(t *testing.T) {
	m := openStories(t)
	tok := m.Tokenizer()
	prompts := reqPolicyPrompts(t, tok, 5)
	maxTokens, defaults := 32, []string{"full", "quest:budget=16,dense=1", "h2o:heavy=12,recent=12"}
	if testing.Short() {
		prompts, defaults = prompts[1:3], defaults[1:2] // the longer prompt is past SnapKV's capacity
	}
	base := modelConfig(m)
	base.BlockSize = 8
	base.KVDType = kvcache.F32

	// Alone: one engine per policy, that policy server-wide.
	specs := append([]string{"full"}, reqPolicySpecs...)
	want := map[string][]result{}
	for _, spec := range specs {
		cfg := base
		if spec != "full" {
			cfg.KVPolicy = mustPolicy(t, spec)
		}
		cfg.KVBlocks = 64
		cfg.DisablePrefixCache = true
		e := startModelEngine(t, m, cfg)
		for i, p := range prompts {
			want[spec] = append(want[spec], run(t, e, &Request{ID: fmt.Sprint(i), Prompt: p, MaxTokens: maxTokens, IgnoreEOS: true}))
		}
		e.Stop(context.Background())
		mustNoLeak(t, e)
	}

	// Each policy changes some output, or the comparisons below prove nothing.
	for _, spec := range reqPolicySpecs {
		same := true
		for i := range prompts {
			same = same && fmt.Sprint(want[spec][i].tokens) == fmt.Sprint(want["full"][i].tokens)
		}
		if same {
			t.Fatalf("%s generates what full attention does for every prompt", spec)
		}
	}

	// mixed builds one request per policy for every prompt; the engine's
	// default runs those whose policy it is, by omission.
	mixed := func(def string) ([]*Request, []string) {
		var reqs []*Request
		var which []string
		for i, p := range prompts {
			for _, spec := range specs {
				r := &Request{ID: fmt.Sprintf("%d/%s", i, spec), Prompt: p, MaxTokens: maxTokens, IgnoreEOS: true}
				if spec != def || i%2 == 1 {
					r.KVPolicy = spec // "full" parses to FullPolicy: none
				}
				if i == 0 && spec == "quest:budget=16,dense=1" {
					r.N = 2 // a fork keeps its parent's policy
				}
				reqs, which = append(reqs, r), append(which, spec)
			}
		}
		return reqs, which
	}
	check := func(t *testing.T, what string, reqs []*Request, which []string, got []result) {
		t.Helper()
		for i, r := range reqs {
			w := want[which[i]][i/len(specs)]
			for c := range got[i].tokens {
				if fmt.Sprint(got[i].tokens[c]) != fmt.Sprint(w.tokens[0]) {
					t.Fatalf("%s: request %s completion %d: %v, alone %v", what, r.ID, c, got[i].tokens[c], w.tokens[0])
				}
			}
		}
	}
	for _, def := range defaults {
		t.Run("default="+def, func(t *testing.T) {
			cfg := base
			if def != "full" {
				cfg.KVPolicy = mustPolicy(t, def)
			}
			cfg.KVBlocks = 200
			e := startModelEngine(t, m, cfg)
			for round := 0; round < 2; round++ {
				reqs, which := mixed(def)
				check(t, fmt.Sprintf("round %d", round), reqs, which, runAll(t, e, reqs))
				settled(t, e)
			}
			if e.Stats().PrefixHits == 0 {
				t.Fatal("no prefix hits")
			}
			e.Stop(context.Background())
			mustNoLeak(t, e)
		})
	}

	// Preemption and cancellation with mixed policies.
	cfg := base
	cfg.KVPolicy = mustPolicy(t, "quest:budget=16,dense=1")
	cfg.KVBlocks = 20
	cfg.MaxNumBatchedTokens = 32
	es := startModelEngine(t, m, cfg)
	reqs, which := mixed("quest:budget=16,dense=1")
	got := runAll(t, es, reqs)
	for i, r := range reqs {
		for c := range got[i].tokens {
			if len(got[i].tokens[c]) != r.MaxTokens {
				t.Fatalf("request %s under pressure: %d tokens", r.ID, len(got[i].tokens[c]))
			}
		}
		// Full attention and streaming compute K/V from the tokens alone,
		// so a recomputed sequence continues as it would have.
		if which[i] == "full" || which[i] == "streaming:sinks=4,window=24" {
			if fmt.Sprint(got[i].tokens[0]) != fmt.Sprint(want[which[i]][i/len(specs)].tokens[0]) {
				t.Fatalf("request %s under preemption differs from alone", r.ID)
			}
		}
	}
	if es.Stats().Preemptions == 0 {
		t.Fatal("the small pool preempted nothing")
	}
	settled(t, es)
	for _, spec := range specs {
		ctx, cancel := context.WithCancel(context.Background())
		ch, err := es.Submit(ctx, &Request{Prompt: prompts[len(prompts)-1], MaxTokens: 60, IgnoreEOS: true, KVPolicy: spec})
		if err != nil {
			t.Fatal(err)
		}
		<-ch
		cancel()
		for range ch {
		}
	}
	es.Stop(context.Background())
	mustNoLeak(t, es)
}

// TestRequestPolicyChecks: a policy the cache cannot run is refused at
// Submit (ErrBadKVPolicy); a lossy policy turns speculation off for its
// request only; a request's own policy does not take it past the context
// unless the engine's policy would, and "none" on a streaming engine is
// held to the context.
func TestRequestPolicyChecks(t *testing.T) {
	e := startEngine(t, &fakeModel{}, fakeConfig())
	for _, p := range []string{"streaming:sinks=4,window=8", "window:w=4", "quest:budget=0", "bogus", "quest:budget=16,colour=red"} {
		if _, err := e.Submit(context.Background(), &Request{Prompt: []int32{1, 2}, MaxTokens: 2, KVPolicy: p}); !errors.Is(err, ErrBadKVPolicy) {
			t.Errorf("policy %q: %v, want ErrBadKVPolicy", p, err)
		}
	}
	q, err := e.validate(&Request{Prompt: []int32{1, 2}, MaxTokens: 2, KVPolicy: "quest:budget=16"})
	if err != nil || !q.kvLossy {
		t.Fatalf("quest request: lossy %v, err %v", q != nil && q.kvLossy, err)
	}
	q, err = e.validate(&Request{Prompt: []int32{1, 2}, MaxTokens: 2, KVPolicy: "none"})
	if err != nil || q.kvLossy {
		t.Fatalf("none request: lossy %v, err %v", q != nil && q.kvLossy, err)
	}

	m := openStories(t)
	cfg := modelConfig(m)
	cfg.ContextLen, cfg.BlockSize, cfg.KVBlocks, cfg.MaxNumBatchedTokens = 64, 8, 16, 16
	for _, c := range []struct {
		def, own string
		past     bool // may run 3 contexts
	}{
		{"streaming:sinks=4,window=24", "", true},
		{"streaming:sinks=4,window=24", "streaming:sinks=2,window=16", true},
		{"streaming:sinks=4,window=24", "full", false},
		{"streaming:sinks=4,window=24", "quest:budget=16", false},
		{"full", "streaming:sinks=4,window=24", false},
	} {
		cfg.KVPolicy = nil
		if c.def != "full" {
			cfg.KVPolicy = mustPolicy(t, c.def)
		}
		em, err := New(m, m.Tokenizer(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		r := &Request{Prompt: []int32{1, 2, 3}, MaxTokens: 3 * cfg.ContextLen}
		if c.own != "" {
			r.KVPolicy = c.own
		}
		_, err = em.validate(r)
		if (err == nil) != c.past || (err != nil && !errors.Is(err, ErrTooLong)) {
			t.Errorf("default %s, request %q: 3 contexts gives %v, want allowed %v", c.def, c.own, err, c.past)
		}
	}
}

// TestRequestPolicySpeculation: speculation is decided per request: a
// request with "none" on an engine whose default is Quest speculates and
// gives the plain engine's tokens beside a Quest request, which does not
// speculate and gives the Quest engine's.
func TestRequestPolicySpeculation(t *testing.T) {
	m := openStories(t)
	prompts := reqPolicyPrompts(t, m.Tokenizer(), 3)
	base := modelConfig(m)
	base.BlockSize, base.KVDType, base.KVBlocks = 8, kvcache.F32, 64
	quest := "quest:budget=16,dense=1"
	alone := func(pol string) result {
		cfg := base
		if pol != "" {
			cfg.KVPolicy = mustPolicy(t, pol)
		}
		e := startModelEngine(t, m, cfg)
		defer e.Stop(context.Background())
		return run(t, e, &Request{Prompt: prompts[2], MaxTokens: 40, IgnoreEOS: true})
	}
	plain, questWant := alone(""), alone(quest)
	if fmt.Sprint(plain.tokens) == fmt.Sprint(questWant.tokens) {
		t.Fatal("quest changes nothing here: the test proves nothing")
	}

	ng, err := spec.NewNGram(1, 3)
	if err != nil {
		t.Fatal(err)
	}
	cfg := base
	cfg.KVPolicy = mustPolicy(t, quest)
	cfg.Spec = SpecConfig{Proposer: ng, Tokens: 3, Fixed: true}
	e := startModelEngine(t, m, cfg)
	none := &Request{Prompt: prompts[2], MaxTokens: 40, IgnoreEOS: true, KVPolicy: "none"}
	def := &Request{Prompt: prompts[2], MaxTokens: 40, IgnoreEOS: true}
	for _, c := range []struct {
		r    *Request
		spec bool
	}{{none, true}, {def, false}} {
		q, err := e.validate(c.r)
		if err != nil {
			t.Fatal(err)
		}
		if got := e.specTokens(q) > 0; got != c.spec {
			t.Fatalf("policy %v: speculates %v, want %v", c.r.KVPolicy, got, c.spec)
		}
	}
	got := runAll(t, e, []*Request{none, def})
	if fmt.Sprint(got[0].tokens) != fmt.Sprint(plain.tokens) || fmt.Sprint(got[1].tokens) != fmt.Sprint(questWant.tokens) {
		t.Fatalf("none %v (plain %v), quest %v (alone %v)", got[0].tokens, plain.tokens, got[1].tokens, questWant.tokens)
	}
	if e.Stats().SpecDrafts == 0 {
		t.Fatal("the none request drafted nothing")
	}
	e.Stop(context.Background())
	mustNoLeak(t, e)
}
