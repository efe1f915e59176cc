package engine

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"pagoda/grammar"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"pagoda/model"
	"pagoda/sample"
	"pagoda/spec"
)

// skewed is a draft model made from the fake target by bending its
// logits: a deliberately different q, from the same ids.
type skewed struct {
	fakeModel
	scale float64
}

func (s *skewed) Forward(b *model.Batch, kv model.KVCache) ([]float32, error) {
	out, err := s.fakeModel.Forward(b, kv)
	if err != nil {
		return nil, err
	}
	row := 0
	for i, t := range b.Tokens {
		if b.Logits != nil && !b.Logits[i] {
			continue
		}
		for j := range fakeVocab {
			out[row*fakeVocab+j] += float32(s.scale * math.Sin(float64(int(t)*5+j*11)))
		}
		row++
	}
	return out, nil
}

var fakeModelConfig = model.Config{NLayer: 2, NKVHead: 2, HeadDim: 4, VocabSize: fakeVocab, ContextLen: 256}

func fakeDraft(t testing.TB, scale float64, pmin float32) *spec.Draft {
	t.Helper()
	d, err := spec.NewDraftFrom(&skewed{fakeModel: fakeModel{check: true}, scale: scale}, fakeModelConfig,
		spec.DraftOptions{TargetVocab: fakeVocab, KVBlocks: 96, PMin: pmin})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// specWorkload is concurrent greedy requests with shared prefixes and
// prompts that repeat themselves (so n-gram drafts get accepted).
func specWorkload(seed uint64, n int) []*Request {
	rng := rand.New(rand.NewPCG(seed, 9))
	shared := randPrompt(rng, nil, 24)
	var reqs []*Request
	for i := range n {
		var p []int32
		switch i % 3 {
		case 0:
			p = randPrompt(rng, shared[:8+rng.IntN(16)], 20+rng.IntN(20))
		case 1:
			p = randPrompt(rng, nil, 2+rng.IntN(30))
		default:
			half := randPrompt(rng, nil, 6+rng.IntN(8))
			p = append(append(slices.Clone(half), half...), half[:3]...)
		}
		reqs = append(reqs, &Request{ID: fmt.Sprint(i), Prompt: p, MaxTokens: 8 + rng.IntN(30), IgnoreEOS: i%4 != 0})
	}
	return reqs
}

func refsOf(reqs []*Request, res []result) [][]int32 {
	var refs [][]int32
	for i, r := range reqs {
		refs = append(refs, append(slices.Clone(r.Prompt), res[i].tokens[0]...))
	}
	return refs
}

// TestSpecGreedyIdentical: greedy output with speculation is token for
// token (and text and finish reason) the output without, for every
// proposer, solo and under concurrent load with chunked prefill, prefix
// hits and preemption, and leaves no block held in either cache.
func TestSpecGreedyIdentical(t *testing.T) {
	reqs := specWorkload(5, 18)
	want := reference(t, reqs)
	ng, _ := spec.NewNGram(1, 3)
	oracle, _ := spec.NewOracle(0.7, fakeVocab, refsOf(reqs, want), 1)
	for _, tc := range []struct {
		name string
		p    spec.Proposer
	}{
		{"ngram", ng}, {"oracle", oracle}, {"draft", fakeDraft(t, 1.5, 0)}, {"draft-pmin", fakeDraft(t, 1.5, 0.3)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, load := range []string{"solo", "concurrent"} {
				cfg := fakeConfig()
				cfg.Spec = SpecConfig{Proposer: tc.p, Tokens: 5, Fixed: true}
				if load == "concurrent" {
					cfg.KVBlocks = 14
					cfg.BlockSize = 8
					cfg.MaxNumBatchedTokens = 40
				} else {
					cfg.KVBlocks = 64
				}
				e := startEngine(t, &fakeModel{check: true}, cfg)
				got := runLoad(t, e, reqs, load)
				e.Stop(context.Background())
				for i := range reqs {
					if fmt.Sprint(got[i].tokens, got[i].finish) != fmt.Sprint(want[i].tokens, want[i].finish) || got[i].text[0] != want[i].text[0] {
						t.Fatalf("%s request %d: %v %v %q, without speculation %v %v %q", load, i,
							got[i].tokens, got[i].finish, got[i].text[0], want[i].tokens, want[i].finish, want[i].text[0])
					}
				}
				mustNoLeak(t, e)
				if d, ok := tc.p.(*spec.Draft); ok {
					mustNoLeakKV(t, d)
				}
				st := e.Stats()
				t.Logf("%s: steps %d, preemptions %d, drafts %d, draft tokens %d, accepted %d", load, st.Steps, st.Preemptions, st.SpecDrafts, st.SpecDraftTokens, st.SpecAccepted)
				if st.SpecAccepted == 0 || st.SpecAccepted == st.SpecDraftTokens {
					t.Errorf("%s: %d of %d drafts accepted: the test exercises neither acceptance or rejection", load, st.SpecAccepted, st.SpecDraftTokens)
				}
				if load == "concurrent" && st.Preemptions == 0 {
					t.Errorf("no preemption under load")
				}
			}
		})
	}
}

func mustNoLeakKV(t *testing.T, d *spec.Draft) {
	t.Helper()
	if err := d.KV().Check(); err != nil {
		t.Fatal(err)
	}
	if u := d.KV().Usage(); u.Used != 0 || u.Seqs != 0 {
		t.Fatalf("draft cache leaked: %+v", u)
	}
}

// TestSpecSeededIdentical: with one-hot drafts (n-gram, the oracle) each
// position costs one draw of the sampler's stream, so seeded sampling at
// temperature 1 with top-p, penalties and a logit bias gives the very
// tokens it gives without speculation; a penalty history that missed the
// accepted drafts would change them.
func TestSpecSeededIdentical(t *testing.T) {
	sp := sample.Params{Temperature: 1, TopP: 0.9, RepetitionPenalty: 1.3, FrequencyPenalty: 0.4, PenaltyLastN: 12,
		LogitBias: map[int32]float32{7: 2}, Seed: 11, HasSeed: true}
	reqs := specWorkload(6, 12)
	for i, r := range reqs {
		r.Sampling = sp
		r.Sampling.Seed += uint64(i)
		r.Logprobs, r.TopLogprobs = true, 2
	}
	want := reference(t, reqs)
	ng, _ := spec.NewNGram(1, 2)
	oracle, _ := spec.NewOracle(0.8, fakeVocab, refsOf(reqs, want), 2)
	for _, p := range []spec.Proposer{ng, oracle} {
		cfg := fakeConfig()
		cfg.KVBlocks = 64
		cfg.Spec = SpecConfig{Proposer: p, Tokens: 4, Fixed: true}
		e := startEngine(t, &fakeModel{check: true}, cfg)
		got := runAll(t, e, reqs)
		e.Stop(context.Background())
		for i := range reqs {
			if fmt.Sprint(got[i].tokens, got[i].text) != fmt.Sprint(want[i].tokens, want[i].text) {
				t.Fatalf("%T request %d: %v, without speculation %v", p, i, got[i].tokens, want[i].tokens)
			}
			var lg, lw []float32
			for _, ev := range got[i].events {
				lg = append(lg, ev.Logprob...)
			}
			for _, ev := range want[i].events {
				lw = append(lw, ev.Logprob...)
			}
			if fmt.Sprint(lg) != fmt.Sprint(lw) {
				t.Fatalf("request %d logprobs %v, without speculation %v", i, lg, lw)
			}
		}
		st := e.Stats()
		if st.SpecAccepted == 0 {
			t.Fatalf("%T: nothing accepted", p)
		}
		mustNoLeak(t, e)
	}
}

// TestSpecStopsInsideDrafts: a stop token, stop string or max_tokens that
// falls inside a run of accepted drafts ends the completion right there,
// exactly as without speculation.
func TestSpecStopsInsideDrafts(t *testing.T) {
	cfg := fakeConfig()
	cfg.KVBlocks = 64
	plain := startEngine(t, &fakeModel{}, cfg)
	rng := rand.New(rand.NewPCG(12, 13))
	p := randPrompt(rng, nil, 10)
	full := run(t, plain, &Request{Prompt: p, MaxTokens: 30, IgnoreEOS: true})
	text := full.text[0]
	oracle, _ := spec.NewOracle(1, fakeVocab, [][]int32{append(slices.Clone(p), full.tokens[0]...)}, 3)
	cfg.Spec = SpecConfig{Proposer: oracle, Tokens: 8, Fixed: true}
	e := startEngine(t, &fakeModel{check: true}, cfg)
	reqs := []*Request{
		{Prompt: p, MaxTokens: 30, IgnoreEOS: true, StopStrings: []string{text[6:9]}},
		{Prompt: p, MaxTokens: 30, IgnoreEOS: true, StopTokens: []int32{full.tokens[0][5]}},
		{Prompt: p, MaxTokens: 7, IgnoreEOS: true},
		{Prompt: p, MaxTokens: 30, StopStrings: []string{text[10:12]}, StopTokens: []int32{full.tokens[0][13]}},
	}
	for i, r := range reqs {
		want := run(t, plain, r)
		got := run(t, e, r)
		if fmt.Sprint(got.tokens, got.text, got.finish) != fmt.Sprint(want.tokens, want.text, want.finish) {
			t.Fatalf("request %d: %v %q %v, without speculation %v %q %v", i, got.tokens, got.text, got.finish, want.tokens, want.text, want.finish)
		}
		if got.usage.CompletionTokens != want.usage.CompletionTokens {
			t.Fatalf("request %d: usage %d tokens, want %d", i, got.usage.CompletionTokens, want.usage.CompletionTokens)
		}
	}
	st := e.Stats()
	if st.SpecAccepted == 0 || st.Steps >= plain.Stats().Steps {
		t.Fatalf("speculation took %d steps (%d accepted), plain %d", st.Steps, st.SpecAccepted, plain.Stats().Steps)
	}
	e.Stop(context.Background())
	mustNoLeak(t, e)
}

// TestSpecCancelAndPreemptNoLeak cancels speculating requests at random
// moments under preemption pressure; both caches end empty.
func TestSpecCancelAndPreemptNoLeak(t *testing.T) {
	d := fakeDraft(t, 0.5, 0)
	cfg := fakeConfig()
	cfg.KVBlocks = 12
	cfg.BlockSize = 8
	cfg.MaxNumBatchedTokens = 48
	cfg.Spec = SpecConfig{Proposer: d, Tokens: 4, Fixed: true}
	e := startEngine(t, &fakeModel{check: true}, cfg)
	reqs := specWorkload(7, 24)
	for i, r := range reqs {
		r.MaxTokens += 20
		if i%2 == 1 {
			r.Sampling = sample.Params{Temperature: 1, Seed: uint64(i), HasSeed: true}
		}
	}
	submitCancelling(t, e, reqs, 8)
	if err := e.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	st := e.Stats()
	if st.Preemptions == 0 || st.SpecDrafts == 0 {
		t.Fatalf("preemptions %d, drafts %d: the load did not exercise both", st.Preemptions, st.SpecDrafts)
	}
	mustNoLeak(t, e)
	mustNoLeakKV(t, d)
}

// submitCancelling submits reqs and reads them concurrently, cancelling
// two in three after a random number of tokens, and returns when every
// stream has closed.
func submitCancelling(t *testing.T, e *Engine, reqs []*Request, seed uint64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, seed))
	var wg sync.WaitGroup
	for i, r := range reqs {
		ctx, cancel := context.WithCancel(context.Background())
		ch, err := e.Submit(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		after := rng.IntN(12)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer cancel()
			n := 0
			for ev := range ch {
				n += len(ev.Tokens)
				if n > after && i%3 != 0 {
					cancel()
				}
			}
		}()
	}
	wg.Wait()
}

// TestSpecMetrics reads the vLLM spec_decode counters back.
func TestSpecMetrics(t *testing.T) {
	cfg := fakeConfig()
	cfg.KVBlocks = 64
	plain := startEngine(t, &fakeModel{}, cfg)
	p := []int32{4, 5, 6, 7}
	full := run(t, plain, &Request{Prompt: p, MaxTokens: 20, IgnoreEOS: true})
	oracle, _ := spec.NewOracle(1, fakeVocab, [][]int32{append(slices.Clone(p), full.tokens[0]...)}, 3)
	reg := prometheus.NewRegistry()
	cfg.Registry = reg
	cfg.Spec = SpecConfig{Proposer: oracle, Tokens: 3, Fixed: true}
	e := startEngine(t, &fakeModel{}, cfg)
	run(t, e, &Request{Prompt: p, MaxTokens: 20, IgnoreEOS: true})
	// Not speculating: the request opts out.
	run(t, e, &Request{Prompt: p, MaxTokens: 20, IgnoreEOS: true, SpecTokens: -1})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "vllm:spec_decode") {
			continue
		}
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				if l.GetName() == "position" {
					name += "/" + l.GetValue()
				}
			}
			got[name] = m.GetCounter().GetValue()
		}
	}
	// 20 tokens: the prompt step gives 1; then 4 per step (3 drafts and
	// a bonus) until max_tokens caps the drafts: 1+4·4 = 17, then 3 left:
	// 2 drafts and a bonus.
	want := map[string]float64{
		"vllm:spec_decode_num_drafts": 5, "vllm:spec_decode_num_draft_tokens": 14, "vllm:spec_decode_num_accepted_tokens": 14,
		"vllm:spec_decode_num_accepted_tokens_per_pos/0": 5, "vllm:spec_decode_num_accepted_tokens_per_pos/1": 5,
		"vllm:spec_decode_num_accepted_tokens_per_pos/2": 4,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("metrics %v, want %v", got, want)
	}
	// Acceptance length per verification: four of 4 tokens, one of 3.
	for _, mf := range mfs {
		if mf.GetName() != "pagoda:spec_decode_acceptance_length" {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		var cum []uint64
		for _, b := range h.GetBucket() {
			cum = append(cum, b.GetCumulativeCount())
		}
		if h.GetSampleCount() != 5 || h.GetSampleSum() != 19 || fmt.Sprint(cum) != "[0 0 1 5]" {
			t.Fatalf("acceptance length: %d verifications, sum %g, cumulative buckets 1…4 %v", h.GetSampleCount(), h.GetSampleSum(), cum)
		}
		return
	}
	t.Fatal("no pagoda:spec_decode_acceptance_length")
}

// chiSquare is the two-sample homogeneity test of counts a and b over the
// same categories (rare ones pooled): the statistic, its degrees of
// freedom and the upper-tail p-value (Wilson–Hilferty).
func chiSquare(a, b map[string]int) (x2 float64, df int, pval float64) {
	var na, nb int
	for _, v := range a {
		na += v
	}
	for _, v := range b {
		nb += v
	}
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	var ks []string
	for k := range keys {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	ka, kb := math.Sqrt(float64(nb)/float64(na)), math.Sqrt(float64(na)/float64(nb))
	var pa, pb, cats int
	add := func(x, y int) {
		x2 += math.Pow(float64(x)*ka-float64(y)*kb, 2) / float64(x+y)
		cats++
	}
	for _, k := range ks {
		if a[k]+b[k] < 10 {
			pa, pb = pa+a[k], pb+b[k]
			continue
		}
		add(a[k], b[k])
	}
	if pa+pb > 0 {
		add(pa, pb)
	}
	df = cats - 1
	if df < 1 {
		return x2, df, 1
	}
	k := float64(df)
	z := (math.Cbrt(x2/k) - (1 - 2/(9*k))) / math.Sqrt(2/(9*k))
	return x2, df, 0.5 * math.Erfc(z/math.Sqrt2)
}

// tokenStats tallies, over completions, the token at each of the first
// positions and the pair at positions 1 and 2.
func tokenStats(res []result, positions int) []map[string]int {
	st := make([]map[string]int, positions+1)
	for i := range st {
		st[i] = map[string]int{}
	}
	for _, r := range res {
		toks := r.tokens[0]
		for p := 0; p < positions && p < len(toks); p++ {
			st[p][fmt.Sprint(toks[p])]++
		}
		if len(toks) > 2 {
			st[positions][fmt.Sprint(toks[1], toks[2])]++
		}
	}
	return st
}

// sampleMany runs n seeded requests of prompt through e.
func sampleMany(t *testing.T, e *Engine, prompt []int32, sp sample.Params, n, maxTokens int, seed uint64) []result {
	t.Helper()
	var reqs []*Request
	for i := range n {
		p := sp
		p.Seed, p.HasSeed = seed+uint64(i)*7919, true
		reqs = append(reqs, &Request{Prompt: prompt, MaxTokens: maxTokens, IgnoreEOS: true, Sampling: p})
	}
	var out []result
	for lo := 0; lo < n; lo += 256 {
		out = append(out, runAll(t, e, reqs[lo:min(lo+256, n)])...)
	}
	return out
}

// TestSpecDistributionFake is the exactness test on the fake model: the
// first tokens sampled at temperature 1 (and with top-p 0.9) through a
// skewed draft model have the distribution of the target's alone, by a
// chi-square test; a wrong acceptance rule (keep every draft) fails it.
func TestSpecDistributionFake(t *testing.T) {
	const n, positions = 3000, 4
	prompt := []int32{4, 9, 13, 6}
	for _, sp := range []sample.Params{{Temperature: 1}, {Temperature: 1, TopP: 0.9}} {
		cfg := fakeConfig()
		cfg.KVBlocks = 256
		cfg.MaxWaiting = 4096
		plain := startEngine(t, &fakeModel{}, cfg)
		want := tokenStats(sampleMany(t, plain, prompt, sp, n, positions, 1), positions)
		cfg.Spec = SpecConfig{Proposer: fakeDraft(t, 2, 0), Tokens: 3, Fixed: true}
		for _, wrong := range []bool{false, true} {
			e := startEngine(t, &fakeModel{}, cfg)
			if wrong {
				e.accept = func(p, q []float32, x int32, u float64) bool { return true }
			}
			got := tokenStats(sampleMany(t, e, prompt, sp, n, positions, 1<<40), positions)
			minP := 1.0
			for i := range got {
				x2, df, pv := chiSquare(got[i], want[i])
				t.Logf("top-p %v wrong %v: position %d: χ² %.1f, df %d, p %.3g", sp.TopP, wrong, i, x2, df, pv)
				minP = min(minP, pv)
			}
			st := e.Stats()
			t.Logf("accepted %d of %d drafts", st.SpecAccepted, st.SpecDraftTokens)
			// Five tests at once: Bonferroni at 0.001 overall.
			if !wrong && minP < 0.0002 {
				t.Errorf("top-p %v: speculation changed the distribution (p = %.3g)", sp.TopP, minP)
			}
			if wrong && minP > 1e-6 {
				t.Errorf("top-p %v: the wrong rule passed (p = %.3g): the test has no power", sp.TopP, minP)
			}
			if st.SpecAccepted == 0 || st.SpecAccepted == st.SpecDraftTokens && !wrong {
				t.Errorf("accepted %d of %d drafts", st.SpecAccepted, st.SpecDraftTokens)
			}
			e.Stop(context.Background())
			mustNoLeak(t, e)
		}
	}
	_ = time.Second
}

// TestSpecSkipsConstrained: on an engine that speculates, a constrained
// request verifies no drafts (its constraint's state cannot roll back)
// and follows its mask, while an unconstrained one beside it speculates.
func TestSpecSkipsConstrained(t *testing.T) {
	cfg := fakeConfig()
	cfg.KVBlocks = 64
	ng, _ := spec.NewNGram(1, 2)
	cfg.Spec = SpecConfig{Proposer: ng, Tokens: 4, Fixed: true}
	cfg.Constraints = funcCompiler{"nines": func() sample.Constraint { return &countdown{want: 9, limit: -1} }}
	e := startEngine(t, &fakeModel{}, cfg)
	// The mask makes the output one repeated token: ideal for n-gram
	// drafts, were they allowed.
	r := run(t, e, &Request{Prompt: []int32{3, 4, 5}, MaxTokens: 20, IgnoreEOS: true, Constraint: &grammar.Spec{Schema: "nines"}})
	if len(r.tokens[0]) != 20 || slices.IndexFunc(r.tokens[0], func(t int32) bool { return t != 9 }) >= 0 {
		t.Fatalf("constrained output %v", r.tokens[0])
	}
	if st := e.Stats(); st.SpecDrafts != 0 {
		t.Fatalf("a constrained request verified %d drafts", st.SpecDrafts)
	}
	run(t, e, &Request{Prompt: []int32{9, 9, 9, 9}, MaxTokens: 20, IgnoreEOS: true})
	if st := e.Stats(); st.SpecDrafts == 0 {
		t.Fatal("the unconstrained request did not speculate either: the test shows nothing")
	}
}
