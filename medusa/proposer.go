package medusa

import (
	"fmt"
	"slices"

	"pagoda/spec"
)

// ProposerOptions tune a Proposer.
type ProposerOptions struct {
	// Nodes caps the static tree at its first Nodes nodes (0: all of it);
	// Req.Max caps it further per request.
	Nodes int
}

// Proposer drafts Medusa's static tree for each sequence from the newest
// feature the engine handed it: node i gets the rank-Rank[i] token of its
// head's top-k. Drafts are deterministic (Probs stays empty), siblings
// are distinct ranks of one head, so distinct tokens. One goroutine calls
// it; buffers are reused across calls.
type Proposer struct {
	h    *Heads
	tree Tree
	// ranks[k] is how many top ranks of head k the tree reads.
	ranks []int
	seqs  map[int32]*seqFeat
	scr   *scratch
	cand  [][]int32
	need  []int
	keep  []int32 // the tree's nodes a request gets, in order
	remap []int32 // a tree node's index among them, or -1
}

// seqFeat is a sequence's newest feature: the hidden state at pos.
type seqFeat struct {
	pos int
	x   []float32
}

var (
	_ spec.FeatureProposer = (*Proposer)(nil)
	_ spec.TreeShaper      = (*Proposer)(nil)
)

// Proposer makes a proposer drafting h's tree.
func (h *Heads) Proposer(o ProposerOptions) *Proposer {
	t := h.Tree
	if o.Nodes > 0 && o.Nodes < t.Len() {
		t = Tree{Parent: t.Parent[:o.Nodes], Rank: t.Rank[:o.Nodes], depth: t.depth[:o.Nodes]}
	}
	p := &Proposer{h: h, tree: t, seqs: map[int32]*seqFeat{}, scr: h.newScratch(), ranks: make([]int, h.K), need: make([]int, h.K)}
	for range h.K {
		p.cand = append(p.cand, make([]int32, h.TopK))
	}
	return p
}

// FeatureDim is the target's embedding width.
func (p *Proposer) FeatureDim() int { return p.h.D }

// Nodes is the size of the tree drafted when Max allows it.
func (p *Proposer) Nodes() int { return p.tree.Len() }

// Propose drafts each request's tree.
func (p *Proposer) Propose(reqs []*spec.Req) error {
	d := p.h.D
	for _, r := range reqs {
		r.Draft, r.Probs, r.Parent = r.Draft[:0], r.Probs[:0], r.Parent[:0]
		if len(r.Features)%d != 0 {
			return fmt.Errorf("medusa: %d feature values for sequence %d are not rows of %d", len(r.Features), r.ID, d)
		}
		st := p.seqs[r.ID]
		if rows := len(r.Features) / d; rows > 0 {
			if st == nil {
				st = &seqFeat{x: make([]float32, d)}
				p.seqs[r.ID] = st
			}
			copy(st.x, r.Features[(rows-1)*d:])
			st.pos = r.FeatFrom + rows - 1
		}
		if st == nil || st.pos != len(r.Tokens)-2 || r.Max <= 0 {
			continue
		}
		p.draft(r, st.x, p.shape(r))
	}
	return nil
}

// shape picks the nodes request r gets: the tree's first r.Max nodes of
// depth at most r.Depth and rank below r.TopK (whose parents are in:
// parents come first, so the kept nodes are a tree, in order).
func (p *Proposer) shape(r *spec.Req) []int32 {
	t := &p.tree
	p.keep = p.keep[:0]
	p.remap = slices.Grow(p.remap[:0], t.Len())[:t.Len()]
	for i := 0; i < t.Len() && len(p.keep) < r.Max; i++ {
		p.remap[i] = -1
		par := t.Parent[i]
		if (r.Depth > 0 && t.Depth(i) > r.Depth) || (r.TopK > 0 && int(t.Rank[i]) >= r.TopK) || (par >= 0 && p.remap[par] < 0) {
			continue
		}
		p.remap[i] = int32(len(p.keep))
		p.keep = append(p.keep, int32(i))
	}
	return p.keep
}

// TreeShape is the tree's widest rank and depth.
func (p *Proposer) TreeShape() (topK, depth int) {
	for i := range p.tree.Len() {
		topK, depth = max(topK, int(p.tree.Rank[i])+1), max(depth, p.tree.Depth(i))
	}
	return topK, depth
}

// draft fills r with the tree's nodes keep, computing only the heads and
// ranks they read.
func (p *Proposer) draft(r *spec.Req, x []float32, keep []int32) {
	h, t := p.h, &p.tree
	clear(p.need)
	for _, i := range keep {
		k := t.Depth(int(i)) - 1
		p.need[k] = max(p.need[k], int(t.Rank[i])+1)
	}
	for k, nr := range p.need {
		if nr == 0 {
			continue
		}
		h.resid(k, x, p.scr.z, p.scr.r)
		h.logits(k, p.scr.r, p.scr.logits)
		topKIdx(p.scr.logits, p.cand[k][:nr])
	}
	for _, i := range keep {
		par := t.Parent[i]
		if par >= 0 {
			par = p.remap[par]
		}
		r.Draft = append(r.Draft, p.cand[t.Depth(int(i))-1][t.Rank[i]])
		r.Parent = append(r.Parent, par)
	}
}

// Truncate drops a feature whose position the target no longer keeps.
func (p *Proposer) Truncate(id int32, n int) {
	if st := p.seqs[id]; st != nil && st.pos >= n {
		st.pos = -1
	}
}

// Free forgets sequence id.
func (p *Proposer) Free(id int32) { delete(p.seqs, id) }
