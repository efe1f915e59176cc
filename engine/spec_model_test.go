package engine

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"pagoda/convert"
	"pagoda/kvcache"
	"pagoda/model"
	"pagoda/quant"
	"pagoda/sample"
	"pagoda/spec"
	"pagoda/testutil"
	"pagoda/tokenizer"
)

// quantizedStories writes a Q4_0 copy of stories260K (a deliberately
// different draft from the same vocabulary) and opens it.
func quantizedStories(t *testing.T) *model.Model {
	t.Helper()
	out := filepath.Join(t.TempDir(), "stories260K-q4_0.gguf")
	err := convert.Quantize(testutil.Shared(t, "models/gguf/stories260K.gguf"), out,
		convert.QuantizeOptions{Type: quant.Q4_0, Mix: "pure", Threads: 2, Warn: func(string) {}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.Open(out, model.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func storiesDraft(t *testing.T, target, draft *model.Model, pmin float32) *spec.Draft {
	t.Helper()
	d, err := spec.NewDraft(draft, target.Tokenizer().Vocab(), spec.DraftOptions{TargetVocab: target.Config.VocabSize, KVBlocks: 256, PMin: pmin})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestSpecStoriesGreedy: on the real model, greedy output with the draft
// model and with n-gram drafts is token-identical to output without, solo
// and batched under preemption.
func TestSpecStoriesGreedy(t *testing.T) {
	m := openStories(t)
	dm := quantizedStories(t)
	tok := m.Tokenizer()
	texts := []string{"Once upon a time", "The cat sat on the mat. The cat sat on the", "Lily and Ben went to the park. They saw a big dog", "One day", "Tom had a red ball. Tom had a red ball. Tom"}
	var reqs []*Request
	for i, s := range texts {
		reqs = append(reqs, &Request{ID: fmt.Sprint(i), Prompt: tok.Encode(s, tokenizer.Options{AddSpecial: true}), MaxTokens: 24 + 4*i, IgnoreEOS: i%2 == 0})
	}
	alone := modelConfig(m)
	alone.KVBlocks = 64
	ea, err := New(m, tok, alone)
	if err != nil {
		t.Fatal(err)
	}
	ea.Start()
	want := runAll(t, ea, reqs[:1])
	for _, r := range reqs[1:] {
		want = append(want, run(t, ea, r))
	}
	ea.Stop(context.Background())
	ng, _ := spec.NewNGram(1, 3)
	for _, p := range []spec.Proposer{ng, storiesDraft(t, m, dm, 0)} {
		for _, load := range []string{"solo", "concurrent"} {
			cfg := modelConfig(m)
			cfg.Spec = SpecConfig{Proposer: p, Tokens: 4, Fixed: true}
			if load == "concurrent" {
				cfg.KVBlocks, cfg.BlockSize, cfg.MaxNumBatchedTokens = 10, 8, 24
			} else {
				cfg.KVBlocks = 64
			}
			e, err := New(m, tok, cfg)
			if err != nil {
				t.Fatal(err)
			}
			e.Start()
			got := runLoad(t, e, reqs, load)
			e.Stop(context.Background())
			for i := range reqs {
				if fmt.Sprint(got[i].tokens, got[i].text) != fmt.Sprint(want[i].tokens, want[i].text) {
					t.Fatalf("%T %s request %d: %v, without speculation %v", p, load, i, got[i].tokens, want[i].tokens)
				}
			}
			mustNoLeak(t, e)
			if d, ok := p.(*spec.Draft); ok {
				mustNoLeakKV(t, d)
			}
			st := e.Stats()
			t.Logf("%T %s: steps %d, preemptions %d, accepted %d of %d drafts", p, load, st.Steps, st.Preemptions, st.SpecAccepted, st.SpecDraftTokens)
			if st.SpecAccepted == 0 || (load == "concurrent" && st.Preemptions == 0) {
				t.Errorf("%s: accepted %d, preemptions %d", load, st.SpecAccepted, st.Preemptions)
			}
		}
	}
}

// TestSpecStoriesDistribution is the exactness test on the real model:
// stories260K as target, its Q4_0 copy as draft, temperature 1 (and top-p
// 0.9): the first tokens of many seeded samples are distributed as
// without speculation (chi-square, per position and for a pair), and the
// same test rejects a wrong acceptance rule (keep every draft).
func TestSpecStoriesDistribution(t *testing.T) {
	if testing.Short() {
		t.Skip("samples thousands of completions")
	}
	m := openStories(t)
	dm := quantizedStories(t)
	tok := m.Tokenizer()
	prompt := tok.Encode("Once upon a time, there was a", tokenizer.Options{AddSpecial: true})
	const n, positions = 2000, 4
	for _, sp := range []sample.Params{{Temperature: 1}, {Temperature: 1, TopP: 0.9}} {
		cfg := modelConfig(m)
		cfg.KVBlocks, cfg.MaxNumSeqs, cfg.MaxWaiting = 512, 128, 4096
		plain, err := New(m, tok, cfg)
		if err != nil {
			t.Fatal(err)
		}
		plain.Start()
		want := tokenStats(sampleMany(t, plain, prompt, sp, n, positions, 1), positions)
		plain.Stop(context.Background())
		for _, wrong := range []bool{false, true} {
			cfg.Spec = SpecConfig{Proposer: storiesDraft(t, m, dm, 0), Tokens: 3, Fixed: true}
			e, err := New(m, tok, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if wrong {
				e.accept = func(p, q []float32, x int32, u float64) bool { return true }
			}
			e.Start()
			got := tokenStats(sampleMany(t, e, prompt, sp, n, positions, 1<<40), positions)
			e.Stop(context.Background())
			minP := 1.0
			for i := range got {
				x2, df, pv := chiSquare(got[i], want[i])
				t.Logf("top-p %v wrong rule %v: position %d: χ² %.1f, df %d, p %.3g", sp.TopP, wrong, i, x2, df, pv)
				minP = min(minP, pv)
			}
			st := e.Stats()
			t.Logf("accepted %d of %d drafts", st.SpecAccepted, st.SpecDraftTokens)
			if !wrong && minP < 0.0002 {
				t.Errorf("top-p %v: speculation changed the distribution (p = %.3g)", sp.TopP, minP)
			}
			if wrong && minP > 1e-4 {
				t.Errorf("top-p %v: the wrong rule passed (p = %.3g): the test has no power", sp.TopP, minP)
			}
			mustNoLeak(t, e)
		}
	}
}

// TestSpecMLAAndMoEDraft: an MLA (latent-only cache) and a MoE model each
// draft for themselves through the draft proposer's own paged cache; the
// greedy output equals the flat reference, and the drafts are accepted.
func TestSpecMLAAndMoEDraft(t *testing.T) {
	dir := testutil.Shared(t, "golden")
	for _, name := range []string{"g-deepseek2.F32.gguf", "g-qwen2moe.F32.gguf"} {
		t.Run(name, func(t *testing.T) {
			m, err := model.Open(filepath.Join(dir, "models", name), model.Options{Threads: 2})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			d, err := spec.NewDraft(m, m.Tokenizer().Vocab(), spec.DraftOptions{TargetVocab: m.Config.VocabSize, KVBlocks: 64, BlockSize: 8, KVDType: kvcache.F32})
			if err != nil {
				t.Fatal(err)
			}
			cfg := ModelConfig(m, name)
			cfg.KVDType, cfg.BlockSize, cfg.KVBlocks = kvcache.F32, 8, 64
			cfg.Spec = SpecConfig{Proposer: d, Tokens: 3, Fixed: true}
			e, err := New(m, m.Tokenizer(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			e.Start()
			p := []int32{1, 45, 67, 89, 120, 33, 250, 17}
			got := run(t, e, &Request{Prompt: p, MaxTokens: 12, IgnoreEOS: true})
			e.Stop(context.Background())
			if want := flatGreedy(t, m, p, 12); fmt.Sprint(want) != fmt.Sprint(got.tokens[0]) {
				t.Fatalf("speculative %v, flat reference %v", got.tokens[0], want)
			}
			if st := e.Stats(); st.SpecAccepted == 0 {
				t.Fatalf("no draft accepted (%d drafted)", st.SpecDraftTokens)
			}
			mustNoLeak(t, e)
			mustNoLeakKV(t, d)
		})
	}
}
