package model

import "sort"

// pieceRows caps the queries of one Attend call: enough for a prefill
// chunk to read each K/V page once for many queries, few enough that a
// long chunk still splits into pieces the pool can balance.
const pieceRows = 16

// attnPiece is a run of batch rows [lo, hi) of one sequence at consecutive
// positions, and its cost in attended positions.
type attnPiece struct{ lo, hi, cost int }

// attend stores the K/V rows of every batch token for layer li and then runs
// attention for every token, writing att (T × NHead·HeadDim). It is the one
// place the forward pass touches the KV cache: the layer blocks produce q, k
// and v (biases, norms and RoPE applied) and consume att.
//
// Every token's K/V is stored before any token attends, so a prefill chunk
// sees itself causally through the cache. The runs attended are the ones
// Forward split the batch into (m.buf.pieces).
func (m *Model) attend(li int, b *Batch, kv KVCache, q, k, v, att []float32, ap AttnParams) {
	T := len(b.Tokens)
	qd, kvd := ap.NHead*ap.HeadDim, ap.NKVHead*ap.HeadDim
	// A pipeline stage's KV storage holds only its own layers.
	li -= m.stage.Lo
	for i := 0; i < T; i++ {
		kv.Store(li, i, k[i*kvd:(i+1)*kvd], v[i*kvd:(i+1)*kvd])
	}
	pieces := m.buf.pieces
	if ha, ok := kv.(headAttender); ok && len(pieces) < m.pool.Threads() && ap.NKVHead > 1 && headParallel(ha, li, pieces) {
		m.attendHeads(ha, li, pieces, q, att, ap)
		return
	}
	run := func(lo, hi int) {
		for _, p := range pieces[lo:hi] {
			kv.Attend(li, p.lo, p.hi, q[p.lo*qd:p.hi*qd], att[p.lo*qd:p.hi*qd], ap)
		}
	}
	if pa, ok := kv.(interface{ ParallelAttend() bool }); ok && pa.ParallelAttend() && len(pieces) > 1 {
		m.pool.For(len(pieces), 1, run)
	} else {
		run(0, len(pieces))
	}
}

// headAttender is a KV cache that can attend a range of KV heads alone.
type headAttender interface {
	AttendHeads(layer, lo, hi, kh0, kh1 int, q, out []float32, p AttnParams)
	HeadParallel(layer, row int) bool
}

func headParallel(ha headAttender, li int, pieces []attnPiece) bool {
	for _, p := range pieces {
		if !ha.HeadParallel(li, p.lo) {
			return false
		}
	}
	return true
}

// attendHeads runs the pieces split by KV head across the pool: with
// fewer pieces than threads (a decode step of one or a few sequences)
// the pieces alone would leave threads idle while the longest context is
// read on one core.
func (m *Model) attendHeads(ha headAttender, li int, pieces []attnPiece, q, att []float32, ap AttnParams) {
	qd, nh := ap.NHead*ap.HeadDim, ap.NKVHead
	m.pool.For(len(pieces)*nh, 1, func(lo, hi int) {
		for t := lo; t < hi; {
			p := pieces[t/nh]
			kh1 := min(hi-t/nh*nh, nh)
			ha.AttendHeads(li, p.lo, p.hi, t%nh, kh1, q[p.lo*qd:p.hi*qd], att[p.lo*qd:p.hi*qd], ap)
			t += kh1 - t%nh
		}
	})
}

// attnPieces splits the batch into runs of one sequence at consecutive
// positions, at most pieceRows rows each, ordered cheap, dear, next
// cheapest, next dearest, … so the pool's contiguous ranges of pieces
// carry about equal work (short and long causal rows paired, as for
// single rows).
func attnPieces(b *Batch, window int) []attnPiece {
	var ps []attnPiece
	cost := func(i int) int {
		if window > 0 {
			return min(int(b.Pos[i])+1, window)
		}
		return int(b.Pos[i]) + 1
	}
	for lo := 0; lo < len(b.Pos); {
		hi, c := lo+1, cost(lo)
		for hi < len(b.Pos) && hi-lo < pieceRows && b.Seq[hi] == b.Seq[lo] && b.Pos[hi] == b.Pos[hi-1]+1 {
			c += cost(hi)
			hi++
		}
		ps = append(ps, attnPiece{lo, hi, c})
		lo = hi
	}
	if len(ps) < 3 {
		return ps
	}
	sort.SliceStable(ps, func(i, j int) bool { return ps[i].cost < ps[j].cost })
	out := make([]attnPiece, 0, len(ps))
	for i, j := 0, len(ps)-1; i <= j; i, j = i+1, j-1 {
		out = append(out, ps[i])
		if i != j {
			out = append(out, ps[j])
		}
	}
	return out
}
