// Package ring is sequence parallelism for attention: one long sequence's
// keys and values are split into contiguous slices held by different
// ranks, and attention over all of them is computed from partial results,
// one per slice, merged by the online-softmax rule (FlashAttention's
// rescaling, as Ring Attention applies it across devices).
//
// A partial result for a query row and head is (m, l, acc): the largest
// score seen, the sum of exp(score − m), and Σ exp(score − m)·v. Two
// partials over disjoint key sets merge exactly into the partial over
// their union, in any order, so the ranks' slices may be visited in
// whatever order the ring delivers them. acc / l is the attention output.
//
// The package depends only on the kernels, so the model (the consumer of
// a ring) can use its math without a cycle.
package ring

import (
	"fmt"
	"math"

	"pagoda/kernels"
)

// Shape is the attention of one layer: NHead query heads over NKVHead
// key/value heads of HeadDim values (GQA: query head h reads KV head
// h / (NHead/NKVHead)), scores scaled by Scale. Window > 0 limits a query
// at position p to the keys at (p − Window, p]; 0 is full causal attention.
type Shape struct {
	NHead, NKVHead, HeadDim int
	Scale                   float32
	Window                  int
}

// Check reports a shape the math cannot run.
func (s Shape) Check() error {
	if s.NHead <= 0 || s.NKVHead <= 0 || s.HeadDim <= 0 || s.NHead%s.NKVHead != 0 || s.Window < 0 {
		return fmt.Errorf("ring: attention shape %d heads over %d kv heads of %d (window %d)", s.NHead, s.NKVHead, s.HeadDim, s.Window)
	}
	return nil
}

// QDim is the width of one query (or output) row; KVDim of one key or value row.
func (s Shape) QDim() int  { return s.NHead * s.HeadDim }
func (s Shape) KVDim() int { return s.NKVHead * s.HeadDim }

// Block is a run of consecutive positions of one sequence, Start and on:
// its key and value rows, KVDim floats each, heads interleaved as the
// model produces them.
type Block struct {
	Start int
	K, V  []float32
}

// Len is the number of positions in b for shape s.
func (b Block) Len(s Shape) int { return len(b.K) / s.KVDim() }

// Partial is the running online-softmax state of Rows query rows over the
// keys merged into it so far: M and L per row and head (row-major), Acc
// per row and head (HeadDim values each, the layout of the output).
type Partial struct {
	Shape
	Rows   int
	M, L   []float32
	Acc    []float32
	scores []float32 // scratch
	tmp    []float32
}

// Reset makes p the partial of rows query rows over no keys: m = −∞,
// l = 0, acc = 0. It reuses p's memory.
func (p *Partial) Reset(s Shape, rows int) {
	p.Shape, p.Rows = s, rows
	nh := rows * s.NHead
	p.M, p.L, p.Acc = grow(p.M, nh), grow(p.L, nh), grow(p.Acc, nh*s.HeadDim)
	for i := range p.M {
		p.M[i] = float32(math.Inf(-1))
	}
	clear(p.L)
	clear(p.Acc)
}

// visible is the half-open range of b's rows (of n) that a query at
// position qp may see: causal, less the window.
func (s Shape) visible(qp, start, n int) (lo, hi int) {
	hi = min(n, qp-start+1)
	if s.Window > 0 {
		lo = max(0, qp-s.Window+1-start)
	}
	return lo, max(hi, lo)
}

// Attend merges into p the attention of its query rows q (Rows × QDim,
// at positions qPos) over block b, causally masked by absolute position.
// A row that sees none of b is left as it was, so blocks wholly in a
// row's future cost nothing but the check. ops nil is kernels.Best().
func (p *Partial) Attend(ops *kernels.Ops, q []float32, qPos []int32, b Block) {
	if ops == nil {
		ops = kernels.Best()
	}
	s := p.Shape
	hd, qd, kvd := s.HeadDim, s.QDim(), s.KVDim()
	n, group := b.Len(s), s.NHead/s.NKVHead
	if len(q) != p.Rows*qd || len(qPos) != p.Rows || len(b.V) != len(b.K) || len(b.K) != n*kvd {
		panic(fmt.Sprintf("ring: attend %d query floats at %d positions over %d/%d key/value floats, partial of %d rows × %d", len(q), len(qPos), len(b.K), len(b.V), p.Rows, qd))
	}
	p.scores, p.tmp = grow(p.scores, n), grow(p.tmp, hd)
	for i, pos := range qPos {
		lo, hi := s.visible(int(pos), b.Start, n)
		if lo == hi {
			continue
		}
		for h := 0; h < s.NHead; h++ {
			kh := (h / group) * hd
			sc := p.scores[:hi-lo]
			first, last := lo*kvd+kh, (hi-1)*kvd+kh+hd
			ops.AttnScoresF32(sc, q[i*qd+h*hd:i*qd+(h+1)*hd], b.K[first:last], kvd)
			ops.ScaleF32(sc, s.Scale)
			mb, arg := sc[0], 0
			for t, v := range sc {
				if v > mb {
					mb, arg = v, t
				}
			}
			// Softmax leaves w_t = e_t / Σe with e = exp(score − mb);
			// 1/w_arg recovers Σe (e_arg = 1) without a second exp pass.
			ops.Softmax(sc)
			lb := 1 / sc[arg]
			clear(p.tmp)
			ops.AttnMixF32(p.tmp, sc, b.V[first:last], kvd)
			p.add(i*s.NHead+h, mb, lb, p.tmp, lb)
		}
	}
}

// add merges one row-head's block result into p: a block with max mb,
// sum lb and accumulator acc·accScale.
func (p *Partial) add(rh int, mb, lb float32, acc []float32, accScale float32) {
	hd := p.HeadDim
	dst := p.Acc[rh*hd : (rh+1)*hd]
	m := p.M[rh]
	switch {
	case lb == 0:
		return
	case math.IsInf(float64(m), -1):
		p.M[rh], p.L[rh] = mb, lb
		clear(dst)
		kernels.AxpyF32(dst, accScale, acc)
		return
	}
	nm := max(m, mb)
	alpha := float32(math.Exp(float64(m - nm)))
	beta := float32(math.Exp(float64(mb - nm)))
	if alpha != 1 {
		kernels.ScaleF32(dst, alpha)
	}
	kernels.AxpyF32(dst, beta*accScale, acc)
	p.M[rh], p.L[rh] = nm, p.L[rh]*alpha+beta*lb
}

// Merge adds o, the partial of the same query rows over other keys, into
// p: the result is the partial over both key sets.
func (p *Partial) Merge(o *Partial) error {
	if o.Shape != p.Shape || o.Rows != p.Rows || len(o.M) != len(p.M) || len(o.Acc) != len(p.Acc) {
		return fmt.Errorf("ring: merge a partial of %d rows %+v into one of %d rows %+v", o.Rows, o.Shape, p.Rows, p.Shape)
	}
	hd := p.HeadDim
	for rh := range p.M {
		p.add(rh, o.M[rh], o.L[rh], o.Acc[rh*hd:(rh+1)*hd], 1)
	}
	return nil
}

// Out writes the normalized attention, acc / l, into out (Rows × QDim). A
// row-head that saw no key gets zeros.
func (p *Partial) Out(out []float32) {
	hd := p.HeadDim
	for rh, l := range p.L {
		o := out[rh*hd : (rh+1)*hd]
		if l == 0 {
			clear(o)
			continue
		}
		copy(o, p.Acc[rh*hd:(rh+1)*hd])
		kernels.ScaleF32(o, 1/l)
	}
}

func grow(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}
