package medusa

import (
	"fmt"
	"testing"

	"pagoda/model"
	"pagoda/spec"
)

// shipped are the head files trained here (docs/medusa.md), each with
// the floor on how often its tree's root children hold the target's
// greedy next token (measured 62% for stories260K, 55% for kjv3m).
var shipped = []struct {
	name, heads, target string
	floor               float64
}{
	{"stories260K", "../models/stories260K.medusa.gguf", "", 0.5},
	{"kjv3m", "../models/kjv3m.medusa.gguf", "../models/kjv3m.q8_0.gguf", 0.45},
}

// checkDraft checks that r's draft is a valid tree of at most max nodes
// with distinct sibling tokens and deterministic drafts.
func checkDraft(t *testing.T, r *spec.Req, max int) {
	t.Helper()
	if len(r.Draft) > max {
		t.Fatalf("%d nodes for Max %d", len(r.Draft), max)
	}
	if len(r.Probs) != 0 {
		t.Fatalf("%d probabilities for deterministic drafts", len(r.Probs))
	}
	if err := spec.CheckTree(r.Parent, len(r.Draft)); err != nil {
		t.Fatal(err)
	}
	if len(r.Draft) > 0 && len(r.Parent) != len(r.Draft) {
		t.Fatalf("%d parents for %d nodes", len(r.Parent), len(r.Draft))
	}
	seen := map[[2]int32]bool{}
	for i, p := range r.Parent {
		key := [2]int32{p, r.Draft[i]}
		if seen[key] {
			t.Fatalf("node %d repeats token %d under parent %d", i, r.Draft[i], p)
		}
		seen[key] = true
	}
}

// TestProposerTrained drives the proposer with the shipped stories260K
// heads over held-out target samples the way the engine does (each step
// the features computed since the previous), checks every draft is a
// valid tree, and measures how often the root's children hold the
// target's actual greedy next token.
func TestProposerTrained(t *testing.T) {
	for _, sh := range shipped {
		t.Run(sh.name, func(t *testing.T) {
			path := sh.target
			if path == "" {
				path = storiesPath(t)
			}
			proposerHits(t, path, sh.heads, sh.floor)
		})
	}
}

func proposerHits(t *testing.T, path, heads string, floor float64) {
	m := openTarget(t, path)
	h, err := Load(heads, m, path)
	if err != nil {
		t.Fatal(err)
	}
	if h.Info.Top1[0] <= h.Info.UnigramTop1 {
		t.Errorf("recorded head-1 top-1 %.3f does not beat the unigram baseline %.3f", h.Info.Top1[0], h.Info.UnigramTop1)
	}
	p := h.Proposer(ProposerOptions{})
	d := sampleData(t, m, 6, 160, 90000)
	c := m.Config
	hits, n, maxes := 0, 0, []int{1, 3, 8, 1000}
	for s, seq := range d.Seqs {
		T := len(seq)
		pos, sq, marks := make([]int32, T), make([]int32, T), make([]bool, T)
		for i := range pos {
			pos[i], marks[i] = int32(i), true
		}
		logits, err := m.Forward(&model.Batch{Tokens: seq, Pos: pos, Seq: sq, Logits: marks}, model.NewFlatCache(&c, 1, T))
		if err != nil {
			t.Fatal(err)
		}
		id := int32(s)
		r := &spec.Req{ID: id}
		for tt := 0; tt+2 < T; tt++ {
			mx := maxes[tt%len(maxes)]
			r.Tokens, r.Max = seq[:tt+2], mx
			r.Features, r.FeatFrom = d.Feats[s][tt*c.NEmbd:(tt+1)*c.NEmbd], tt
			if err := p.Propose([]*spec.Req{r}); err != nil {
				t.Fatal(err)
			}
			checkDraft(t, r, mx)
			if want := min(mx, p.Nodes()); len(r.Draft) != want {
				t.Fatalf("%d nodes drafted, want %d", len(r.Draft), want)
			}
			row := logits[(tt+1)*c.VocabSize : (tt+2)*c.VocabSize]
			greedy := int32(0)
			for v, x := range row {
				if x > row[greedy] {
					greedy = int32(v)
				}
			}
			if mx < 8 {
				continue
			}
			n++
			for i, tok := range r.Draft {
				if r.Parent[i] == -1 && tok == greedy {
					hits++
				}
			}
		}
		p.Free(id)
	}
	rate := float64(hits) / float64(n)
	t.Logf("root children (tree of %d) hold the target's greedy next token at %d of %d positions: %.1f%%", p.Nodes(), hits, n, 100*rate)
	if rate < floor {
		t.Errorf("greedy next token among the root's children %.1f%% of the time, want ≥ %.0f%%", 100*rate, 100*floor)
	}
}

// TestProposerState checks the per-sequence bookkeeping: a draft needs
// the feature of position len−2; a rollback past it or Free drops it; a
// width mismatch is an error; Max 0 drafts nothing.
func TestProposerState(t *testing.T) {
	h := randHeads(t, 3, 4, 11, false, 9)
	h.TopK, h.RankAcc = 4, []float64{0.5, 0.3, 0.1, 0.05, 0.4, 0.2, 0.1, 0.05, 0.3, 0.1, 0.1, 0.1}
	var err error
	if h.Tree, err = BuildTree(h.RankAcc, 3, 4, 20); err != nil {
		t.Fatal(err)
	}
	p := h.Proposer(ProposerOptions{Nodes: 7})
	if p.Nodes() != 7 || p.FeatureDim() != 4 {
		t.Fatalf("nodes %d, dim %d", p.Nodes(), p.FeatureDim())
	}
	feats := []float32{1, 2, 3, 4, 0.5, -1, 2, 0}
	toks := []int32{1, 2, 3}
	r := &spec.Req{ID: 5, Tokens: toks, Max: 100, Features: feats, FeatFrom: 0}
	if err := p.Propose([]*spec.Req{r}); err != nil {
		t.Fatal(err)
	}
	checkDraft(t, r, 7)
	if len(r.Draft) != 7 {
		t.Fatalf("%d nodes, want 7", len(r.Draft))
	}
	first := append([]int32(nil), r.Draft...)
	// No new features: the stored one (position 1 = len−2) still serves.
	r.Features = nil
	if err := p.Propose([]*spec.Req{r}); err != nil || len(r.Draft) != 7 {
		t.Fatalf("draft from the stored feature: %v, %v", r.Draft, err)
	}
	for i := range first {
		if first[i] != r.Draft[i] {
			t.Fatalf("the stored feature drafts %v, the fresh one %v", r.Draft, first)
		}
	}
	// A longer sequence without its feature: nothing to predict from.
	r.Tokens = []int32{1, 2, 3, 4}
	if p.Propose([]*spec.Req{r}); len(r.Draft) != 0 {
		t.Errorf("drafted %v without the newest feature", r.Draft)
	}
	r.Tokens = toks
	p.Truncate(5, 2) // keeps positions 0, 1: the feature at 1 stays
	if p.Propose([]*spec.Req{r}); len(r.Draft) != 7 {
		t.Errorf("truncation that keeps the feature's position dropped it")
	}
	p.Truncate(5, 1)
	if p.Propose([]*spec.Req{r}); len(r.Draft) != 0 {
		t.Errorf("drafted %v from a rolled-back feature", r.Draft)
	}
	r.Features, r.FeatFrom = feats, 0
	p.Propose([]*spec.Req{r})
	p.Free(5)
	r.Features = nil
	if p.Propose([]*spec.Req{r}); len(r.Draft) != 0 {
		t.Errorf("drafted %v for a freed sequence", r.Draft)
	}
	r.Features, r.Max = feats, 0
	if p.Propose([]*spec.Req{r}); len(r.Draft) != 0 {
		t.Errorf("drafted %v with Max 0", r.Draft)
	}
	r.Features = feats[:5]
	if err := p.Propose([]*spec.Req{r}); err == nil {
		t.Error("features of the wrong width accepted")
	}
}

// TestProposerShape: a request's TopK and Depth keep the tree's nodes of
// rank below TopK and depth at most Depth (and whose parents are kept),
// in the tree's order, re-indexed; TopK 1 is the top-rank chain.
func TestProposerShape(t *testing.T) {
	h := randHeads(t, 3, 4, 11, false, 9)
	h.TopK, h.RankAcc = 4, []float64{0.5, 0.3, 0.1, 0.05, 0.4, 0.2, 0.1, 0.05, 0.3, 0.1, 0.1, 0.1}
	var err error
	if h.Tree, err = BuildTree(h.RankAcc, 3, 4, 20); err != nil {
		t.Fatal(err)
	}
	p := h.Proposer(ProposerOptions{})
	k, depth := p.TreeShape()
	if k < 2 || depth != 3 {
		t.Fatalf("TreeShape %d, %d for a 20-node tree of 3 heads", k, depth)
	}
	feats := []float32{1, 2, 3, 4, 0.5, -1, 2, 0}
	propose := func(max, k, d int) *spec.Req {
		r := &spec.Req{ID: 5, Tokens: []int32{1, 2, 3}, Max: max, Features: feats, TopK: k, Depth: d}
		if err := p.Propose([]*spec.Req{r}); err != nil {
			t.Fatal(err)
		}
		checkDraft(t, r, max)
		return r
	}
	full := propose(100, 0, 0)
	// The kept nodes by the tree's own test, mapped to tokens by path.
	path := func(r *spec.Req, i int) string {
		s := ""
		for ; i >= 0; i = int(r.Parent[i]) {
			s = fmt.Sprint(r.Draft[i], ".", s)
		}
		return s
	}
	for _, c := range [][3]int{{100, 1, 0}, {100, 2, 2}, {5, 0, 2}, {100, 0, 1}} {
		r := propose(c[0], c[1], c[2])
		var want []string
		for i := range h.Tree.Len() {
			ok := (c[1] == 0 || int(h.Tree.Rank[i]) < c[1]) && (c[2] == 0 || h.Tree.Depth(i) <= c[2])
			for j := int(h.Tree.Parent[i]); ok && j >= 0; j = int(h.Tree.Parent[j]) {
				ok = (c[1] == 0 || int(h.Tree.Rank[j]) < c[1]) && (c[2] == 0 || h.Tree.Depth(j) <= c[2])
			}
			if ok && len(want) < c[0] {
				want = append(want, path(full, i))
			}
		}
		var got []string
		for i := range r.Draft {
			got = append(got, path(r, i))
		}
		if fmt.Sprint(got) != fmt.Sprint(want) || len(got) == 0 {
			t.Errorf("max %d, top-%d, depth %d: paths %v, want %v", c[0], c[1], c[2], got, want)
		}
		if c[1] == 1 && !spec.Chain(r.Parent) {
			t.Errorf("top-1: not a chain: %v", r.Parent)
		}
	}
}
