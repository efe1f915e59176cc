package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"pagoda/model"
	"pagoda/spec"
	"pagoda/tokenizer"
)

// TestSpecMeasure produces the speculation measurements; it runs only
// when PAGODA_SPEC_MEASURE names one (they take minutes):
//
//	passes  time of one target pass over 1, 2, 4, 8, 16 tokens of one sequence
//	alpha   decode tokens/s, plain and with an oracle proposer of set acceptance
//	real    tokens/s and acceptance of n-gram and draft-model speculation
//	copy    n-gram on an input-copying prompt
//
// PAGODA_SPEC_MODEL is the target (default stories260K), PAGODA_SPEC_DRAFT
// the draft model, PAGODA_SPEC_REPS the interleaved repetitions (5),
// PAGODA_SPEC_TOKENS the tokens generated (64), PAGODA_SPEC_THREADS (2).
func TestSpecMeasure(t *testing.T) {
	mode := os.Getenv("PAGODA_SPEC_MEASURE")
	if mode == "" {
		t.Skip("set PAGODA_SPEC_MEASURE=passes|alpha|real|copy")
	}
	path := os.Getenv("PAGODA_SPEC_MODEL")
	if path == "" {
		path = os.Getenv("PAGODA_SHARED") + "/models/gguf/stories260K.gguf"
	}
	m, err := model.Open(path, model.Options{Threads: envInt("PAGODA_SPEC_THREADS", 2)})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	reps, ntok := envInt("PAGODA_SPEC_REPS", 5), envInt("PAGODA_SPEC_TOKENS", 64)
	t.Logf("model %s, threads %d, reps %d, tokens %d, GOMAXPROCS-visible CPUs shared with other jobs", path, m.Pool().Threads(), reps, ntok)
	switch mode {
	case "passes":
		measurePasses(t, m, reps)
	case "alpha":
		measureAlpha(t, m, reps, ntok)
	case "real", "copy":
		measureReal(t, m, reps, ntok, mode == "copy")
	default:
		t.Fatalf("unknown PAGODA_SPEC_MEASURE %q", mode)
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

// spread is "median [min, max]" of xs.
func spread(xs []float64, format string) string {
	s := slices.Clone(xs)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return fmt.Sprintf(format+" ["+format+", "+format+"]", med, s[0], s[len(s)-1])
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

func measurePasses(t *testing.T, m *model.Model, reps int) {
	const ctx = 64
	kv := m.NewFlatCache(1, ctx+32)
	rng := rand.New(rand.NewPCG(1, 1))
	b := &model.Batch{}
	for i := range ctx {
		b.Tokens = append(b.Tokens, 3+rng.Int32N(int32(m.Config.VocabSize-3)))
		b.Pos = append(b.Pos, int32(i))
		b.Seq = append(b.Seq, 0)
	}
	if _, err := m.Forward(b, kv); err != nil {
		t.Fatal(err)
	}
	sizes := []int{1, 2, 4, 8, 16}
	times := map[int][]float64{}
	for r := range reps + 1 {
		for k := range sizes {
			n := sizes[(k+r)%len(sizes)] // rotate the order between rounds
			b.Tokens, b.Pos, b.Seq, b.Logits = b.Tokens[:0], b.Pos[:0], b.Seq[:0], b.Logits[:0]
			for i := range n {
				b.Tokens = append(b.Tokens, 3+rng.Int32N(100))
				b.Pos = append(b.Pos, int32(ctx+i))
				b.Seq = append(b.Seq, 0)
				b.Logits = append(b.Logits, true)
			}
			t0 := time.Now()
			if _, err := m.Forward(b, kv); err != nil {
				t.Fatal(err)
			}
			if r > 0 { // round 0 warms up
				times[n] = append(times[n], time.Since(t0).Seconds()*1000)
			}
		}
	}
	base := median(times[1])
	for _, n := range sizes {
		t.Logf("pass over %2d tokens: %s ms, ×%.2f of one token, %.2f ms/token", n, spread(times[n], "%.1f"), median(times[n])/base, median(times[n])/float64(n))
	}
}

// decodeRate runs r alone on e and returns its decode tokens/s (first
// token to last) and the generated tokens.
func decodeRate(t *testing.T, e *Engine, r *Request) (float64, []int32) {
	t.Helper()
	ch, err := e.Submit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	var first, last time.Time
	var toks []int32
	for ev := range ch {
		if len(ev.Tokens) > 0 {
			if first.IsZero() {
				first = time.Now()
			}
			last = time.Now()
			toks = append(toks, ev.Tokens...)
		}
	}
	return float64(len(toks)-1) / last.Sub(first).Seconds(), toks
}

func measurePrompt(m *model.Model, copying bool) []int32 {
	tok := m.Tokenizer()
	if !copying {
		return tok.Encode("Once upon a time, there was a little girl named Lily. She", tokenizer.Options{AddSpecial: true})
	}
	rng := rand.New(rand.NewPCG(2, 2))
	body := make([]int32, 48)
	for i := range body {
		body[i] = 100 + rng.Int32N(int32(m.Config.VocabSize-200))
	}
	p := append([]int32{max(tok.Vocab().BOS, 0)}, body...)
	p = append(p, body...)
	return append(p, body[:8]...)
}

func measureAlpha(t *testing.T, m *model.Model, reps, ntok int) {
	tok := m.Tokenizer()
	prompt := measurePrompt(m, false)
	req := func(spec int) *Request {
		return &Request{Prompt: prompt, MaxTokens: ntok, IgnoreEOS: true, SpecTokens: spec}
	}
	plainCfg := ModelConfig(m, "measure")
	plainCfg.MaxNumSeqs = 1
	plain, err := New(m, tok, plainCfg)
	if err != nil {
		t.Fatal(err)
	}
	plain.Start()
	defer plain.Stop(context.Background())
	_, ref := decodeRate(t, plain, req(0))
	refs := [][]int32{append(slices.Clone(prompt), ref...)}
	gamma := envInt("PAGODA_SPEC_GAMMA", 4)
	alphas := []float64{0, 0.25, 0.5, 0.7, 0.8, 0.9, 1}
	engines := make([]*Engine, len(alphas))
	for i, a := range alphas {
		o, err := spec.NewOracle(a, m.Config.VocabSize, refs, uint64(i))
		if err != nil {
			t.Fatal(err)
		}
		cfg := plainCfg
		cfg.Spec = SpecConfig{Proposer: o, Tokens: gamma, Fixed: true}
		e, err := New(m, tok, cfg)
		if err != nil {
			t.Fatal(err)
		}
		e.Start()
		defer e.Stop(context.Background())
		engines[i] = e
	}
	base := []float64{}
	rates := make([][]float64, len(alphas))
	for r := range reps {
		x, got := decodeRate(t, plain, req(0))
		if !slices.Equal(got, ref) {
			t.Fatal("plain run differs from the reference")
		}
		base = append(base, x)
		for i := range alphas {
			k := (i + r) % len(alphas)
			x, got := decodeRate(t, engines[k], req(0))
			if !slices.Equal(got, ref) {
				t.Fatalf("α %v: output differs from the plain run", alphas[k])
			}
			rates[k] = append(rates[k], x)
		}
	}
	t.Logf("plain decode: %s tok/s", spread(base, "%.1f"))
	for i, a := range alphas {
		st := engines[i].Stats()
		t.Logf("α %.2f γ %d: %s tok/s, speedup ×%.2f, measured acceptance %.2f, tokens per target pass %.2f", a, gamma,
			spread(rates[i], "%.1f"), median(rates[i])/median(base),
			float64(st.SpecAccepted)/float64(max(st.SpecDraftTokens, 1)), float64(st.GenerationTokens)/float64(st.Steps))
	}
}

func measureReal(t *testing.T, m *model.Model, reps, ntok int, copying bool) {
	tok := m.Tokenizer()
	type setup struct {
		name string
		sc   SpecConfig
	}
	ng, _ := spec.NewNGram(envInt("PAGODA_SPEC_NGRAM_MIN", 2), envInt("PAGODA_SPEC_NGRAM_MAX", 4))
	setups := []setup{{"plain", SpecConfig{}}, {"ngram adaptive", SpecConfig{Proposer: ng}}, {"ngram fixed γ4", SpecConfig{Proposer: ng, Fixed: true}}}
	if dp := os.Getenv("PAGODA_SPEC_DRAFT"); dp != "" {
		dm, err := model.Open(dp, model.Options{Pool: m.Pool()})
		if err != nil {
			t.Fatal(err)
		}
		defer dm.Close()
		for _, fixed := range []bool{false, true} {
			d, err := spec.NewDraft(dm, tok.Vocab(), spec.DraftOptions{TargetVocab: m.Config.VocabSize, KVBlocks: 1024})
			if err != nil {
				t.Fatal(err)
			}
			name := "draft adaptive"
			if fixed {
				name = "draft fixed γ4"
			}
			setups = append(setups, setup{name, SpecConfig{Proposer: d, Fixed: fixed}})
		}
	}
	var prompts [][]int32
	if copying {
		prompts = [][]int32{measurePrompt(m, true)}
	} else {
		for _, s := range []string{"Once upon a time, there was a little girl named Lily. She", "The cat sat on the mat. The cat", "Tom had a big red ball. He liked to", "One day, Ben and his mom went to the park.", "Sue saw a bird in the tree. The bird", "There was a dog named Max. Max liked", "Lily and Tom were best friends. They", "The sun was hot. Tim wanted to"} {
			prompts = append(prompts, tok.Encode(s, tokenizer.Options{AddSpecial: true}))
		}
	}
	for _, conc := range []int{1, 8} {
		engines := make([]*Engine, len(setups))
		for i, s := range setups {
			cfg := ModelConfig(m, "measure")
			cfg.MaxNumSeqs = conc
			cfg.Spec = s.sc
			e, err := New(m, tok, cfg)
			if err != nil {
				t.Fatal(err)
			}
			e.Start()
			engines[i] = e
		}
		rates := make([][]float64, len(setups))
		outs := make([][][]int32, len(setups))
		for r := range reps + 1 {
			for k := range setups {
				i := (k + r) % len(setups)
				var mu sync.Mutex
				var wg sync.WaitGroup
				gen := 0
				out := make([][]int32, conc)
				t0 := time.Now()
				for j := range conc {
					wg.Add(1)
					go func() {
						defer wg.Done()
						p := prompts[(j+r)%len(prompts)]
						ch, err := engines[i].Submit(context.Background(), &Request{Prompt: p, MaxTokens: ntok, IgnoreEOS: true})
						if err != nil {
							t.Error(err)
							return
						}
						for ev := range ch {
							out[j] = append(out[j], ev.Tokens...)
						}
						mu.Lock()
						gen += len(out[j])
						mu.Unlock()
					}()
				}
				wg.Wait()
				if r == 0 {
					continue // warm-up round (and the cost model's first fit)
				}
				rates[i] = append(rates[i], float64(gen)/time.Since(t0).Seconds())
				outs[i] = append(outs[i], out...)
			}
		}
		for i, s := range setups {
			st := engines[i].Stats()
			engines[i].Stop(context.Background())
			if fmt.Sprint(outs[i]) != fmt.Sprint(outs[0]) {
				t.Errorf("%s at %d in flight: greedy output differs from plain", s.name, conc)
			}
			acc := ""
			if st.SpecDraftTokens > 0 {
				acc = fmt.Sprintf(", acceptance %.2f, acceptance length %.2f, %d drafts", float64(st.SpecAccepted)/float64(st.SpecDraftTokens), 1+float64(st.SpecAccepted)/float64(st.SpecDrafts), st.SpecDrafts)
			}
			t.Logf("%d in flight, %-15s %s tok/s, ×%.2f%s", conc, s.name+":", spread(rates[i], "%.1f"), median(rates[i])/median(rates[0]), acc)
		}
	}
	_ = strings.TrimSpace
}
