package eagle

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"pagoda/model"
	"pagoda/spec"
)

// checkTree asserts what the engine relies on: a valid tree of at most
// max nodes, siblings with distinct tokens, no probabilities.
func checkTree(t *testing.T, r *spec.Req, max int) {
	t.Helper()
	if len(r.Draft) > max {
		t.Fatalf("%d nodes for a budget of %d", len(r.Draft), max)
	}
	if len(r.Parent) != len(r.Draft) {
		t.Fatalf("%d parents for %d nodes", len(r.Parent), len(r.Draft))
	}
	if err := spec.CheckTree(r.Parent, len(r.Draft)); err != nil {
		t.Fatal(err)
	}
	seen := map[[2]int32]bool{}
	for i, p := range r.Parent {
		k := [2]int32{p, r.Draft[i]}
		if seen[k] {
			t.Fatalf("node %d repeats token %d under parent %d", i, r.Draft[i], p)
		}
		seen[k] = true
	}
	if len(r.Probs) != 0 {
		t.Fatal("EAGLE drafts are deterministic: Probs must stay empty")
	}
}

func sampleOne(t *testing.T, m *model.Model, n int, seed uint64) *Data {
	t.Helper()
	data, err := Sample(context.Background(), m, 1, n, 1, seed, nil)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func propose(t *testing.T, p *Proposer, id int32, toks []int32, feats []float32, from, max int) *spec.Req {
	t.Helper()
	r := &spec.Req{ID: id, Tokens: toks, Max: max, Features: feats, FeatFrom: from}
	if err := p.Propose([]*spec.Req{r}); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestProposerTree: trees are valid under any budget, the budget and the
// top-k bound the node count, and a sequence fed in pieces, truncated and
// re-fed drafts exactly what a fresh proposer given the same tokens and
// features at once drafts; Free forgets.
func TestProposerTree(t *testing.T) {
	d := randomDraft(t, 7)
	m := d.target
	dd := d.Shape.D
	data := sampleOne(t, m, 40, 3)
	seq, f := data.Seqs[0], data.Feats[0]
	o := ProposerOptions{TopK: 3, Depth: 4}
	p := d.Proposer(o)
	for _, max := range []int{1, 2, 7, 30, 1000000} {
		r := propose(t, p, int32(max), seq[:20], f[:19*dd], 0, max)
		checkTree(t, r, max)
		want := min(max, 3+3*3*3)
		if len(r.Draft) != want {
			t.Errorf("budget %d: %d nodes, want %d", max, len(r.Draft), want)
		}
	}
	if r := propose(t, p, 99, seq[:20], f[:19*dd], 0, 0); len(r.Draft) != 0 {
		t.Errorf("a budget of 0 drafted %d nodes", len(r.Draft))
	}

	// Fed in pieces as decoding goes: features up to len-2 each time.
	q := d.Proposer(o)
	propose(t, q, 1, seq[:10], f[:9*dd], 0, 16)
	propose(t, q, 1, seq[:15], f[9*dd:14*dd], 9, 16)
	// A verification kept only 12 tokens, then the target recomputed from
	// position 11 with new tokens: the sequence continues differently.
	q.Truncate(1, 12)
	alt := append(slices.Clone(seq[:12]), seq[30:36]...)
	altF, err := Features(m, alt)
	if err != nil {
		t.Fatal(err)
	}
	got := propose(t, q, 1, alt, altF[11*dd:(len(alt)-1)*dd], 11, 16)
	fresh := propose(t, d.Proposer(o), 1, alt, altF[:(len(alt)-1)*dd], 0, 16)
	if fmt.Sprint(got.Draft, got.Parent) != fmt.Sprint(fresh.Draft, fresh.Parent) {
		t.Errorf("after truncate and re-feed: %v %v; fresh: %v %v", got.Draft, got.Parent, fresh.Draft, fresh.Parent)
	}
	checkTree(t, got, 16)
	// No new features but the state is current: the same tree again.
	again := propose(t, q, 1, alt, nil, 0, 16)
	if fmt.Sprint(again.Draft) != fmt.Sprint(got.Draft) {
		t.Errorf("re-proposing without new features changed the tree: %v, then %v", got.Draft, again.Draft)
	}
	// Truncated to tokens whose features it has: the last row is run
	// again, and the tree is a fresh proposer's.
	q.Truncate(1, 14)
	got = propose(t, q, 1, alt[:14], nil, 0, 16)
	fresh = propose(t, d.Proposer(o), 1, alt[:14], altF[:13*dd], 0, 16)
	if len(got.Draft) == 0 || fmt.Sprint(got.Draft, got.Parent) != fmt.Sprint(fresh.Draft, fresh.Parent) {
		t.Errorf("after truncating to 14 tokens: %v %v; fresh: %v %v", got.Draft, got.Parent, fresh.Draft, fresh.Parent)
	}
	// Truncated further than the features it was given reach: no draft.
	q.Truncate(1, 6)
	if r := propose(t, q, 1, alt[:9], nil, 0, 16); len(r.Draft) != 0 {
		t.Errorf("drafted %v without the features of tokens 6..7", r.Draft)
	}
	q.Free(1)
	if _, ok := q.seqs[1]; ok {
		t.Error("Free kept the sequence's state")
	}
	// A gap in the features (the first call starts mid-sequence, after a
	// prefix-cache hit): the draft restarts at the gap, and drafts what it
	// drafts for the sequence that starts there (attention sees relative
	// positions only).
	gap := propose(t, q, 2, seq[:20], f[10*dd:19*dd], 10, 16)
	suffix := propose(t, d.Proposer(o), 2, seq[10:20], f[10*dd:19*dd], 0, 16)
	if len(gap.Draft) == 0 || fmt.Sprint(gap.Draft, gap.Parent) != fmt.Sprint(suffix.Draft, suffix.Parent) {
		t.Errorf("after a gap: %v %v; the suffix alone: %v %v", gap.Draft, gap.Parent, suffix.Draft, suffix.Parent)
	}
	checkTree(t, gap, 16)
	// Decoding goes on after the gap: features of the new tokens only.
	next := propose(t, q, 2, seq[:23], f[19*dd:22*dd], 19, 16)
	nextSuffix := propose(t, d.Proposer(o), 2, seq[10:23], f[10*dd:22*dd], 0, 16)
	if fmt.Sprint(next.Draft, next.Parent) != fmt.Sprint(nextSuffix.Draft, nextSuffix.Parent) {
		t.Errorf("decoding after a gap: %v; the suffix alone: %v", next.Draft, nextSuffix.Draft)
	}
	// Truncated below the gap: nothing is left, and features from the
	// start (a recompute after preemption) give a fresh proposer's tree.
	freshAll := func(t *testing.T) *spec.Req { return propose(t, d.Proposer(o), 2, seq[:20], f[:19*dd], 0, 16) }
	q.Truncate(2, 8)
	if r := propose(t, q, 2, seq[:8], nil, 0, 16); len(r.Draft) != 0 {
		t.Errorf("drafted %v with no features left", r.Draft)
	}
	// Features from before the gap without a truncation (a recompute from
	// the start): the draft restarts from them.
	propose(t, q, 4, seq[:20], f[10*dd:19*dd], 10, 16)
	if r := propose(t, q, 4, seq[:20], f[:19*dd], 0, 16); fmt.Sprint(r.Draft, r.Parent) != fmt.Sprint(freshAll(t).Draft, freshAll(t).Parent) {
		t.Errorf("features from the start after a gap: %v", r.Draft)
	}
	re := propose(t, q, 2, seq[:20], f[:19*dd], 0, 16)
	if fresh2 := freshAll(t); fmt.Sprint(re.Draft, re.Parent) != fmt.Sprint(fresh2.Draft, fresh2.Parent) {
		t.Errorf("refed from the start: %v; fresh: %v", re.Draft, fresh2.Draft)
	}
	if err := q.Propose([]*spec.Req{{ID: 3, Tokens: seq[:5], Max: 4, Features: f[:3]}}); err == nil {
		t.Error("features that are not whole rows were accepted")
	}
}

// TestProposerShape: a request's TopK and Depth shrink the tree (the
// engine's controller picks them per load): TopK 1 drafts a chain of
// Depth nodes, the top path of the full tree's root; the full shape is
// the proposer's own tree.
func TestProposerShape(t *testing.T) {
	d := randomDraft(t, 7)
	dd := d.Shape.D
	data := sampleOne(t, d.target, 30, 5)
	seq, f := data.Seqs[0], data.Feats[0]
	p := d.Proposer(ProposerOptions{TopK: 3, Depth: 4})
	if k, dep := p.TreeShape(); k != 3 || dep != 4 {
		t.Fatalf("TreeShape %d, %d", k, dep)
	}
	shaped := func(max, k, dep int) *spec.Req {
		r := &spec.Req{ID: 1, Tokens: seq[:20], Max: max, Features: f[:19*dd], TopK: k, Depth: dep}
		if err := d.Proposer(ProposerOptions{TopK: 3, Depth: 4}).Propose([]*spec.Req{r}); err != nil {
			t.Fatal(err)
		}
		checkTree(t, r, max)
		return r
	}
	full := shaped(64, 0, 0)
	if same := shaped(64, 3, 4); fmt.Sprint(same.Draft, same.Parent) != fmt.Sprint(full.Draft, full.Parent) {
		t.Errorf("the proposer's own shape asked explicitly: %v %v, else %v %v", same.Draft, same.Parent, full.Draft, full.Parent)
	}
	chain := shaped(64, 1, 3)
	if !spec.Chain(chain.Parent) || len(chain.Draft) != 3 || chain.Draft[0] != full.Draft[0] {
		t.Errorf("top-1, depth 3: %v %v (full tree's first node %d)", chain.Draft, chain.Parent, full.Draft[0])
	}
	small := shaped(64, 2, 2)
	if len(small.Draft) != 2+2*2 {
		t.Errorf("top-2, depth 2: %d nodes, want 6", len(small.Draft))
	}
	for i, par := range small.Parent {
		if par >= 0 && small.Parent[par] >= 0 {
			t.Errorf("top-2, depth 2: node %d at depth 3", i)
		}
	}
}
