package medusa

import (
	"fmt"

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
}

// seqFeat is a sequence's newest feature: the hidden state at pos.
type seqFeat struct {
	pos int
	x   []float32
}

var _ spec.FeatureProposer = (*Proposer)(nil)

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
		n := min(r.Max, p.tree.Len())
		if st == nil || st.pos != len(r.Tokens)-2 || n <= 0 {
			continue
		}
		p.draft(r, st.x, n)
	}
	return nil
}

// draft fills r with the first n nodes of the tree, computing only the
// heads and ranks they read.
func (p *Proposer) draft(r *spec.Req, x []float32, n int) {
	h, t := p.h, &p.tree
	clear(p.need)
	for i := range n {
		k := t.Depth(i) - 1
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
	for i := range n {
		r.Draft = append(r.Draft, p.cand[t.Depth(i)-1][t.Rank[i]])
		r.Parent = append(r.Parent, t.Parent[i])
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
