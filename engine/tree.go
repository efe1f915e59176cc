package engine

import (
	"math/rand/v2"

	"pagoda/sample"
	"pagoda/spec"
)

// Speculation trees (Medusa's static tree, EAGLE-2's dynamic one): a
// proposer may answer with a tree of candidates (spec.Req.Parent) instead
// of a chain. The step stores the nodes at consecutive KV positions after
// the sequence, rotates each by its depth (StepInput.Rope), and lets each
// attend the sequence and its own ancestors only (the plan's spans, from
// kvcache.Cache.Plan with the rows' tree parents). Verification walks the
// tree from the root; the accepted path's K/V rows are then copied into
// the positions right after the sequence (StepInput.Moves, applied before
// the next step's forward pass) and the rest is truncated before the
// blocks are hashed, so a chain is just the one-branch tree.

// ask fills the proposal request for s, which may carry up to max drafts
// (0: none this step; a FeatureProposer still reads its features).
func (ss *seqSpec) ask(s *sequence, max int, smp *sample.Sampler, dim int) *spec.Req {
	q := &ss.req
	q.ID, q.Tokens, q.Max, q.Sampler = s.id, s.tokens, max, smp
	q.TopK, q.Depth = 0, 0
	q.Draft, q.Probs, q.Parent = q.Draft[:0], q.Probs[:0], q.Parent[:0]
	q.Features, q.FeatFrom = nil, 0
	if dim > 0 {
		q.Features, q.FeatFrom = ss.feats, ss.featFrom
	}
	return q
}

// consumed marks the features handed over by the last ask as read.
func (ss *seqSpec) consumed(dim int) {
	if dim > 0 && ss.req.Features != nil {
		ss.featFrom += len(ss.req.Features) / dim
		ss.feats = ss.feats[:0]
	}
	ss.req.Features = nil
}

// takeDraft installs the proposal of s's last ask as its drafts: a chain,
// or a tree where trees are allowed (otherwise its first branch, each
// node's first child). An invalid tree is dropped.
func (s *sequence) takeDraft(trees bool) {
	ss := s.spec
	q := &ss.req
	defer func() { q.Tokens = nil }()
	if q.Tokens == nil || len(q.Draft) == 0 || len(q.Draft) > q.Max {
		return
	}
	if spec.CheckTree(q.Parent, len(q.Draft)) != nil {
		return
	}
	s.draft, s.parent, ss.probs = q.Draft, nil, q.Probs
	if spec.Chain(q.Parent) {
		return
	}
	if trees {
		s.parent = q.Parent
		return
	}
	// The first branch: node 0, then each kept node's first child.
	n, last := 0, int32(-1)
	for i, p := range q.Parent {
		if p != last {
			continue
		}
		q.Draft[n] = q.Draft[i]
		if len(ss.probs) > 0 {
			V := len(ss.probs) / len(q.Parent)
			copy(ss.probs[n*V:(n+1)*V], ss.probs[i*V:(i+1)*V])
		}
		last = int32(i)
		n++
	}
	s.draft = q.Draft[:n]
	if len(ss.probs) > 0 {
		ss.probs = ss.probs[:n*len(ss.probs)/len(q.Parent)]
	}
}

// treeRows writes, for a step with trees, each row's rotary position and
// its tree parent row (-1 for rows that attend as the policy says).
func treeRows(p *plan, rope, par []int32) ([]int32, []int32) {
	rope, par = rope[:0], par[:0]
	var depth []int32
	row := int32(0)
	for i := range p.seqs {
		w := &p.seqs[i]
		lead := w.n - len(w.draft) // the sequence's own tokens, the root last
		for j := range lead {
			rope = append(rope, int32(w.start+j))
			par = append(par, -1)
		}
		root := int32(w.start + lead - 1)
		depth = depth[:0]
		for k := range w.draft {
			pk, d := int32(-1), int32(1)
			if w.parent != nil {
				pk = w.parent[k]
			} else {
				pk = int32(k) - 1
			}
			if pk >= 0 {
				d = depth[pk] + 1
			}
			depth = append(depth, d)
			rope = append(rope, root+d)
			par = append(par, row+int32(lead)+pk) // pk = -1: the root's row
		}
		row += int32(w.n)
	}
	return rope, par
}

// treeMoves appends the slot moves that compact each verified tree's
// accepted path into the positions after its sequence: node path[j],
// stored at the tree's k-th position, goes to its j-th. slots is
// the step's slot mapping. Moves run in path order, and path[j] ≥ j, so
// no move reads a slot an earlier one wrote.
func (p *plan) treeMoves(res []outcome, slots, moves []int32) []int32 {
	row := 0
	for i := range p.seqs {
		w := &p.seqs[i]
		if w.parent != nil && !w.seq.finished {
			first := row + w.n - len(w.draft)
			for j, k := range res[i].path {
				if int(k) != j {
					moves = append(moves, slots[first+int(k)], slots[first+j])
				}
			}
		}
		row += w.n
	}
	return moves
}

// children appends the nodes that follow node k (-1: the root) of w's
// drafts: for a chain the one next node.
func (w *scheduled) children(k int32, dst []int32) []int32 {
	if w.parent == nil {
		if int(k)+1 < len(w.draft) {
			dst = append(dst, k+1)
		}
		return dst
	}
	for i := k + 1; int(i) < len(w.parent); i++ {
		if w.parent[i] == k {
			dst = append(dst, i)
		}
	}
	return dst
}

// picker draws the target's token at one node of a verification walk.
type picker struct {
	kids  []int32
	resid []float32
}

// pick draws the token that follows node (-1: the root) of w's drafts
// from its logits row lg, and the child it accepts (-1: none; leaf: the
// node has no children, so the token is a bonus).
//
// With one-hot drafts (q empty: n-gram, greedy or top-k tree drafting,
// siblings distinct) it draws y from p as without speculation and follows
// the child whose token is y: the sequential rule below with one-hot q
// accepts child j with p'(x_j), p' being p without the siblings rejected
// before it, which is exactly the chance that y = x_j given y is none of
// them, so one draw decides the whole level and a seeded or greedy
// request yields the tokens it yields without speculation. With q rows
// (SpecInfer's multi-draft rule, Leviathan/Chen's for one child): child
// j, drawn from q_j, is kept with probability min(1, p'(x_j)/q_j(x_j)),
// else p' becomes normalise(max(0, p' − q_j)); after the last rejection
// the token is drawn from the residual.
func (pk *picker) pick(w *scheduled, ps probSampler, q []float32, V int, lg []float32, hist []int32, node int32,
	rng *rand.Rand, accept func(p, q []float32, x int32, u float64) bool) (tok, next int32, leaf bool) {
	kids := w.children(node, pk.kids[:0])
	pk.kids = kids
	if len(kids) == 0 {
		return ps.Sample(lg, hist), -1, true
	}
	if len(q) == 0 {
		tok = ps.Sample(lg, hist)
		for _, k := range kids {
			if w.draft[k] == tok {
				return tok, k, false
			}
		}
		return tok, -1, false
	}
	_, p := ps.SampleProbs(lg, hist)
	for i, k := range kids {
		qk, x := q[int(k)*V:int(k+1)*V], w.draft[k]
		if accept(p, qk, x, rng.Float64()) {
			return x, k, false
		}
		if i == len(kids)-1 {
			return spec.Residual(p, qk, rng.Float64()), -1, false
		}
		pk.resid = spec.Deplete(pk.resid, p, qk)
		p = pk.resid
	}
	panic("unreachable")
}
