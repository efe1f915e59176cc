package kvcache

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
)

// QuestPolicy is Quest (Tang et al., 2024): every full block keeps, per
// layer and KV head, the element-wise minimum and maximum of its keys,
// computed once when a sequence commits the block and shared by every
// sequence that reuses it through the prefix cache. A decode query scores
// each block by the upper bound Σᵢ max(qᵢ·maxᵢ, qᵢ·minᵢ) of q·k over it and
// reads only the top blocks that fit Budget tokens, plus the block it is
// in: attention at long context touches the selected pages only.
//
// The first Dense layers attend everything (the paper's two), and so do
// prompt chunks (a step of more than one row). With GQA a block's score
// for a KV head is the highest bound over the heads of its group. Nothing
// is released: any query may still pick any block.
type QuestPolicy struct {
	Budget int // tokens of full blocks a query reads, besides its own block
	Dense  int // leading layers that attend everything

	st *questState
}

type questState struct {
	c       *Cache
	group   int
	layer   map[int]int // model layer → index into bounds
	nkv, kd int
	// bounds[l] holds, per physical block and KV head, 2·kd floats: the
	// maxima then the minima of the block's keys in layer l.
	bounds [][]float32
	// gen[id] is the count of writes into page id (Storage.written)
	// its bounds were computed after: a prefix hit on a block some
	// sequence of another policy filled, or filled before this instance
	// existed, finds it stale and computes them; a block whose bounds
	// some Quest sequence computed since its last write is reused.
	gen  []uint32
	seqs map[int32]*questSeq
	pool sync.Pool // *questScratch
}

type questSeq struct {
	done   int          // leading blocks whose bounds are computed
	sealed atomic.Int64 // first position a selection dropped keys for
}

type questScratch struct {
	qq          []float32
	score       []float32
	blocks, idx []int
	drop        []bool
}

// NewQuest makes a Quest policy; each cache binds its own copy (Cache.Policy).
func NewQuest(budget, dense int) *QuestPolicy { return &QuestPolicy{Budget: budget, Dense: dense} }

func (p *QuestPolicy) String() string {
	return fmt.Sprintf("quest:budget=%d,dense=%d", p.Budget, p.Dense)
}

// Check implements the configuration check.
func (p *QuestPolicy) Check() error {
	if p.Budget < 1 || p.Dense < 0 {
		return fmt.Errorf("kvcache: quest with budget %d and %d dense layers (want budget >= 1)", p.Budget, p.Dense)
	}
	return nil
}

func (p *QuestPolicy) attach(c *Cache, gi int) (Policy, error) {
	g := &c.groups[gi]
	st := &questState{c: c, group: gi, layer: map[int]int{}, nkv: g.NKVHead, kd: g.KDim, seqs: map[int32]*questSeq{}, gen: make([]uint32, c.cfg.NumBlocks)}
	for _, l := range g.Layers {
		if l+c.cfg.FirstLayer >= p.Dense { // dense layers select nothing: no bounds
			st.layer[l] = len(st.bounds)
			// Sized like the pages (a block's bounds per KV head), so
			// kept beside them, off the heap.
			st.bounds = append(st.bounds, PageArray[float32](c.mem, c.cfg.NumBlocks*g.NKVHead*2*g.KDim))
		}
	}
	if err := c.mem.Err(); err != nil {
		return nil, fmt.Errorf("kvcache: quest bounds: %w", err)
	}
	return &QuestPolicy{Budget: p.Budget, Dense: p.Dense, st: st}, nil
}

// blockMetaBytes: a block's float32 key minima and maxima per KV head in
// every layer that selects.
func (p *QuestPolicy) blockMetaBytes(g *GroupSpec) int64 {
	n := 0
	for _, l := range g.Layers {
		if l >= p.Dense {
			n++
		}
	}
	return int64(n * g.NKVHead * 2 * g.KDim * 4)
}

// Visible implements Policy: everything (selection happens per query).
func (*QuestPolicy) Visible(_ int32, pos int, dst []Span) []Span {
	return append(dst, Span{0, pos + 1})
}

// Release implements Policy: nothing.
func (*QuestPolicy) Release(_ int32, _, _ int, dst []Span) []Span { return dst }

// MaxBlocks implements Policy: no bound.
func (*QuestPolicy) MaxBlocks(_, _ int) int { return 0 }

// Lossy implements Lossy.
func (*QuestPolicy) Lossy() bool { return true }

// Committed implements Tracker: it computes the bounds of blocks the
// sequence has filled, but for blocks whose bounds are current (nothing
// wrote them since: a prefix hit, a fork's shared blocks).
func (p *QuestPolicy) Committed(seq int32, next int) {
	st := p.st
	c := st.c
	t := c.tables[seq]
	if t == nil {
		return
	}
	s := st.seqs[seq]
	if s == nil {
		s = &questSeq{}
		s.sealed.Store(math.MaxInt64)
		st.seqs[seq] = s
	}
	var row []float32
	for ; s.done < next/c.bs && s.done < len(t.blocks); s.done++ {
		if id := t.blocks[s.done]; id >= 0 && st.gen[id] != c.written[id] {
			if row == nil {
				row = make([]float32, st.nkv*st.kd)
			}
			st.bound(int(id), row)
		}
	}
}

// bound computes the key bounds of physical block id (row: scratch of
// one key row).
func (st *questState) bound(id int, row []float32) {
	c := st.c
	st.gen[id] = c.written[id]
	for l, li := range st.layer {
		b := st.bounds[li][id*st.nkv*2*st.kd : (id+1)*st.nkv*2*st.kd]
		for h := 0; h < st.nkv; h++ {
			mx, mn := b[h*2*st.kd:h*2*st.kd+st.kd], b[h*2*st.kd+st.kd:(h+1)*2*st.kd]
			for j := range mx {
				mx[j], mn[j] = float32(math.Inf(-1)), float32(math.Inf(1))
			}
		}
		for slot := 0; slot < c.bs; slot++ {
			c.layers[l].k.Get(id, slot, row)
			for h := 0; h < st.nkv; h++ {
				mx, mn := b[h*2*st.kd:h*2*st.kd+st.kd], b[h*2*st.kd+st.kd:(h+1)*2*st.kd]
				for j, v := range row[h*st.kd : (h+1)*st.kd] {
					mx[j], mn[j] = max(mx[j], v), min(mn[j], v)
				}
			}
		}
	}
}

// Truncated implements Tracker.
func (p *QuestPolicy) Truncated(seq int32, n int) {
	s := p.st.seqs[seq]
	if s == nil {
		return
	}
	if n == 0 {
		delete(p.st.seqs, seq)
		return
	}
	s.done = min(s.done, n/p.st.c.bs)
	if int64(n) <= s.sealed.Load() {
		s.sealed.Store(math.MaxInt64)
	}
}

// Forked implements Tracker.
func (p *QuestPolicy) Forked(parent, child int32) {
	if s := p.st.seqs[parent]; s != nil {
		cs := &questSeq{done: s.done}
		cs.sealed.Store(s.sealed.Load())
		p.st.seqs[child] = cs
	}
}

// Sealed implements Sealer: a query that skipped blocks computed K/V a
// dense prefill of the same tokens would not, so those blocks stay out of
// the prefix cache.
func (p *QuestPolicy) Sealed(seq int32) int {
	if s := p.st.seqs[seq]; s != nil {
		return int(min(s.sealed.Load(), math.MaxInt))
	}
	return math.MaxInt
}

// Select implements PageSelector.
func (p *QuestPolicy) Select(layer int, seq int32, pos, kvHead int, q []float32, spans, dst []Span) []Span {
	st := p.st
	c := st.c
	bs := c.bs
	total := 0
	for _, s := range spans {
		total += s.To - s.From
	}
	cur := pos / bs
	if layer+c.cfg.FirstLayer < p.Dense || total <= p.Budget+pos%bs+1 {
		return append(dst, spans...)
	}
	ss := c.stepSeq(seq)
	qs := st.seqs[seq]
	if ss == nil || ss.rows > 1 || qs == nil {
		return append(dst, spans...)
	}
	sc, _ := st.pool.Get().(*questScratch)
	if sc == nil {
		sc = new(questScratch)
	}
	defer st.pool.Put(sc)
	sc.splitQuery(q, st.kd)
	st.scoreBlocks(sc, st.layer[layer], kvHead, spans, ss.blocks, min(cur, qs.done))
	k := max(p.Budget/bs, 1)
	if k >= len(sc.blocks) {
		return append(dst, spans...)
	}
	drop := sc.dropAfter(k, cur+1)
	qs.seal(pos)
	return keepBlocks(dst, spans, drop, bs)
}

// splitQuery lays out each query head of the group as q⁺ then q⁻ (the
// positive and the negative entries, zeros elsewhere): q⁺ against a
// block's maxima plus q⁻ against its minima is Σ max(qᵢ·maxᵢ, qᵢ·minᵢ),
// one dot product with the bounds as stored.
func (sc *questScratch) splitQuery(q []float32, kd int) {
	group := len(q) / kd
	sc.qq = append(sc.qq[:0], make([]float32, group*2*kd)...)
	for g := 0; g < group; g++ {
		for j, v := range q[g*kd : (g+1)*kd] {
			if v > 0 {
				sc.qq[g*2*kd+j] = v
			} else {
				sc.qq[g*2*kd+kd+j] = v
			}
		}
	}
}

// scoreBlocks fills sc.blocks and sc.score with the candidates: the
// logical blocks below upto (summarized, and before the query's own) that
// some span reaches, each scored by the highest bound over the group's
// query heads. The others are always read.
func (st *questState) scoreBlocks(sc *questScratch, li, kvHead int, spans []Span, table []int32, upto int) {
	kd, bs := st.kd, st.c.bs
	group := len(sc.qq) / (2 * kd)
	sc.blocks, sc.score = sc.blocks[:0], sc.score[:0]
	last := -1
	for _, s := range spans {
		for b := max(s.From/bs, last+1); b*bs < s.To && b < upto; b++ {
			id := int(table[b])
			bd := st.bounds[li][(id*st.nkv+kvHead)*2*kd : (id*st.nkv+kvHead+1)*2*kd]
			best := float32(math.Inf(-1))
			for g := 0; g < group; g++ {
				best = max(best, st.c.ops.DotF32(sc.qq[g*2*kd:(g+1)*2*kd], bd))
			}
			sc.blocks, sc.score = append(sc.blocks, b), append(sc.score, best)
			last = b
		}
	}
}

// dropAfter ranks the candidates by score (ties to the earlier block) and
// marks, in a mask over the first n logical blocks, those past the k best.
func (sc *questScratch) dropAfter(k, n int) []bool {
	sc.idx = sc.idx[:0]
	for i := range sc.blocks {
		sc.idx = append(sc.idx, i)
	}
	slices.SortFunc(sc.idx, func(a, b int) int {
		if sa, sb := sc.score[a], sc.score[b]; sa != sb {
			if sa > sb {
				return -1
			}
			return 1
		}
		return a - b
	})
	if cap(sc.drop) < n {
		sc.drop = make([]bool, n)
	}
	drop := sc.drop[:n]
	clear(drop)
	for _, i := range sc.idx[k:] {
		drop[sc.blocks[i]] = true
	}
	return drop
}

// seal lowers the sequence's sealed position to pos; layers and KV heads
// select concurrently, so it is a compare-and-swap minimum.
func (s *questSeq) seal(pos int) {
	for {
		old := s.sealed.Load()
		if int64(pos) >= old || s.sealed.CompareAndSwap(old, int64(pos)) {
			return
		}
	}
}

// keepBlocks appends spans to dst without the dropped logical blocks
// (blocks of bs positions), merging what stays adjacent.
func keepBlocks(dst, spans []Span, drop []bool, bs int) []Span {
	for _, sp := range spans {
		for a := sp.From; a < sp.To; {
			b := a / bs
			e := min(sp.To, (b+1)*bs)
			if !drop[b] {
				if n := len(dst); n > 0 && dst[n-1].To == a {
					dst[n-1].To = e
				} else {
					dst = append(dst, Span{a, e})
				}
			}
			a = e
		}
	}
	return dst
}

func init() {
	policyMakers["quest"] = func(a *args) Policy {
		return NewQuest(a.int("budget", 1024), a.int("dense", 2))
	}
}
