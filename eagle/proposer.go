package eagle

import (
	"fmt"
	"math"
	"slices"

	"pagoda/kernels"
	"pagoda/spec"
)

// ProposerOptions shapes EAGLE-2's dynamic tree.
type ProposerOptions struct {
	// TopK is both the children drawn per expanded node and the frontier
	// expanded per step (default 4).
	TopK int
	// Depth is the tree's depth: the longest draft path (default 5).
	Depth int
}

func (o *ProposerOptions) defaults() {
	if o.TopK <= 0 {
		o.TopK = 4
	}
	if o.Depth <= 0 {
		o.Depth = 5
	}
}

// Proposer is the draft as a spec.FeatureProposer. Per sequence it keeps
// the target's features and the draft layer's KV over the known positions
// (row j from x_{j+1} and f_j); a proposal catches the KV up with the new
// features, then grows EAGLE-2's tree: from the root (the draft's
// prediction after the last token) each step expands the TopK frontier
// nodes of highest value — the product of draft probabilities along the
// path — into their TopK most likely children, Depth−1 times, each
// expansion attending the sequence's KV plus its own ancestors; then all
// generated nodes are reranked by value and the best Req.Max kept. A
// node's value is at most its parent's, so that set is a tree (ancestors
// sort first); it is emitted parents first. Drafts are deterministic
// (Req.Probs empty), siblings distinct (a top-k). One goroutine calls it.
type Proposer struct {
	d    *Draft
	w    weights // d's, with Q8_0 matrices
	o    ProposerOptions
	seqs map[int32]*seqState

	p          pass
	tk, tv     []float32 // the tree area: the expanded nodes' K and V rows
	tpar       []int32
	fout       []float32 // the expanded rows' outputs, by tree-area row
	pos, ctx   []int32
	par        []int32
	logits     []float32
	nodes      []node
	front, nxt []int32
	order      []int32
	remap      []int32
	top        []cand
}

type seqState struct {
	feat  []float32 // the target's features by position (nfeat of them)
	nfeat int
	k, v  []float32 // the draft's KV rows by position (n of them)
	n     int
	// lo is the first position the draft has: the features before it
	// were never handed over (a prefix-cache hit computed them in
	// another request), so the draft restarts there and attends its rows
	// from lo on — rotary positions stay absolute, and attention sees
	// relative ones, so the rows are what a sequence starting at lo would
	// give.
	lo   int
	last []float32 // the draft's output at row n−1, when lastOK
	ok   bool
}

// node is a generated draft token: its parent node (-1: the root), depth
// (1: a child of the root), value (log of the path's draft probability),
// the feature row it was predicted from (src: -1 the root's, else a tree
// area row) and, once expanded, its own row.
type node struct {
	tok, parent int32
	depth       int32
	value       float64
	src, row    int32
}

type cand struct {
	tok int32
	lp  float64
}

// Proposer returns a proposer drafting with d.
func (d *Draft) Proposer(o ProposerOptions) *Proposer {
	o.defaults()
	s := d.Shape
	kvd := s.KVHeads * s.HeadDim
	rows := o.TopK * o.Depth
	w, err := d.quantized()
	if err != nil {
		w = d.w // cannot happen for shapes newDraft accepts; float32 then
	}
	return &Proposer{d: d, w: w, o: o, seqs: map[int32]*seqState{},
		tk: make([]float32, rows*kvd), tv: make([]float32, rows*kvd), tpar: make([]int32, rows),
		logits: make([]float32, max(1, o.TopK)*s.Vocab), top: make([]cand, 0, o.TopK)}
}

// TreeShape is the widest and deepest tree it grows: TopK and Depth.
func (p *Proposer) TreeShape() (topK, depth int) { return p.o.TopK, p.o.Depth }

// FeatureDim is the target's NEmbd.
func (p *Proposer) FeatureDim() int { return p.d.Shape.D }

// Truncate drops what depends on tokens from n on: KV row j reads token
// j+1, so rows from n−1 go; features from n go.
func (p *Proposer) Truncate(id int32, n int) {
	st := p.seqs[id]
	if st == nil {
		return
	}
	if n-1 < st.lo {
		delete(p.seqs, id) // nothing left: the next features start it again
		return
	}
	if n-1 < st.n {
		st.n = max(0, n-1)
		st.ok = false
	}
	st.nfeat = min(st.nfeat, max(0, n))
}

// Free forgets sequence id.
func (p *Proposer) Free(id int32) { delete(p.seqs, id) }

// Propose fills each request's tree (Draft, Parent).
func (p *Proposer) Propose(reqs []*spec.Req) error {
	for _, r := range reqs {
		r.Draft, r.Parent, r.Probs = r.Draft[:0], r.Parent[:0], r.Probs[:0]
		if r.Max <= 0 {
			continue
		}
		st, err := p.catchUp(r)
		if err != nil {
			return err
		}
		if st == nil || !st.ok {
			continue
		}
		if err := p.grow(r, st); err != nil {
			return err
		}
	}
	return nil
}

// catchUp stores the request's new features and runs the draft over the
// positions it can now compute; nil when the sequence cannot be drafted
// (features missing).
func (p *Proposer) catchUp(r *spec.Req) (*seqState, error) {
	d, s := p.d, p.d.Shape
	dd, kvd := s.D, s.KVHeads*s.HeadDim
	st := p.seqs[r.ID]
	if st == nil {
		st = &seqState{}
		p.seqs[r.ID] = st
	}
	if len(r.Features)%dd != 0 {
		return nil, fmt.Errorf("eagle: %d feature floats are not rows of %d", len(r.Features), dd)
	}
	if nf := len(r.Features) / dd; nf > 0 {
		if r.FeatFrom < 0 {
			return nil, fmt.Errorf("eagle: features from position %d", r.FeatFrom)
		}
		if r.FeatFrom > st.nfeat || r.FeatFrom < st.lo {
			// A gap: positions whose features were never handed over
			// (a prefix-cache hit), or features from before the gap
			// (a recompute after preemption). The draft restarts there.
			st.lo, st.nfeat, st.n, st.ok = r.FeatFrom, r.FeatFrom, r.FeatFrom, false
		}
		st.nfeat = r.FeatFrom
		if st.n > r.FeatFrom {
			// Rows from FeatFrom on read features now replaced.
			st.n, st.ok = r.FeatFrom, false
		}
		st.feat = growKeep(st.feat, (st.nfeat+nf)*dd)
		copy(st.feat[st.nfeat*dd:], r.Features)
		st.nfeat += nf
	}
	if !st.ok && st.n > st.lo {
		// The last row's KV is kept but not its output, which the tree
		// grows from: run it again.
		st.n--
	}
	end := min(st.nfeat, len(r.Tokens)-1) // rows j < end have f_j and x_{j+1}
	if end > st.n {
		n, from := end-st.n, st.n
		p.p.size(s, n)
		p.pos, p.ctx, p.par = growI(p.pos, n), growI(p.ctx, n), growI(p.par, n)
		for i := range n {
			j := from + i
			p.pos[i], p.ctx[i], p.par[i] = int32(j), int32(from-st.lo), int32(i-1)
			in := p.p.xin[i*2*dd : (i+1)*2*dd]
			if err := d.embed(r.Tokens[j+1], in[:dd]); err != nil {
				return nil, err
			}
			copy(in[dd:], st.feat[j*dd:(j+1)*dd])
		}
		st.k, st.v = growKeep(st.k, end*kvd), growKeep(st.v, end*kvd)
		if n > 1 {
			// Only the last row's output is read (the tree grows from
			// it); the rows before it leave just their K/V, which the
			// layer computes from its input alone: the rest of a row
			// (attention, MLP) is three quarters of its cost.
			d.kvRows(&p.p, &p.w, p.pos, n-1)
			copy(st.k[from*kvd:], p.p.k[:(n-1)*kvd])
			copy(st.v[from*kvd:], p.p.v[:(n-1)*kvd])
			copy(p.p.xin[:2*dd], p.p.xin[(n-1)*2*dd:n*2*dd])
			from, n = end-1, 1
			p.p.size(s, 1)
			p.pos[0], p.ctx[0], p.par[0] = int32(from), int32(from-st.lo), -1
		}
		d.forward(&p.p, &p.w, p.pos[:1], p.ctx[:1], p.par[:1], st.k[st.lo*kvd:], st.v[st.lo*kvd:], p.p.k, p.p.v, 0)
		copy(st.k[from*kvd:], p.p.k[:kvd])
		copy(st.v[from*kvd:], p.p.v[:kvd])
		st.n = end
		st.last = append(st.last[:0], p.p.out[:dd]...)
		st.ok = true
	}
	if st.n != len(r.Tokens)-1 {
		st.ok = false
	}
	return st, nil
}

// grow builds the request's EAGLE-2 tree from st's last output.
func (p *Proposer) grow(r *spec.Req, st *seqState) error {
	d, s := p.d, p.d.Shape
	dd, K, D := s.D, p.o.TopK, p.o.Depth
	if r.TopK > 0 {
		K = min(K, r.TopK)
	}
	if r.Depth > 0 {
		D = min(D, r.Depth)
	}
	p.nodes = p.nodes[:0]
	p.front = p.front[:0]
	p.head(st.last, 1)
	for _, c := range p.topk(p.logits[:s.Vocab], K) {
		p.front = append(p.front, int32(len(p.nodes)))
		p.nodes = append(p.nodes, node{tok: c.tok, parent: -1, depth: 1, value: c.lp, src: -1, row: -1})
	}
	rows := 0
	for depth := 1; depth < D && len(p.front) > 0; depth++ {
		n := len(p.front)
		p.p.size(s, n)
		p.pos, p.ctx = growI(p.pos, n), growI(p.ctx, n)
		for i, ni := range p.front {
			nd := &p.nodes[ni]
			p.pos[i], p.ctx[i] = int32(st.n+depth-1), int32(st.n-st.lo)
			p.tpar[rows+i] = -1
			if nd.parent >= 0 {
				p.tpar[rows+i] = p.nodes[nd.parent].row
			}
			nd.row = int32(rows + i)
			in := p.p.xin[i*2*dd : (i+1)*2*dd]
			if err := d.embed(nd.tok, in[:dd]); err != nil {
				return err
			}
			if nd.src < 0 {
				copy(in[dd:], st.last)
			} else {
				copy(in[dd:], p.feats(nd.src))
			}
		}
		kvd := s.KVHeads * s.HeadDim
		d.forward(&p.p, &p.w, p.pos, p.ctx, p.tpar, st.k[st.lo*kvd:], st.v[st.lo*kvd:], p.tk, p.tv, rows)
		p.keepOut(rows, n)
		p.head(p.p.out, n)
		p.nxt = p.nxt[:0]
		for i, ni := range p.front {
			for _, c := range p.topk(p.logits[i*s.Vocab:(i+1)*s.Vocab], K) {
				p.nxt = append(p.nxt, int32(len(p.nodes)))
				p.nodes = append(p.nodes, node{tok: c.tok, parent: ni, depth: int32(depth + 1),
					value: p.nodes[ni].value + c.lp, src: int32(rows + i), row: -1})
			}
		}
		rows += n
		// The next frontier: the TopK children of highest value.
		slices.SortStableFunc(p.nxt, func(a, b int32) int { return cmpValue(&p.nodes[a], &p.nodes[b]) })
		p.front = append(p.front[:0], p.nxt[:min(K, len(p.nxt))]...)
	}
	p.emit(r)
	return nil
}

// keepOut keeps the expanded rows' outputs: the predicted features their
// children are drafted from.
func (p *Proposer) keepOut(base, n int) {
	dd := p.d.Shape.D
	p.fout = growKeep(p.fout, (base+n)*dd)
	copy(p.fout[base*dd:], p.p.out[:n*dd])
}

func (p *Proposer) feats(row int32) []float32 {
	dd := p.d.Shape.D
	return p.fout[int(row)*dd : int(row+1)*dd]
}

// cmpValue orders nodes by value, higher first, shallower first on ties,
// so that every node sorts after its ancestors.
func cmpValue(a, b *node) int {
	switch {
	case a.value > b.value:
		return -1
	case a.value < b.value:
		return 1
	}
	return int(a.depth - b.depth)
}

// emit keeps the best r.Max nodes and writes them parents first.
func (p *Proposer) emit(r *spec.Req) {
	p.order = p.order[:0]
	for i := range p.nodes {
		p.order = append(p.order, int32(i))
	}
	slices.SortStableFunc(p.order, func(a, b int32) int { return cmpValue(&p.nodes[a], &p.nodes[b]) })
	p.order = p.order[:min(r.Max, len(p.order))]
	slices.SortStableFunc(p.order, func(a, b int32) int {
		if c := int(p.nodes[a].depth - p.nodes[b].depth); c != 0 {
			return c
		}
		return cmpValue(&p.nodes[a], &p.nodes[b])
	})
	p.remap = growI(p.remap, len(p.nodes))
	for i := range p.remap {
		p.remap[i] = -1
	}
	for i, ni := range p.order {
		p.remap[ni] = int32(i)
		nd := &p.nodes[ni]
		par := int32(-1)
		if nd.parent >= 0 {
			par = p.remap[nd.parent]
		}
		r.Draft = append(r.Draft, nd.tok)
		r.Parent = append(r.Parent, par)
	}
}

// head writes the draft's next-token logits of n rows of features x into
// p.logits, through the target's output head as stored.
func (p *Proposer) head(x []float32, n int) {
	s := p.d.Shape
	p.logits = grow(p.logits, n*s.Vocab)
	kernels.MatMul(p.d.pool, p.d.target.W.Output, x[:n*s.D], p.logits[:n*s.Vocab], n)
}

// topk is the K most likely tokens of a logits row with their
// log-probabilities, most likely first; it reuses p.top and leaves row
// softmaxed.
func (p *Proposer) topk(row []float32, K int) []cand {
	top := p.top[:0]
	for t, v := range row {
		if len(top) == K && float64(v) <= top[K-1].lp {
			continue
		}
		c := cand{tok: int32(t), lp: float64(v)}
		if len(top) < K {
			top = append(top, c)
		} else {
			top[K-1] = c
		}
		for i := len(top) - 1; i > 0 && top[i].lp > top[i-1].lp; i-- {
			top[i], top[i-1] = top[i-1], top[i]
		}
	}
	kernels.Softmax(row)
	for i := range top {
		top[i].lp = math.Log(float64(row[top[i].tok]))
		if math.IsNaN(top[i].lp) {
			top[i].lp = math.Inf(-1)
		}
	}
	p.top = top
	return top
}

func growKeep(s []float32, n int) []float32 {
	if cap(s) >= n {
		return s[:n]
	}
	t := make([]float32, n, 2*n)
	copy(t, s)
	return t
}

var (
	_ spec.FeatureProposer = (*Proposer)(nil)
	_ spec.TreeShaper      = (*Proposer)(nil)
)
