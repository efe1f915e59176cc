package kvcache

import (
	"math"
	"slices"
	"sync/atomic"
)

// Per-head eviction (H2O, SnapKV) and the shared block table.
//
// Decision: a policy that evicts per KV head keeps a mask per sequence,
// layer and KV head over the sequence's positions, inside the blocks the
// sequence already holds; it does not compact kept tokens into private
// blocks. Blocks stay shared (prefix cache, forks), every head of every
// layer keeps its own choice, and attention skips masked positions (the
// per-head Select of PageSelector), so compute falls with the budget. A
// block returns to the pool only when every layer and head has evicted
// all its positions — with per-head choices, heavy hitters spread over
// the text and few blocks die: memory is not what these policies save
// here. Compaction would save it but rewrites every layer's block table
// per head and takes the compacted blocks out of the prefix cache; it is
// left out. Positions computed after the first eviction depend on when
// steps ended, so their blocks stay out of the prefix cache (Sealer).

// maskSeq is one sequence's state: per layer of the group and KV head, the
// accumulated attention mass of each position (fixed point, so concurrent
// adds from the pool's workers are exact and order-free) and the evicted
// positions.
type maskSeq struct {
	acc    [][]int64 // [li*nkv+kh][pos]
	gone   [][]bool  // [li*nkv+kh][pos]
	n      int       // positions sized
	sealed int       // first position computed after an eviction
	prompt int       // prompt length, when told (SnapKV)
	done   bool      // SnapKV: the prompt's votes are counted
}

// fixOne is 1.0 in the fixed point of maskSeq.acc.
const fixOne = 1 << 30

type maskState struct {
	c       *Cache
	layer   map[int]int // model layer → index in the group
	nl, nkv int
	kd      int
	group   atomic.Int32 // query heads per KV head, learned from Select's queries
	seqs    map[int32]*maskSeq
}

func newMaskState(c *Cache, gi int) *maskState {
	g := &c.groups[gi]
	m := &maskState{c: c, layer: map[int]int{}, nl: len(g.Layers), nkv: g.NKVHead, kd: g.KDim, seqs: map[int32]*maskSeq{}}
	for i, l := range g.Layers {
		m.layer[l] = i
	}
	return m
}

// beginStep sizes the state of every sequence in the step that owns says
// runs this policy to its last position, so Attend's workers only index.
func (m *maskState) beginStep(owns func(int32) bool) {
	st := &m.c.step
	for _, r := range st.rows {
		id := st.seqs[r.seq].id
		if !owns(id) {
			continue
		}
		s := m.seqs[id]
		if s == nil {
			s = &maskSeq{sealed: math.MaxInt, acc: make([][]int64, m.nl*m.nkv), gone: make([][]bool, m.nl*m.nkv)}
			m.seqs[id] = s
		}
		if need := int(r.pos) + 1; need > s.n {
			n := max(need, 2*s.n)
			for i := range s.acc {
				s.acc[i] = append(s.acc[i], make([]int64, n-len(s.acc[i]))...)
				s.gone[i] = append(s.gone[i], make([]bool, n-len(s.gone[i]))...)
			}
			s.n = n
		}
	}
}

// observe adds a query head's weights over spans to its KV head's masses.
func (m *maskState) observe(s *maskSeq, layer, head int, spans []Span, w []float32) {
	li, ok := m.layer[layer]
	if !ok || s == nil {
		return
	}
	kh := head / m.groupOf()
	acc := s.acc[li*m.nkv+kh]
	j := 0
	for _, sp := range spans {
		for t := sp.From; t < sp.To; t++ {
			atomic.AddInt64(&acc[t], int64(float64(w[j])*fixOne+0.5))
			j++
		}
	}
}

func (m *maskState) groupOf() int { return max(int(m.group.Load()), 1) }

// selectKept appends the parts of spans that layer's KV head kh has not
// evicted.
func (m *maskState) selectKept(seq int32, layer, kh int, spans, dst []Span) []Span {
	s := m.seqs[seq]
	li, ok := m.layer[layer]
	if s == nil || !ok {
		return append(dst, spans...)
	}
	gone := s.gone[li*m.nkv+kh]
	for _, sp := range spans {
		for t := sp.From; t < sp.To; {
			for t < sp.To && t < len(gone) && gone[t] {
				t++
			}
			if t >= sp.To {
				break
			}
			e := t + 1
			for e < sp.To && (e >= len(gone) || !gone[e]) {
				e++
			}
			dst = append(dst, Span{t, e})
			t = e
		}
	}
	return dst
}

// release appends the full blocks below next that every layer and head
// of seq has wholly evicted.
func (m *maskState) release(seq int32, next, bs int, dst []Span) []Span {
	s := m.seqs[seq]
	if s == nil || s.sealed == math.MaxInt {
		return dst
	}
	for b := 0; (b+1)*bs <= min(next, s.n); b++ {
		dead := true
		for _, g := range s.gone {
			for t := b * bs; t < (b+1)*bs && dead; t++ {
				dead = g[t]
			}
			if !dead {
				break
			}
		}
		if dead {
			if n := len(dst); n > 0 && dst[n-1].To == b {
				dst[n-1].To = b + 1
			} else {
				dst = append(dst, Span{b, b + 1})
			}
		}
	}
	return dst
}

func (m *maskState) truncated(seq int32, n int) {
	s := m.seqs[seq]
	if s == nil {
		return
	}
	if n == 0 {
		delete(m.seqs, seq)
		return
	}
	// Masses the rolled-back queries added to earlier positions stay: an
	// approximation speculative decoding's rollback accepts.
	for i := range s.acc {
		clear(s.acc[i][min(n, s.n):])
		clear(s.gone[i][min(n, s.n):])
	}
	if s.sealed >= n {
		s.sealed = math.MaxInt
	}
}

func (m *maskState) forked(parent, child int32) {
	p := m.seqs[parent]
	if p == nil {
		return
	}
	c := *p
	c.acc, c.gone = make([][]int64, len(p.acc)), make([][]bool, len(p.gone))
	for i := range p.acc {
		c.acc[i] = append([]int64(nil), p.acc[i]...)
		c.gone[i] = append([]bool(nil), p.gone[i]...)
	}
	m.seqs[child] = &c
}

func (m *maskState) sealedAt(seq int32) int {
	if s := m.seqs[seq]; s != nil {
		return s.sealed
	}
	return math.MaxInt
}

// keepTop marks gone every position in cand (ascending) but the keep with
// the highest score (ties: the later position), and reports whether it
// evicted any.
func keepTop(gone []bool, cand []int, score func(t int) int64, keep int, idx []int) bool {
	if len(cand) <= keep {
		return false
	}
	idx = append(idx[:0], cand...)
	// A partial selection sort would do; sizes are a few thousand at most.
	sortByScore(idx, score)
	for _, t := range idx[keep:] {
		gone[t] = true
	}
	return true
}

// sortByScore orders positions by score, highest first, ties to the later.
func sortByScore(idx []int, score func(t int) int64) {
	slices.SortFunc(idx, func(a, b int) int {
		if sa, sb := score(a), score(b); sa != sb {
			if sa > sb {
				return -1
			}
			return 1
		}
		return b - a
	})
}

// learnGroup records the GQA group size from a Select's queries.
func (m *maskState) learnGroup(q []float32) {
	if g := int32(len(q) / m.kd); m.group.Load() != g {
		m.group.Store(g)
	}
}
