package engine

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"pagoda/eagle"
	"pagoda/kvcache"
	"pagoda/sample"
	"pagoda/spec"
	"pagoda/testutil"
	"pagoda/tokenizer"
)

// treeOracle proposes random trees around reference continuations: at
// each level 1–3 sibling candidates, the true next token (when the
// sequence follows a reference) among them with probability alpha and
// at a random sibling index, so accepted paths wander off the first
// branch and must be compacted; wrong siblings grow subtrees too. With
// probs, siblings are drawn from random distributions q given in Probs
// (duplicates allowed), for SpecInfer's multi-draft rule.
type treeOracle struct {
	refs  [][]int32
	alpha float64
	probs bool
	rng   *rand.Rand
	feats int // feature rows received (a FeatureProposer when dim > 0)
	dim   int
	seen  map[int32]int // per sequence, the position its next features start at
	gaps  int
	// chains: every third sequence gets a chain rather than a tree.
	chains bool
}

func newTreeOracle(refs [][]int32, alpha float64, probs bool, seed uint64) *treeOracle {
	return &treeOracle{refs: refs, alpha: alpha, probs: probs, rng: rand.New(rand.NewPCG(seed, 77)), seen: map[int32]int{}}
}

func (o *treeOracle) ref(toks []int32) []int32 {
	for _, ref := range o.refs {
		if len(ref) > len(toks) && slices.Equal(ref[:len(toks)], toks) {
			return ref[len(toks):]
		}
	}
	return nil
}

func (o *treeOracle) Propose(reqs []*spec.Req) error {
	for _, r := range reqs {
		if o.dim > 0 {
			o.feats += len(r.Features) / o.dim
			if r.FeatFrom != o.seen[r.ID] && r.FeatFrom > o.seen[r.ID] {
				o.gaps++
			}
			o.seen[r.ID] = r.FeatFrom + len(r.Features)/o.dim
			if len(r.Features) > 0 && o.seen[r.ID] != len(r.Tokens)-1 {
				return fmt.Errorf("features end at %d, the sequence's computed tokens at %d", o.seen[r.ID], len(r.Tokens)-1)
			}
		}
		cont := o.ref(r.Tokens)
		if o.chains && r.ID%3 == 0 {
			// A chain for some sequences: trees and chains in one step.
			for i := 0; i < r.Max && i < len(cont); i++ {
				r.Draft = append(r.Draft, cont[i])
			}
			continue
		}
		type node struct {
			parent, depth int32
			onPath        bool
		}
		var nodes []node
		frontier := []node{{parent: -1, depth: 0, onPath: cont != nil}}
		idx := []int32{-1}
		for len(frontier) > 0 && len(r.Draft) < r.Max {
			f, at := frontier[0], idx[0]
			frontier, idx = frontier[1:], idx[1:]
			k := 1 + o.rng.IntN(3)
			truth := -1
			// With q, every sibling must be a draw from q (the rule's
			// premise): no planted truth.
			if !o.probs && f.onPath && int(f.depth) < len(cont) && o.rng.Float64() < o.alpha {
				truth = o.rng.IntN(k)
			}
			var used []int32
			var q []float32
			if o.probs {
				q = randDist(o.rng)
			}
			for c := 0; c < k && len(r.Draft) < r.Max; c++ {
				var tok int32
				switch {
				case c == truth:
					tok = cont[f.depth]
				case o.probs:
					tok = spec.Draw(q, o.rng.Float64())
				default:
					for tok = 3 + o.rng.Int32N(fakeVocab-3); slices.Contains(used, tok) || (f.onPath && int(f.depth) < len(cont) && tok == cont[f.depth]); {
						tok = 3 + o.rng.Int32N(fakeVocab-3)
					}
				}
				used = append(used, tok)
				if o.probs {
					r.Probs = append(r.Probs, q...)
				}
				r.Draft = append(r.Draft, tok)
				r.Parent = append(r.Parent, at)
				n := node{parent: at, depth: f.depth + 1, onPath: c == truth}
				nodes = append(nodes, n)
				if c == truth || o.rng.Float64() < 0.3 || (o.probs && o.rng.Float64() < 0.5) {
					frontier, idx = append(frontier, n), append(idx, int32(len(r.Draft)-1))
				}
			}
		}
	}
	return nil
}

func (o *treeOracle) Truncate(int32, int) {}
func (o *treeOracle) Free(id int32)       { delete(o.seen, id) }

// featOracle is the tree oracle as a FeatureProposer.
type featOracle struct{ *treeOracle }

func (f featOracle) FeatureDim() int { return f.dim }

func randDist(rng *rand.Rand) []float32 {
	q := make([]float32, fakeVocab)
	for i := range q {
		q[i] = float32(math.Exp(2 * rng.NormFloat64()))
	}
	normalize(q)
	return q
}

func normalize(q []float32) {
	var s float32
	for _, v := range q {
		s += v
	}
	for i := range q {
		q[i] /= s
	}
}

// TestTreeGreedyIdentical: greedy output with tree drafts (accepted paths
// off the first branch, so compacted by slot moves) is token for token
// the output without speculation, solo and under concurrent load with
// chunked prefill, prefix hits and preemption; likewise where trees are
// not allowed (first branches as chains) and with a FeatureProposer
// reading hidden states; no block leaks.
func TestTreeGreedyIdentical(t *testing.T) {
	reqs := specWorkload(11, 18)
	want := reference(t, reqs)
	refs := refsOf(reqs, want)
	for _, tc := range []string{"tree", "first-branch", "features"} {
		t.Run(tc, func(t *testing.T) {
			for _, load := range []string{"solo", "concurrent"} {
				o := newTreeOracle(refs, 0.8, false, 3)
				var p spec.Proposer = o
				if tc == "features" {
					o.dim = 16
					p = featOracle{o}
				}
				cfg := fakeConfig()
				cfg.Spec = SpecConfig{Proposer: p, Tokens: 10, Fixed: true}
				cfg.KVBlocks = 64
				if load == "concurrent" {
					cfg.KVBlocks, cfg.BlockSize, cfg.MaxNumBatchedTokens = 16, 8, 48
				}
				e, err := New(&fakeModel{check: true}, newFakeTok(), cfg)
				if err != nil {
					t.Fatal(err)
				}
				e.trees = tc != "first-branch"
				e.Start()
				got := runLoad(t, e, reqs, load)
				e.Stop(context.Background())
				for i := range reqs {
					if fmt.Sprint(got[i].tokens, got[i].finish) != fmt.Sprint(want[i].tokens, want[i].finish) {
						t.Fatalf("%s request %d: %v %v, without speculation %v %v", load, i, got[i].tokens, got[i].finish, want[i].tokens, want[i].finish)
					}
				}
				mustNoLeak(t, e)
				st := e.Stats()
				t.Logf("%s: steps %d, preemptions %d, verifications %d, nodes %d, accepted %d, feature rows %d",
					load, st.Steps, st.Preemptions, st.SpecDrafts, st.SpecDraftTokens, st.SpecAccepted, o.feats)
				if st.SpecAccepted < st.SpecDrafts/2 || st.SpecAccepted == st.SpecDraftTokens {
					t.Errorf("%s: %d of %d nodes accepted in %d verifications: the test exercises too little", load, st.SpecAccepted, st.SpecDraftTokens, st.SpecDrafts)
				}
				if load == "concurrent" && st.Preemptions == 0 {
					t.Errorf("no preemption under load")
				}
				// Gaps come from prefix-cache hits (positions never
				// computed), not from lost rows: each call's rows end at
				// the newest computed position (checked in Propose).
				if tc == "features" && o.feats < int(st.GenerationTokens) {
					t.Errorf("%d feature rows for %d generated tokens", o.feats, st.GenerationTokens)
				}
			}
		})
	}
}

// TestTreeDistribution is the exactness test for trees: the first tokens
// sampled at temperature 1 (and with top-p) through tree drafts have the
// target's distribution by a chi-square test, with distinct one-hot
// siblings (one draw per level) and with siblings drawn from random q
// (SpecInfer's rule); keeping every accepted-by-q draft (a wrong rule)
// fails it.
func TestTreeDistribution(t *testing.T) {
	if testing.Short() {
		t.Skip("thousands of sampled requests")
	}
	const n, positions = 3000, 4
	prompt := []int32{4, 9, 13, 6}
	for _, sp := range []sample.Params{{Temperature: 1}, {Temperature: 1, TopP: 0.9}} {
		cfg := fakeConfig()
		cfg.KVBlocks = 256
		cfg.MaxWaiting = 4096
		plain := startEngine(t, &fakeModel{}, cfg)
		ref := sampleMany(t, plain, prompt, sp, n, positions, 1)
		want := tokenStats(ref, positions)
		refs := refsOf([]*Request{{Prompt: prompt}}, ref[:1])
		for _, probs := range []bool{false, true} {
			for _, wrong := range []bool{false, true} {
				if wrong && !probs {
					continue // the one-hot walk does not use the acceptance test
				}
				cfg.Spec = SpecConfig{Proposer: newTreeOracle(refs, 0.7, probs, 5), Tokens: 8, Fixed: true}
				e := startEngine(t, &fakeModel{}, cfg)
				if wrong {
					e.accept = func(p, q []float32, x int32, u float64) bool { return true }
				}
				got := tokenStats(sampleMany(t, e, prompt, sp, n, positions, 1<<40), positions)
				minP := 1.0
				for i := range got {
					x2, df, pv := chiSquare(got[i], want[i])
					t.Logf("top-p %v q %v wrong %v: position %d: χ² %.1f, df %d, p %.3g", sp.TopP, probs, wrong, i, x2, df, pv)
					minP = min(minP, pv)
				}
				st := e.Stats()
				t.Logf("accepted %d of %d nodes in %d verifications", st.SpecAccepted, st.SpecDraftTokens, st.SpecDrafts)
				if !wrong && minP < 0.0002 {
					t.Errorf("top-p %v q %v: tree speculation changed the distribution (p = %.3g)", sp.TopP, probs, minP)
				}
				if wrong && minP > 1e-6 {
					t.Errorf("top-p %v: the wrong rule passed (p = %.3g): the test has no power", sp.TopP, minP)
				}
				if st.SpecAccepted == 0 {
					t.Errorf("no node accepted")
				}
				e.Stop(context.Background())
				mustNoLeak(t, e)
			}
		}
	}
}

// TestTreeCancelPreemptNoLeak: trees, chains and plain requests (opted
// out) in one batch, greedy and sampled, cancelled at random points under
// a KV pool small enough to preempt, with a proposer reading features:
// every block comes back.
func TestTreeCancelPreemptNoLeak(t *testing.T) {
	reqs := specWorkload(7, 24)
	o := newTreeOracle(refsOf(reqs, reference(t, reqs)), 0.8, false, 9)
	o.chains, o.dim = true, 16
	cfg := fakeConfig()
	cfg.KVBlocks, cfg.BlockSize, cfg.MaxNumBatchedTokens = 12, 8, 48
	cfg.Spec = SpecConfig{Proposer: featOracle{o}, Tokens: 8, Fixed: true}
	e := startEngine(t, &fakeModel{check: true}, cfg)
	for i, r := range reqs {
		r.MaxTokens += 20
		switch i % 4 {
		case 1:
			r.Sampling = sample.Params{Temperature: 1, Seed: uint64(i), HasSeed: true}
		case 2:
			r.SpecTokens = -1
		}
	}
	submitCancelling(t, e, reqs, 8)
	if err := e.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	st := e.Stats()
	if st.Preemptions == 0 || st.SpecAccepted == 0 {
		t.Fatalf("preemptions %d, accepted %d: the load did not exercise both", st.Preemptions, st.SpecAccepted)
	}
	mustNoLeak(t, e)
}

// TestTreeStoriesGreedy: on the real model (RoPE by depth, the tree mask
// over paged f32 and f16 KV, slot moves of real K/V rows, hidden states
// from the model), greedy output with tree drafts is the output without
// speculation, solo and batched under preemption.
func TestTreeStoriesGreedy(t *testing.T) {
	m := openStories(t)
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
	var want []result
	for _, r := range reqs {
		want = append(want, run(t, ea, r))
	}
	ea.Stop(context.Background())
	for _, dt := range []kvcache.DType{kvcache.F32, kvcache.F16} {
		for _, load := range []string{"solo", "concurrent"} {
			o := newTreeOracle(refsOf(reqs, want), 0.75, false, 21)
			o.dim = m.Config.NEmbd
			cfg := modelConfig(m)
			cfg.KVDType = dt
			cfg.Spec = SpecConfig{Proposer: featOracle{o}, Tokens: 12, Fixed: true}
			cfg.KVBlocks = 64
			if load == "concurrent" {
				cfg.KVBlocks, cfg.BlockSize, cfg.MaxNumBatchedTokens = 12, 8, 40
			}
			e, err := New(m, tok, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if !e.trees {
				t.Fatalf("%v: trees not allowed", dt)
			}
			e.Start()
			got := runLoad(t, e, reqs, load)
			e.Stop(context.Background())
			for i := range reqs {
				if fmt.Sprint(got[i].tokens, got[i].text) != fmt.Sprint(want[i].tokens, want[i].text) {
					t.Fatalf("%v %s request %d: %v, without speculation %v", dt, load, i, got[i].tokens, want[i].tokens)
				}
			}
			mustNoLeak(t, e)
			st := e.Stats()
			t.Logf("%v %s: steps %d, preemptions %d, accepted %d of %d nodes in %d verifications, feature rows %d",
				dt, load, st.Steps, st.Preemptions, st.SpecAccepted, st.SpecDraftTokens, st.SpecDrafts, o.feats)
			if st.SpecAccepted < st.SpecDrafts || (load == "concurrent" && st.Preemptions == 0) || o.feats == 0 {
				t.Errorf("%v %s: accepted %d in %d verifications, preemptions %d, feature rows %d", dt, load, st.SpecAccepted, st.SpecDrafts, st.Preemptions, o.feats)
			}
		}
	}
}

// shapeRecorder is an EAGLE proposer that records the tree budgets it is
// asked for and checks that each tree it returns keeps to them.
type shapeRecorder struct {
	*eagle.Proposer
	seen map[[3]int]int // {Max, TopK, Depth} → proposals
	bad  error
}

func (r *shapeRecorder) Propose(reqs []*spec.Req) error {
	err := r.Proposer.Propose(reqs)
	for _, q := range reqs {
		if q.Max == 0 {
			continue
		}
		r.seen[[3]int{q.Max, q.TopK, q.Depth}]++
		depth, kids := make([]int, len(q.Draft)), map[int32]int{}
		for i, p := range q.Parent {
			depth[i] = 1
			if p >= 0 {
				depth[i] = depth[p] + 1
			}
			kids[p]++
			if len(q.Draft) > q.Max || (q.Depth > 0 && depth[i] > q.Depth) || (q.TopK > 0 && kids[p] > q.TopK) {
				r.bad = fmt.Errorf("a tree of %d nodes (parents %v) for max %d, top-%d, depth %d", len(q.Draft), q.Parent, q.Max, q.TopK, q.Depth)
			}
		}
	}
	return err
}

// TestTreeCtlEagleGreedy: stories260K with its trained EAGLE draft, the
// controller switching windows every two steps so that it runs several
// rungs of its tree ladder (the tree shrinking and growing from step to
// step; which ones depends on the measured speeds): greedy output is token for token the output without
// speculation, solo and batched, each tree keeps to the budget asked,
// and no block leaks.
func TestTreeCtlEagleGreedy(t *testing.T) {
	m := openStories(t)
	tok := m.Tokenizer()
	d, err := eagle.Load("../models/stories260K.eagle.gguf", m, testutil.Shared(t, "models/gguf/stories260K.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	texts := []string{"Once upon a time", "The cat sat on the mat.", "Lily and Ben went to the park. They saw a big dog", "One day", "Tom had a red ball."}
	var reqs []*Request
	for i, s := range texts {
		reqs = append(reqs, &Request{ID: fmt.Sprint(i), Prompt: tok.Encode(s, tokenizer.Options{AddSpecial: true}), MaxTokens: 60 + 8*i, IgnoreEOS: true})
	}
	plain := modelConfig(m)
	plain.KVBlocks = 64
	ep, err := New(m, tok, plain)
	if err != nil {
		t.Fatal(err)
	}
	ep.Start()
	var want []result
	for _, r := range reqs {
		want = append(want, run(t, ep, r))
	}
	ep.Stop(context.Background())
	for _, load := range []string{"solo", "concurrent"} {
		rec := &shapeRecorder{Proposer: d.Proposer(eagle.ProposerOptions{TopK: 4, Depth: 5}), seen: map[[3]int]int{}}
		cfg := modelConfig(m)
		cfg.KVBlocks = 64
		cfg.Spec = SpecConfig{Proposer: rec, Tokens: 16, Control: SpecControl{Window: 2, ProbeEvery: 2, Explore: 1}}
		e, err := New(m, tok, cfg)
		if err != nil {
			t.Fatal(err)
		}
		// Trials of every rung, whatever the cost model predicts on this
		// machine: the test is about the trees switching, not the choice.
		e.ctl = newSpecCtl(cfg.Spec.Control, ladderFor(rec, e.trees, e.specMax), e.specMax)
		e.ctl.ungated = true
		e.Start()
		got := runLoad(t, e, reqs, load)
		e.Stop(context.Background())
		for i := range reqs {
			if fmt.Sprint(got[i].tokens) != fmt.Sprint(want[i].tokens) {
				t.Fatalf("%s request %d: %v, without speculation %v", load, i, got[i].tokens, want[i].tokens)
			}
		}
		mustNoLeak(t, e)
		if rec.bad != nil {
			t.Fatal(rec.bad)
		}
		c := e.ctl
		rungs := 0
		for a := armSpec; a < c.arms; a++ {
			if c.byArm[a] > 0 {
				rungs++
			}
		}
		st := e.Stats()
		t.Logf("%s: ladder %v, measured steps by arm %v; budgets asked %v; accepted %d of %d nodes in %d verifications",
			load, c.ladder, c.byArm[:c.arms], rec.seen, st.SpecAccepted, st.SpecDraftTokens, st.SpecDrafts)
		if len(c.ladder) != 5 || rungs < 2 || len(rec.seen) < 3 || st.SpecAccepted == 0 {
			t.Errorf("%s: the controller ran %d rungs of %v, asked %d budgets, accepted %d", load, rungs, c.ladder, len(rec.seen), st.SpecAccepted)
		}
	}
}
