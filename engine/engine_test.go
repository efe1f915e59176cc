package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"pagoda/kvcache"
	"pagoda/model"
	"pagoda/sample"
	"pagoda/tokenizer"
)

const fakeVocab = 32

// fakeTok: ids 0..2 are control (UNK, BOS, EOS); id i ≥ 3 is the letter
// 'a'+(i-3), except 30 and 31, the two bytes of "é", to exercise UTF-8
// hold-back.
type fakeTok struct{ v *tokenizer.Vocab }

func newFakeTok() *fakeTok {
	v := &tokenizer.Vocab{Model: "fake", BOS: 1, EOS: 2, UNK: 0, PAD: -1, EOT: -1}
	for i := 0; i < fakeVocab; i++ {
		v.Tokens = append(v.Tokens, fmt.Sprint(i))
		typ := int32(tokenizer.TypeNormal)
		if i < 3 {
			typ = tokenizer.TypeControl
		}
		v.Types = append(v.Types, typ)
	}
	return &fakeTok{v}
}

func (t *fakeTok) Encode(text string, _ tokenizer.Options) []int32 {
	var out []int32
	for _, c := range []byte(text) {
		out = append(out, int32(c-'a')+3)
	}
	return out
}
func (t *fakeTok) TokenBytes(id int32) []byte {
	switch {
	case id < 3:
		return nil
	case id == 30:
		return []byte{0xc3}
	case id == 31:
		return []byte{0xa9}
	}
	return []byte{byte('a' + id - 3)}
}
func (t *fakeTok) Decode(ids []int32) string {
	var b []byte
	for _, id := range ids {
		b = append(b, t.TokenBytes(id)...)
	}
	return string(b)
}
func (t *fakeTok) Vocab() *tokenizer.Vocab { return t.v }

// fakeModel is a deterministic two-layer "transformer" whose next token
// depends on every cached K/V of the sequence, so any cache mistake
// (wrong block, lost copy-on-write, bad prefix hit) changes the output.
type fakeModel struct {
	budget int
	check  bool
	mu     sync.Mutex
	steps  []int // tokens per forward
	seqs   []map[int32]bool
	fail   error

	window int // attention window of the fake layers; 0 = full
	// bound, when set, is checked on every forward pass: the blocks a
	// sequence holds for a chunk of n tokens; violations are recorded.
	bound     func(n int) int
	violation string
}

var fakeAttn = model.AttnParams{NHead: 4, NKVHead: 2, HeadDim: 4, Scale: 0.5}

func fakeConfig() Config {
	return Config{NLayer: 2, NKVHead: 2, HeadDim: 4, VocabSize: fakeVocab, ContextLen: 256, KVDType: kvcache.F32}
}

func (m *fakeModel) Forward(b *model.Batch, kv model.KVCache) ([]float32, error) {
	m.mu.Lock()
	m.steps = append(m.steps, len(b.Tokens))
	seen := map[int32]bool{}
	for _, id := range b.Seq {
		seen[id] = true
	}
	m.seqs = append(m.seqs, seen)
	fail := m.fail
	m.mu.Unlock()
	if fail != nil {
		return nil, fail
	}
	if m.budget > 0 && len(b.Tokens) > m.budget {
		return nil, fmt.Errorf("fake: batch of %d tokens exceeds the budget %d", len(b.Tokens), m.budget)
	}
	if c, ok := kv.(*kvcache.Cache); ok && m.check {
		if err := c.Check(); err != nil {
			return nil, err
		}
	}
	if c, ok := kv.(*kvcache.Cache); ok && m.bound != nil {
		chunk := map[int32]int{}
		for _, id := range b.Seq {
			chunk[id]++
		}
		for id, n := range chunk {
			held := 0
			for _, blk := range c.Table(id) {
				if blk >= 0 {
					held++
				}
			}
			if held > m.bound(n) {
				m.mu.Lock()
				m.violation = fmt.Sprintf("sequence %d holds %d blocks for a chunk of %d tokens, bound %d", id, held, n, m.bound(n))
				m.mu.Unlock()
			}
		}
	}
	if err := kv.Begin(b); err != nil {
		return nil, err
	}
	ap := fakeAttn
	ap.Window = m.window
	const d = 16 // NHead·HeadDim
	var out []float32
	for r, tok := range b.Tokens {
		pos := b.RopePos(r)
		x := make([]float32, d)
		for i := range x {
			x[i] = float32(math.Sin(float64(int(tok)*(i+1)) * 0.7))
		}
		for l := 0; l < 2; l++ {
			k, v, q := make([]float32, 8), make([]float32, 8), make([]float32, d)
			for i := range k {
				k[i] = float32(math.Cos(float64(x[i]*float32(l+2)) + float64(i)))
				v[i] = x[(i+l)%d] + float32(math.Sin(float64(pos)*0.1+float64(i)))
			}
			for i := range q {
				q[i] = x[(i+3)%d] * 2
			}
			kv.Store(l, r, k, v)
			o := make([]float32, d)
			kv.Attend(l, r, r+1, q, o, ap)
			for i := range x {
				x[i] += o[i]
			}
		}
		if len(b.Hidden) == len(b.Tokens)*d {
			copy(b.Hidden[r*d:(r+1)*d], x)
		}
		last := r == len(b.Tokens)-1
		if b.Logits != nil {
			last = b.Logits[r]
		}
		if !last {
			continue
		}
		for j := 0; j < fakeVocab; j++ {
			var s float64
			for i, xv := range x {
				s += float64(xv) * math.Sin(float64(j*7+i*3)+0.5)
			}
			out = append(out, float32(s*3))
		}
	}
	return out, nil
}

// HiddenSize makes the fake give hidden states (its residual stream).
func (m *fakeModel) HiddenSize() int { return 16 }

func startEngine(t *testing.T, fm *fakeModel, cfg Config) *Engine {
	t.Helper()
	e, err := New(fm, newFakeTok(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.Start()
	t.Cleanup(func() { e.Stop(context.Background()) })
	return e
}

type result struct {
	tokens [][]int32
	text   []string
	finish []FinishReason
	usage  *Usage
	events []Event
}

func collect(t *testing.T, ch <-chan Event, n int) result {
	t.Helper()
	res := result{tokens: make([][]int32, n), text: make([]string, n), finish: make([]FinishReason, n)}
	// A stall, not a slow run, is the failure: race builds on a loaded
	// machine take minutes over what takes a second alone.
	const stall = 2 * time.Minute
	timer := time.NewTimer(stall)
	defer timer.Stop()
	for {
		select {
		case ev, ok := <-ch:
			timer.Reset(stall)
			if !ok {
				if res.usage == nil {
					t.Fatal("stream closed without a Usage event")
				}
				return res
			}
			if ev.Err != nil && ev.Finish != FinishError {
				t.Fatalf("error without FinishError: %v", ev.Err)
			}
			res.events = append(res.events, ev)
			if ev.Prompt {
				continue
			}
			res.tokens[ev.Index] = append(res.tokens[ev.Index], ev.Tokens...)
			res.text[ev.Index] += ev.Text
			if ev.Finish != FinishNone {
				if res.finish[ev.Index] != FinishNone {
					t.Fatalf("completion %d finished twice", ev.Index)
				}
				res.finish[ev.Index] = ev.Finish
			}
			if ev.Usage != nil {
				res.usage = ev.Usage
			}
		case <-timer.C:
			t.Fatalf("no event for %v", stall)
		}
	}
}

func run(t *testing.T, e *Engine, r *Request) result {
	t.Helper()
	ch, err := e.Submit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	n := max(r.N, 1)
	return collect(t, ch, n)
}

func randPrompt(rng *rand.Rand, prefix []int32, n int) []int32 {
	p := append([]int32(nil), prefix...)
	for len(p) < n {
		p = append(p, 3+rng.Int32N(27))
	}
	return p
}

// reference runs each request alone in a roomy engine without prefix
// caching: one prefill, then decodes.
func reference(t *testing.T, reqs []*Request) []result {
	t.Helper()
	cfg := fakeConfig()
	cfg.DisablePrefixCache = true
	cfg.KVBlocks = 64
	e := startEngine(t, &fakeModel{}, cfg)
	var out []result
	for _, r := range reqs {
		out = append(out, run(t, e, r))
	}
	return out
}

func mustNoLeak(t *testing.T, e *Engine) {
	t.Helper()
	if err := e.kv.Check(); err != nil {
		t.Fatal(err)
	}
	u := e.kv.Usage()
	if u.Used != 0 || u.Seqs != 0 || u.Free != u.Blocks {
		t.Fatalf("blocks leaked: %+v", u)
	}
	if s, p := e.kv.Policies.Bound(); s != 0 || p != 0 {
		t.Fatalf("%d sequences still bound to %d KV policies", s, p)
	}
}

// TestContinuousBatchingMatchesReference is batch invariance, chunked
// prefill, prefix caching and preemption by recompute at once: many
// concurrent requests with shared prefixes, a small token budget and a KV
// pool too small for all of them must produce, request by request, the
// tokens of the request run alone.
func TestContinuousBatchingMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	shared := randPrompt(rng, nil, 40)
	var reqs []*Request
	for i := 0; i < 24; i++ {
		var p []int32
		if i%2 == 0 {
			p = randPrompt(rng, shared[:16+rng.IntN(24)], 20+rng.IntN(40))
		} else {
			p = randPrompt(rng, nil, 2+rng.IntN(60))
		}
		reqs = append(reqs, &Request{ID: fmt.Sprint(i), Prompt: p, MaxTokens: 5 + rng.IntN(30), IgnoreEOS: i%3 != 0})
	}
	want := reference(t, reqs)

	for _, tc := range []struct {
		name string
		cfg  func(*Config)
	}{
		{"chunked+prefix+preempt", func(c *Config) { c.MaxNumBatchedTokens = 24; c.KVBlocks = 24; c.MaxNumSeqs = 12 }},
		{"big-budget", func(c *Config) { c.MaxNumBatchedTokens = 4096; c.KVBlocks = 200 }},
		{"static", func(c *Config) { c.Static = true; c.MaxNumSeqs = 5; c.KVBlocks = 60 }},
		{"f16-self", func(c *Config) { c.KVDType = kvcache.F16; c.MaxNumBatchedTokens = 16; c.KVBlocks = 30 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := fakeConfig()
			tc.cfg(&cfg)
			fm := &fakeModel{budget: cfg.MaxNumBatchedTokens, check: true}
			e := startEngine(t, fm, cfg)
			exp := want
			if cfg.KVDType == kvcache.F16 {
				// f16 storage rounds K/V: compare against itself run alone.
				alone := startEngine(t, &fakeModel{}, Config{NLayer: 2, NKVHead: 2, HeadDim: 4, VocabSize: fakeVocab, ContextLen: 256, KVBlocks: 64, DisablePrefixCache: true})
				exp = nil
				for _, r := range reqs {
					exp = append(exp, run(t, alone, r))
				}
			}
			got := make([]result, len(reqs))
			var wg sync.WaitGroup
			for i, r := range reqs {
				ch, err := e.Submit(context.Background(), r)
				if err != nil {
					t.Fatal(err)
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					got[i] = collect(t, ch, 1)
				}()
			}
			wg.Wait()
			for i := range reqs {
				if fmt.Sprint(got[i].tokens) != fmt.Sprint(exp[i].tokens) || got[i].finish[0] != exp[i].finish[0] {
					t.Fatalf("request %d: got %v %v, alone %v %v", i, got[i].tokens, got[i].finish, exp[i].tokens, exp[i].finish)
				}
				if got[i].text[0] != exp[i].text[0] {
					t.Fatalf("request %d text %q, alone %q", i, got[i].text[0], exp[i].text[0])
				}
				if got[i].usage.CompletionTokens != len(got[i].tokens[0]) || got[i].usage.PromptTokens != len(reqs[i].Prompt) {
					t.Fatalf("request %d usage %+v", i, *got[i].usage)
				}
			}
			if err := e.Stop(context.Background()); err != nil {
				t.Fatal(err)
			}
			mustNoLeak(t, e)
			st := e.Stats()
			t.Logf("%s: steps %d, preemptions %d, prefix hits %d/%d, batched %d", tc.name, st.Steps, st.Preemptions, st.PrefixHits, st.PrefixQueries, st.BatchedTokens)
			if tc.name == "chunked+prefix+preempt" {
				if st.Preemptions == 0 {
					t.Error("the small pool never preempted")
				}
				if st.PrefixHits == 0 {
					t.Error("shared prefixes never hit the cache")
				}
				for _, n := range fm.steps {
					if n > cfg.MaxNumBatchedTokens {
						t.Fatalf("step of %d tokens over budget %d", n, cfg.MaxNumBatchedTokens)
					}
				}
			}
		})
	}
}

func TestChunkedPrefillDoesNotStallDecodes(t *testing.T) {
	cfg := fakeConfig()
	cfg.MaxNumBatchedTokens = 8
	cfg.KVBlocks = 64
	fm := &fakeModel{budget: 8, check: true}
	e := startEngine(t, fm, cfg)
	rng := rand.New(rand.NewPCG(5, 6))
	short, err := e.Submit(context.Background(), &Request{Prompt: randPrompt(rng, nil, 3), MaxTokens: 200, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	// Submit the long prompt at once: waiting for the short request's first
	// token let a loaded machine finish all 200 decodes before the long
	// prompt arrived.
	long := &Request{Prompt: randPrompt(rng, nil, 100), MaxTokens: 2, IgnoreEOS: true}
	lch, err := e.Submit(context.Background(), long)
	if err != nil {
		t.Fatal(err)
	}
	first := <-short
	// While the 100-token prompt (sequence 1) is prefilled in chunks
	// (≥ 13 steps), the short request (sequence 0) must be in every step.
	tokens := len(first.Tokens)
	for ev := range short {
		tokens += len(ev.Tokens)
	}
	lr := collect(t, lch, 1)
	if tokens != 200 {
		t.Fatalf("short request got %d tokens, want 200", tokens)
	}
	fm.mu.Lock()
	lastShort, longSteps := 0, 0
	for i, s := range fm.seqs {
		if s[0] {
			lastShort = i
		}
	}
	for i, s := range fm.seqs[:lastShort] {
		if s[1] {
			longSteps++
			if !s[0] {
				t.Errorf("step %d ran the long prefill without the decode", i)
			}
		}
	}
	fm.mu.Unlock()
	if longSteps < 10 {
		t.Fatalf("only %d prefill steps overlapped the decode", longSteps)
	}
	want := reference(t, []*Request{long})[0]
	if fmt.Sprint(lr.tokens) != fmt.Sprint(want.tokens) {
		t.Fatalf("chunked prefill gave %v, one-shot %v", lr.tokens, want.tokens)
	}
}

func TestPrefixCacheReuse(t *testing.T) {
	cfg := fakeConfig()
	cfg.KVBlocks = 64
	e := startEngine(t, &fakeModel{check: true}, cfg)
	rng := rand.New(rand.NewPCG(8, 9))
	p := randPrompt(rng, nil, 50)
	a := run(t, e, &Request{Prompt: p, MaxTokens: 10, IgnoreEOS: true})
	b := run(t, e, &Request{Prompt: p, MaxTokens: 10, IgnoreEOS: true})
	if a.usage.CachedTokens != 0 || b.usage.CachedTokens != 48 {
		t.Fatalf("cached tokens %d then %d, want 0 then 48", a.usage.CachedTokens, b.usage.CachedTokens)
	}
	if fmt.Sprint(a.tokens) != fmt.Sprint(b.tokens) {
		t.Fatalf("prefix hit changed the output: %v vs %v", a.tokens, b.tokens)
	}
	// The second prompt continues the first's output: its blocks were cached too.
	c := run(t, e, &Request{Prompt: append(append([]int32(nil), p...), a.tokens[0]...), MaxTokens: 3, IgnoreEOS: true})
	if c.usage.CachedTokens != 48 {
		t.Fatalf("continuation cached %d tokens, want 48", c.usage.CachedTokens)
	}
	st := e.Stats()
	if st.PrefixQueries != 50+50+60 || st.PrefixHits != 96 {
		t.Fatalf("prefix counters %d/%d", st.PrefixHits, st.PrefixQueries)
	}
}

func TestParallelSamplingCopyOnWrite(t *testing.T) {
	cfg := fakeConfig()
	cfg.KVBlocks = 64
	cfg.DisablePrefixCache = true // so nothing but forking shares blocks
	e := startEngine(t, &fakeModel{check: true}, cfg)
	rng := rand.New(rand.NewPCG(10, 11))
	p := randPrompt(rng, nil, 21) // the prompt ends inside a block: the first decode copies it
	sp := sample.Params{Temperature: 1.5, Seed: 42, HasSeed: true}
	multi := run(t, e, &Request{Prompt: p, MaxTokens: 12, N: 4, Sampling: sp, IgnoreEOS: true})
	distinct := map[string]bool{}
	for i := 0; i < 4; i++ {
		sp1 := sp
		sp1.Seed += uint64(i)
		one := run(t, e, &Request{Prompt: p, MaxTokens: 12, Sampling: sp1, IgnoreEOS: true})
		if fmt.Sprint(multi.tokens[i]) != fmt.Sprint(one.tokens[0]) {
			t.Fatalf("completion %d: %v, alone with seed+%d: %v", i, multi.tokens[i], i, one.tokens[0])
		}
		if multi.finish[i] != FinishLength {
			t.Fatalf("completion %d finish %q", i, multi.finish[i])
		}
		distinct[fmt.Sprint(one.tokens[0])] = true
	}
	if len(distinct) < 2 {
		t.Fatal("all seeded completions are equal; the test does not see copy-on-write mistakes")
	}
	if multi.usage.CompletionTokens != 48 || multi.usage.PromptTokens != 21 {
		t.Fatalf("usage %+v", *multi.usage)
	}
	e.Stop(context.Background())
	mustNoLeak(t, e)
}

func TestStopConditions(t *testing.T) {
	cfg := fakeConfig()
	cfg.KVBlocks = 64
	e := startEngine(t, &fakeModel{}, cfg)
	rng := rand.New(rand.NewPCG(12, 13))
	p := randPrompt(rng, nil, 10)
	full := run(t, e, &Request{Prompt: p, MaxTokens: 30, IgnoreEOS: true})
	text := full.text[0]
	if len(text) < 12 {
		t.Fatalf("reference text too short: %q", text)
	}
	// A stop string in the middle: output ends right before it.
	stop := text[6:9]
	idx := strings.Index(text, stop)
	r := run(t, e, &Request{Prompt: p, MaxTokens: 30, IgnoreEOS: true, StopStrings: []string{"zzzzzz", stop}})
	if r.text[0] != text[:idx] || r.finish[0] != FinishStop {
		t.Fatalf("stop %q: got %q (%s), want %q", stop, r.text[0], r.finish[0], text[:idx])
	}
	// A stop token.
	tok := full.tokens[0][4]
	r = run(t, e, &Request{Prompt: p, MaxTokens: 30, IgnoreEOS: true, StopTokens: []int32{tok}})
	n := 0
	for full.tokens[0][n] != tok {
		n++
	}
	if len(r.tokens[0]) != n+1 || r.finish[0] != FinishStop {
		t.Fatalf("stop token: %d tokens (%s), want %d", len(r.tokens[0]), r.finish[0], n+1)
	}
	// max_tokens.
	r = run(t, e, &Request{Prompt: p, MaxTokens: 7, IgnoreEOS: true})
	if len(r.tokens[0]) != 7 || r.finish[0] != FinishLength || r.text[0] != tokText(full.tokens[0][:7]) {
		t.Fatalf("max tokens: %v %s %q", r.tokens[0], r.finish[0], r.text[0])
	}
	// The text of all deltas is the UTF-8-clean decode of the tokens.
	if text != tokText(full.tokens[0]) {
		t.Fatalf("streamed text %q, decode %q", text, tokText(full.tokens[0]))
	}
	// Context full: max_tokens 0 runs to the context length.
	r = run(t, e, &Request{Prompt: p, IgnoreEOS: true})
	if len(r.tokens[0]) != cfg.ContextLen-len(p) || r.finish[0] != FinishLength {
		t.Fatalf("context full after %d tokens (%s)", len(r.tokens[0]), r.finish[0])
	}
}

func tokText(ids []int32) string { return newFakeTok().Decode(ids) }

func TestTextOutHoldBack(t *testing.T) {
	tk := newFakeTok()
	o := tokenizer.NewTextStream(tk, []int32{1}, []string{"cd", "éx"})
	var got string
	feed := func(id int32) (string, bool) { s, stop := o.Add(id); got += s; return s, stop }
	if s, _ := feed(3 + 0); s != "a" { // "a"
		t.Fatalf("%q", s)
	}
	if s, _ := feed(3 + 2); s != "" { // "c" could start "cd"
		t.Fatalf("held-back text leaked: %q", s)
	}
	if s, _ := feed(30); s != "" { // first byte of é: incomplete, "c" still held
		t.Fatalf("%q", s)
	}
	if s, _ := feed(31); s != "c" { // "é" could start "éx"; "c" cannot start "cd" any more
		t.Fatalf("%q", s)
	}
	if s, stop := feed(3 + 3); s != "éd" || stop {
		t.Fatalf("%q %v", s, stop)
	}
	if _, stop := feed(3 + 2); stop {
		t.Fatal("early stop")
	}
	s, stop := feed(3 + 3)
	if !stop || got != "acéd" {
		t.Fatalf("stop %v, text %q", stop, got+s)
	}
}

func TestLogprobs(t *testing.T) {
	cfg := fakeConfig()
	cfg.KVBlocks = 64
	e := startEngine(t, &fakeModel{}, cfg)
	r := run(t, e, &Request{Prompt: []int32{5, 6, 7}, MaxTokens: 5, IgnoreEOS: true, Logprobs: true, TopLogprobs: 3})
	n := 0
	for _, ev := range r.events {
		if len(ev.Logprob) != len(ev.Tokens) || len(ev.Top) != len(ev.Tokens) {
			t.Fatalf("event %+v", ev)
		}
		for k, tok := range ev.Tokens {
			n++
			top := ev.Top[k]
			if len(top) != 3 || top[0].ID != tok || top[0].Logprob != ev.Logprob[k] || top[0].Logprob < top[1].Logprob || top[1].Logprob < top[2].Logprob {
				t.Fatalf("greedy token %d lp %v, top %v", tok, ev.Logprob[k], top)
			}
			if ev.Logprob[k] > 0 || ev.Logprob[k] < -10 {
				t.Fatalf("logprob %v", ev.Logprob[k])
			}
		}
	}
	if n != 5 {
		t.Fatalf("%d tokens with logprobs, want 5", n)
	}
}

func TestSubmitErrors(t *testing.T) {
	cfg := fakeConfig()
	cfg.KVBlocks = 4 // 64 tokens
	cfg.MaxWaiting = 2
	e, err := New(&fakeModel{}, newFakeTok(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	_, err = e.Submit(ctx, &Request{Prompt: make([]int32, 200), MaxTokens: 100})
	var tl *TooLongError
	if !errors.Is(err, ErrTooLong) || !errors.As(err, &tl) || tl.Limit != 256 || tl.Prompt != 200 {
		t.Fatalf("context overflow: %v", err)
	}
	if _, err = e.Submit(ctx, &Request{Prompt: make([]int32, 60), MaxTokens: 10}); !errors.Is(err, ErrTooLong) || !strings.Contains(err.Error(), "KV cache") {
		t.Fatalf("KV overflow: %v", err)
	}
	for _, bad := range []*Request{
		{},
		{Prompt: []int32{99}},
		{Prompt: []int32{5}, N: -1},
		{Prompt: []int32{5}, MaxTokens: -3},
		{Prompt: []int32{5}, TopLogprobs: 50},
		{Prompt: []int32{5}, Sampling: sample.Params{Temperature: -1}},
	} {
		if _, err := e.Submit(ctx, bad); err == nil {
			t.Fatalf("request %+v accepted", bad)
		}
	}
	// Not started: two queue up, the third is refused.
	var chans []<-chan Event
	for i := 0; i < 2; i++ {
		ch, err := e.Submit(ctx, &Request{Prompt: []int32{5}, MaxTokens: 2})
		if err != nil {
			t.Fatal(err)
		}
		chans = append(chans, ch)
	}
	if _, err := e.Submit(ctx, &Request{Prompt: []int32{5}, MaxTokens: 2}); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("third submit: %v", err)
	}
	e.Start()
	for _, ch := range chans {
		collect(t, ch, 1)
	}
	if err := e.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Submit(ctx, &Request{Prompt: []int32{5}}); !errors.Is(err, ErrStopped) {
		t.Fatalf("submit after stop: %v", err)
	}
}

func TestCancelFreesBlocks(t *testing.T) {
	base := runtime.NumGoroutine()
	cfg := fakeConfig()
	cfg.KVBlocks = 64
	cfg.DisablePrefixCache = true
	// Every pass after the first waits for the gate, so the request is
	// still running when its blocks are counted, however slow the machine.
	gm := &gatedModel{fakeModel: fakeModel{check: true}, gate: make(chan struct{})}
	var open sync.Once
	release := func() { open.Do(func() { close(gm.gate) }) }
	e, err := New(gm, newFakeTok(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.Start()
	t.Cleanup(func() { release(); e.Stop(context.Background()) })
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := e.Submit(ctx, &Request{Prompt: []int32{4, 5, 6}, IgnoreEOS: true, N: 2})
	if err != nil {
		t.Fatal(err)
	}
	<-ch
	<-ch
	// Events go out during a step and the stats after it: wait for the
	// snapshot of the step that produced them.
	for e.Stats().Steps == 0 {
		time.Sleep(100 * time.Microsecond)
	}
	if e.Stats().KV.Used == 0 {
		t.Fatal("running request holds no blocks")
	}
	cancel()
	release()
	for range ch { // closes promptly
	}
	deadline := time.Now().Add(5 * time.Second)
	for e.Stats().KV.Used != 0 || e.Stats().Running != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("blocks not freed after cancel: %+v", e.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	// A waiting request that is cancelled never runs.
	e2, _ := New(&fakeModel{}, newFakeTok(), cfg)
	ctx2, cancel2 := context.WithCancel(context.Background())
	ch2, _ := e2.Submit(ctx2, &Request{Prompt: []int32{4}, MaxTokens: 3})
	cancel2()
	for { // the cancellation reaches the inbox asynchronously
		e2.mu.Lock()
		n := len(e2.inCancel)
		e2.mu.Unlock()
		if n > 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	e2.Start()
	for range ch2 {
	}
	e2.Stop(context.Background())
	mustNoLeak(t, e2)
	if e2.Stats().GenerationTokens != 0 || e2.Stats().Waiting != 0 {
		t.Fatalf("cancelled waiting request ran: %+v", e2.Stats())
	}
	e.Stop(context.Background())
	mustNoLeak(t, e)
	waitGoroutines(t, base)
}

func waitGoroutines(t *testing.T, base int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("goroutines leaked: %d > %d\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestStopDrainsAndForces(t *testing.T) {
	base := runtime.NumGoroutine()
	cfg := fakeConfig()
	cfg.KVBlocks = 64
	e, _ := New(&fakeModel{}, newFakeTok(), cfg)
	e.Start()
	ch, _ := e.Submit(context.Background(), &Request{Prompt: []int32{4, 5}, MaxTokens: 20, IgnoreEOS: true})
	if err := e.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r := collect(t, ch, 1); len(r.tokens[0]) != 20 {
		t.Fatalf("drain cut the request: %d tokens", len(r.tokens[0]))
	}
	// Forced: an expired context cancels what is left.
	e2, _ := New(&fakeModel{}, newFakeTok(), cfg)
	ch2, _ := e2.Submit(context.Background(), &Request{Prompt: []int32{4, 5}, IgnoreEOS: true})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := e2.Stop(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("forced stop: %v", err)
	}
	r := collect(t, ch2, 1)
	if r.finish[0] != FinishCancelled {
		t.Fatalf("forced stop finish %q", r.finish[0])
	}
	mustNoLeak(t, e2)
	waitGoroutines(t, base)
}

func TestForwardErrorEndsRequests(t *testing.T) {
	cfg := fakeConfig()
	cfg.KVBlocks = 64
	fm := &fakeModel{fail: errors.New("boom")}
	e := startEngine(t, fm, cfg)
	r := run(t, e, &Request{Prompt: []int32{4, 5}, MaxTokens: 3, N: 2})
	if r.finish[0] != FinishError || r.finish[1] != FinishError {
		t.Fatalf("finish %v", r.finish)
	}
	if r.events[0].Err == nil || !strings.Contains(r.events[0].Err.Error(), "boom") {
		t.Fatalf("error %v", r.events[0].Err)
	}
	e.Stop(context.Background())
	mustNoLeak(t, e)
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := fakeConfig()
	cfg.KVBlocks = 64
	cfg.Registry = reg
	cfg.ModelName = "fake"
	e := startEngine(t, &fakeModel{}, cfg)
	p := []int32{4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}
	run(t, e, &Request{Prompt: p, MaxTokens: 4, IgnoreEOS: true})
	run(t, e, &Request{Prompt: p, MaxTokens: 4, IgnoreEOS: true})
	e.Stop(context.Background())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() != "fake" && m.GetLabel()[len(m.GetLabel())-1].GetValue() != "fake" {
				t.Fatalf("%s without model_name", mf.GetName())
			}
			switch {
			case m.Counter != nil:
				got[mf.GetName()] += m.Counter.GetValue()
			case m.Gauge != nil:
				got[mf.GetName()] = m.Gauge.GetValue()
			case m.Histogram != nil:
				got[mf.GetName()] = float64(m.Histogram.GetSampleCount())
			}
		}
	}
	want := map[string]float64{
		"vllm:prompt_tokens_total": 34, "vllm:generation_tokens_total": 8,
		"vllm:prefix_cache_queries_total": 34, "vllm:prefix_cache_hits_total": 16,
		"vllm:request_success_total": 2, "vllm:num_preemptions_total": 0,
		"vllm:num_requests_running": 0, "vllm:num_requests_waiting": 0, "vllm:kv_cache_usage_perc": 0,
		"vllm:time_to_first_token_seconds": 2, "vllm:e2e_request_latency_seconds": 2,
		"vllm:inter_token_latency_seconds": 6, "vllm:request_time_per_output_token_seconds": 2,
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
	// Each request holds 17..21 tokens in two 16-token blocks while it runs,
	// so every step counts filled and reserved slots; at rest nothing is
	// wasted.
	filled, reserved := got["pagoda:kv_slots_filled_total"], got["pagoda:kv_slots_reserved_total"]
	if filled < 2*17 || reserved <= 0 || reserved >= filled {
		t.Errorf("KV slot counters: filled %v, reserved %v", filled, reserved)
	}
	if w, ok := got["pagoda:kv_waste_ratio"]; !ok || w != 0 {
		t.Errorf("idle waste ratio %v (present %v), want 0", w, ok)
	}
	if _, err := New(&fakeModel{}, newFakeTok(), cfg); err == nil {
		t.Fatal("registering the metrics twice in one registry must fail")
	}
}

func BenchmarkStepLoop(b *testing.B) {
	for _, c := range []struct {
		name  string
		stops []string
	}{{"plain", nil}, {"stops", []string{"\x00never", "zq"}}} {
		b.Run(c.name, func(b *testing.B) { benchStepLoop(b, c.stops) })
	}
}

// benchStepLoop runs rounds of 32 requests of 16 tokens on the fake
// model: the cost of everything but the model, output processing (with
// stop strings that never match, or none) included.
func benchStepLoop(b *testing.B, stops []string) {
	cfg := fakeConfig()
	cfg.KVBlocks = 512
	cfg.MaxNumSeqs = 32
	e, err := New(&fakeModel{}, newFakeTok(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	e.Start()
	defer e.Stop(context.Background())
	rng := rand.New(rand.NewPCG(1, 1))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var wg sync.WaitGroup
		for j := 0; j < 32; j++ {
			ch, err := e.Submit(context.Background(), &Request{Prompt: randPrompt(rng, nil, 16), MaxTokens: 16, IgnoreEOS: true, StopStrings: stops})
			if err != nil {
				b.Fatal(err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range ch {
				}
			}()
		}
		wg.Wait()
	}
	b.ReportMetric(float64(e.Stats().GenerationTokens)/b.Elapsed().Seconds(), "tok/s")
}

// TestRandomWorkloadNoLeaks mixes everything — parallel sampling, stop
// strings and tokens, EOS, cancellations at random moments, preemption in
// a small pool, chunked prefill — checking the cache invariants and the
// token budget at every step, and that every block is free or cached once
// all requests have ended.
func TestRandomWorkloadNoLeaks(t *testing.T) {
	base := runtime.NumGoroutine()
	rng := rand.New(rand.NewPCG(21, 22))
	cfg := fakeConfig()
	cfg.MaxNumBatchedTokens = 20
	cfg.KVBlocks = 20
	cfg.BlockSize = 4
	cfg.MaxNumSeqs = 8
	cfg.KVDType = kvcache.F16
	fm := &fakeModel{budget: 20, check: true}
	e, err := New(fm, newFakeTok(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.Start()
	shared := randPrompt(rng, nil, 12)
	var wg sync.WaitGroup
	n := 60
	if testing.Short() {
		n = 20
	}
	var mu sync.Mutex
	finishes := map[FinishReason]int{}
	for i := 0; i < n; i++ {
		r := &Request{
			Prompt:    randPrompt(rng, shared[:rng.IntN(12)], 1+rng.IntN(30)),
			MaxTokens: 1 + rng.IntN(20),
			N:         1 + rng.IntN(3),
			IgnoreEOS: rng.IntN(2) == 0,
			Sampling:  sample.Params{Temperature: float32(rng.IntN(2)), Seed: uint64(i), HasSeed: true},
		}
		if rng.IntN(3) == 0 {
			r.StopStrings = []string{string(rune('a' + rng.IntN(26)))}
		}
		if rng.IntN(3) == 0 {
			r.StopTokens = []int32{3 + rng.Int32N(27)}
		}
		ctx, cancel := context.WithCancel(context.Background())
		ch, err := e.Submit(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		after := -1
		if rng.IntN(4) == 0 {
			after = rng.IntN(4)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer cancel()
			k := 0
			for ev := range ch {
				if ev.Err != nil {
					t.Errorf("request failed: %v", ev.Err)
				}
				mu.Lock()
				finishes[ev.Finish]++
				mu.Unlock()
				if k == after {
					cancel()
				}
				k++
			}
		}()
		if rng.IntN(3) == 0 {
			time.Sleep(time.Duration(rng.IntN(500)) * time.Microsecond)
		}
	}
	wg.Wait()
	if err := e.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	mustNoLeak(t, e)
	st := e.Stats()
	t.Logf("finishes %v, steps %d, preemptions %d, prefix hits %d/%d", finishes, st.Steps, st.Preemptions, st.PrefixHits, st.PrefixQueries)
	if st.Running != 0 || st.Waiting != 0 || st.RunningSeqs != 0 {
		t.Fatalf("stats after drain %+v", st)
	}
	for _, k := range []FinishReason{FinishStop, FinishLength} {
		if finishes[k] == 0 {
			t.Errorf("no completion finished with %q", k)
		}
	}
	waitGoroutines(t, base)
}

// TestStaticBaseline: a static batch runs until its longest member ends
// before the next starts; continuous batching refills freed seats at once.
func TestStaticBaseline(t *testing.T) {
	steps := map[bool]uint64{}
	for _, static := range []bool{true, false} {
		cfg := fakeConfig()
		cfg.KVBlocks = 64
		cfg.MaxNumSeqs = 4
		cfg.Static = static
		e, err := New(&fakeModel{}, newFakeTok(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		var chans []<-chan Event
		for i := 0; i < 8; i++ {
			mt := 2
			if i%4 == 0 {
				mt = 20
			}
			ch, err := e.Submit(context.Background(), &Request{Prompt: []int32{int32(4 + i)}, MaxTokens: mt, IgnoreEOS: true})
			if err != nil {
				t.Fatal(err)
			}
			chans = append(chans, ch)
		}
		e.Start()
		for _, ch := range chans {
			collect(t, ch, 1)
		}
		e.Stop(context.Background())
		steps[static] = e.Stats().Steps
	}
	if steps[true] != 40 || steps[false] > 25 {
		t.Fatalf("steps: static %d (want 40), continuous %d (want ≤ 25)", steps[true], steps[false])
	}
}

// TestSlowConsumer: a client that reads late gets the same tokens, text
// and logprobs, merged into fewer events, and never holds up the engine.
func TestSlowConsumer(t *testing.T) {
	cfg := fakeConfig()
	cfg.KVBlocks = 64
	e := startEngine(t, &fakeModel{}, cfg)
	r := &Request{Prompt: []int32{7, 8, 9}, MaxTokens: 40, IgnoreEOS: true, Logprobs: true}
	fast := run(t, e, r)
	ch, err := e.Submit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	// Other requests run to completion while this one's events pile up.
	run(t, e, &Request{Prompt: []int32{4}, MaxTokens: 60, IgnoreEOS: true})
	slow := collect(t, ch, 1)
	if fmt.Sprint(slow.tokens) != fmt.Sprint(fast.tokens) || slow.text[0] != fast.text[0] {
		t.Fatalf("slow consumer got %v %q, fast %v %q", slow.tokens, slow.text[0], fast.tokens, fast.text[0])
	}
	var lp, lpFast []float32
	for _, ev := range slow.events {
		lp = append(lp, ev.Logprob...)
		if len(ev.Logprob) != len(ev.Tokens) {
			t.Fatalf("merged event has %d tokens, %d logprobs", len(ev.Tokens), len(ev.Logprob))
		}
	}
	for _, ev := range fast.events {
		lpFast = append(lpFast, ev.Logprob...)
	}
	if fmt.Sprint(lp) != fmt.Sprint(lpFast) {
		t.Fatal("logprobs differ after merging")
	}
	if len(slow.events) > 5 {
		t.Fatalf("slow consumer got %d events for 40 tokens: nothing merged", len(slow.events))
	}
	if slow.events[len(slow.events)-1].Usage == nil {
		t.Fatal("usage not on the last event")
	}
}

// TestLongPrefillThreshold: with the cap, two long prompts prefill side
// by side; without it the second waits for the first.
func TestLongPrefillThreshold(t *testing.T) {
	rng := rand.New(rand.NewPCG(30, 31))
	reqs := []*Request{
		{Prompt: randPrompt(rng, nil, 90), MaxTokens: 3, IgnoreEOS: true},
		{Prompt: randPrompt(rng, nil, 90), MaxTokens: 3, IgnoreEOS: true},
	}
	want := reference(t, reqs)
	for _, thr := range []int{0, 16} {
		cfg := fakeConfig()
		cfg.KVBlocks = 64
		cfg.MaxNumBatchedTokens = 32
		cfg.LongPrefillThreshold = thr
		fm := &fakeModel{budget: 32}
		e, err := New(fm, newFakeTok(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		var chans []<-chan Event
		for _, r := range reqs {
			ch, err := e.Submit(context.Background(), r)
			if err != nil {
				t.Fatal(err)
			}
			chans = append(chans, ch)
		}
		e.Start()
		for i, ch := range chans {
			if got := collect(t, ch, 1); fmt.Sprint(got.tokens) != fmt.Sprint(want[i].tokens) {
				t.Fatalf("threshold %d request %d: %v, alone %v", thr, i, got.tokens, want[i].tokens)
			}
		}
		e.Stop(context.Background())
		both := 0
		for _, s := range fm.seqs[:3] {
			if s[0] && s[1] {
				both++
			}
		}
		if (thr > 0) != (both == 3) {
			t.Fatalf("threshold %d: %d of the first 3 steps ran both prefills", thr, both)
		}
	}
}

// A max_tokens near MaxInt must not wrap prompt+max_tokens negative and
// slip past the context or KV-cache limit.
func TestMaxTokensOverflow(t *testing.T) {
	cfg := fakeConfig()
	cfg.KVBlocks = 4 // 64 tokens, under the context of 256
	e, err := New(&fakeModel{}, newFakeTok(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, mt := range []int{math.MaxInt, math.MaxInt - 1, math.MaxInt - 255, 255, 63} {
		_, err := e.Submit(context.Background(), &Request{Prompt: []int32{5, 6}, MaxTokens: mt})
		if !errors.Is(err, ErrTooLong) {
			t.Fatalf("max_tokens %d: %v, want a too-long error", mt, err)
		}
		if strings.Contains(err.Error(), "= -") {
			t.Errorf("max_tokens %d: negative sum in %q", mt, err)
		}
	}
}

// A huge context times the default sequence count must not wrap the
// default KV budget negative.
func TestDefaultBudgetHugeContext(t *testing.T) {
	cfg := fakeConfig()
	// 128 bytes a token × this wraps int64 to a negative number.
	cfg.ContextLen = 1<<56 + 1<<55 - kvcache.DefaultBlockSize
	cfg.KVBlocks, cfg.KVBytes = 0, 0
	e, err := New(&fakeModel{}, newFakeTok(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if e.kv.Pool().NumBlocks() <= 0 {
		t.Fatalf("no blocks")
	}
}
