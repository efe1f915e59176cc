package eagle

import (
	"context"
	"testing"

	"pagoda/generate"
	"pagoda/model"
	"pagoda/sample"
	"pagoda/spec"
	"pagoda/testutil"
)

// shipped loads a committed draft: for stories260K, or for the KJV model
// when kjv.
func shipped(t *testing.T, kjv bool) (*Draft, *model.Model) {
	t.Helper()
	p, side := "../models/kjv3m.q8_0.gguf", "../models/kjv3m.eagle.gguf"
	if !kjv {
		p, side = testutil.Shared(t, "models/gguf/stories260K.gguf"), "../models/stories260K.eagle.gguf"
	}
	m, err := model.Open(p, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	d, err := Load(side, m, p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d, m
}

// TestShippedDraftAccuracy: on fresh held-out samples of the target (a
// seed training never used) the shipped draft's depth-1 agreement with
// the target's greedy token beats always guessing its most frequent
// greedy token, and depth 2 (from the draft's own features) does too.
func TestShippedDraftAccuracy(t *testing.T) {
	d, m := shipped(t, false)
	held, err := Sample(context.Background(), m, 6, 160, 1, 987654321, nil)
	if err != nil {
		t.Fatal(err)
	}
	acc, err := d.DepthAccuracy(held, 3)
	if err != nil {
		t.Fatal(err)
	}
	uni := d.unigram(held, held) // the held-out data's own best constant: generous to the baseline
	t.Logf("depth accuracy %.3f (recorded at training %.3f), unigram %.3f", acc, d.Accuracy, uni)
	if acc[0] <= uni+0.2 || acc[1] <= uni {
		t.Errorf("depth-1 accuracy %.3f, depth-2 %.3f: not above the unigram baseline %.3f", acc[0], acc[1], uni)
	}
}

// TestShippedDraftProposals: on target samples, proposing after each cut
// of the sequence, the root's children hold the target's greedy next
// token at least at a floor rate, and following the target's greedy
// continuation down the tree accepts more than one token per step on
// average (what greedy tree verification would keep, plus the bonus).
func TestShippedDraftProposals(t *testing.T) {
	for _, c := range []struct {
		name            string
		kjv             bool
		rootMin, accMin float64
	}{{"stories260K", false, 0.7, 2}, {"kjv3m", true, 0.8, 3}} {
		t.Run(c.name, func(t *testing.T) {
			d, m := shipped(t, c.kjv)
			rate, mean := proposalRates(t, d, m)
			if rate < c.rootMin {
				t.Errorf("the root's children held the target's greedy token at %.1f%% of cuts, want ≥ %.0f%%", 100*rate, 100*c.rootMin)
			}
			if mean < c.accMin {
				t.Errorf("mean tokens per greedy verification step %.2f, want ≥ %.1f", mean, c.accMin)
			}
		})
	}
}

// proposalRates proposes after cuts of fresh target samples and returns
// how often the root's children hold the target's greedy next token and
// the mean tokens a greedy tree verification would yield (the matched
// path down the tree plus the bonus token).
func proposalRates(t *testing.T, d *Draft, m *model.Model) (rate, mean float64) {
	dd := d.Shape.D
	data, err := Sample(context.Background(), m, 4, 120, 1, 55555, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := d.Proposer(ProposerOptions{TopK: 4, Depth: 5})
	rootHits, cuts, accepted := 0, 0, 0
	for si, seq := range data.Seqs {
		f := data.Feats[si]
		for L := 8; L < len(seq); L += 7 {
			r := &spec.Req{ID: int32(si), Tokens: seq[:L], Max: 32, Features: f[:(L-1)*dd]}
			if err := p.Propose([]*spec.Req{r}); err != nil {
				t.Fatal(err)
			}
			checkTree(t, r, 32)
			p.Free(int32(si))
			greedy := greedyContinuation(t, m, seq[:L], 5)
			cuts++
			at, depth := int32(-1), 0
			for _, g := range greedy {
				next := int32(-1)
				for i, par := range r.Parent {
					if par == at && r.Draft[i] == g {
						next = int32(i)
					}
				}
				if next < 0 {
					break
				}
				if depth == 0 {
					rootHits++
				}
				at, depth = next, depth+1
			}
			accepted += depth
		}
	}
	rate = float64(rootHits) / float64(cuts)
	mean = 1 + float64(accepted)/float64(cuts)
	t.Logf("%d cuts: greedy next token among the root's children %.1f%%; mean tokens per greedy verification %.2f", cuts, 100*rate, mean)
	return rate, mean
}

func greedyContinuation(t *testing.T, m *model.Model, prompt []int32, n int) []int32 {
	t.Helper()
	res, err := generate.Generate(context.Background(), m, m.Tokenizer(), prompt,
		generate.Options{MaxTokens: n, IgnoreEOS: true, Sampling: sample.Params{Temperature: 0}},
		func(generate.Token) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	return res.Tokens
}

// TestTrainImproves: a short training run from scratch beats both its own
// initialization and the unigram baseline at depth 1, and its loss falls.
func TestTrainImproves(t *testing.T) {
	if testing.Short() {
		t.Skip("trains a draft")
	}
	m, p := openStories(t)
	data, err := Sample(context.Background(), m, 24, 96, 1, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	held, err := Sample(context.Background(), m, 4, 96, 1, 1<<40, nil)
	if err != nil {
		t.Fatal(err)
	}
	o := DefaultTrainOptions()
	o.Steps, o.Batch, o.Warmup, o.Depths, o.Threads = 80, 6, 10, 2, 1
	res, err := Train(m, p, data, held, o)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Draft.Close()
	first, last := res.Hist[0].Loss, res.Hist[len(res.Hist)-1].Loss
	t.Logf("loss %.3f → %.3f; depth accuracy %.3f, unigram %.3f", first, last, res.Accuracy, res.Unigram)
	if last >= 0.7*first {
		t.Errorf("loss went from %.3f to %.3f", first, last)
	}
	if res.Accuracy[0] <= res.Unigram {
		t.Errorf("depth-1 accuracy %.3f does not beat the unigram baseline %.3f", res.Accuracy[0], res.Unigram)
	}
}
