package kvcache

import (
	"fmt"
	"math"
	"runtime"

	"pagoda/model"
)

// step is what Begin prepares for one forward pass, so Store and Attend
// touch no map and ask no policy per token and layer.
type step struct {
	rows []stepRow
	seqs []stepSeq
	vis  []groupVis // per layer group
}

type stepRow struct {
	pos, seq   int32 // seq indexes step.seqs
	page, slot int32 // where Store writes the row
}

type stepSeq struct {
	id      int32
	blocks  []int32 // the block table, holes released
	maxHole int     // highest released logical block, -1 for none
	rows    int     // rows of the step: 1 for a decode, more for a prompt chunk
}

// groupVis is what the group's policy lets each row attend: the spans of
// row r are spans[off[r]:off[r+1]].
type groupVis struct {
	off   []int32
	spans []Span
}

// Store implements model.KVCache.
func (kv *Storage) Store(layer, row int, k, v []float32) {
	r := &kv.step.rows[row]
	ls := &kv.layers[layer]
	put(ls.k, &kv.step.seqs[r.seq], r, k)
	if ls.v != nil {
		put(ls.v, &kv.step.seqs[r.seq], r, v)
	}
	// The pages are unmapped when kv is collected: kv must outlive the
	// kernel writing them, even when the caller dropped it already.
	runtime.KeepAlive(kv)
}

// seqPutter is Pages that need the sequence's block table to store a
// row: KIVI quantizes a page when its group leaves the residual window.
type seqPutter interface {
	PutSeq(blocks []int32, pos int, row []float32)
}

func put(p Pages, s *stepSeq, r *stepRow, row []float32) {
	if sp, ok := p.(seqPutter); ok {
		sp.PutSeq(s.blocks, int(r.pos), row)
		return
	}
	p.Put(int(r.page), int(r.slot), row)
}

// attnScratch is one Attend call's working memory, from a sync.Pool.
type attnScratch struct {
	spans                   []Span // each query's spans, clipped to the model's window
	so                      []int  // query i's spans are spans[so[i]:so[i+1]]
	all                     []Span // spans before a PageSelector narrowed them
	allSo                   []int
	ln, base, cur, col, pos []int // per query: visible positions, score offset, walk state, position
	scores                  []float32
	below, shift            []int     // per query: a QueryShifter's bound and distance
	qrot                    []float32 // the queries rotated by shift
	kt                      []float32 // the keys of page ktPage, tiled (kernels.TileK*)
	ktPage                  int
	total                   int       // scores after selectSpans
	m, l                    []float32 // online softmax: per query and head, largest score and sum
	cur0, col0              []int     // walk state at the start of an online block
	blockCol                []int     // per online block and query: its first column (whole rows kept)
	blockM                  []float32 // per online block, query and head: the running maximum after it
}

// tiledPages is Pages whose keys can be transposed per tile, for scores
// by kernels.AttnScoresTile; TileK fills kt (a page's tokens × dim
// floats), using scratch (as many) if it needs to. Tiles is false where
// the format or the kernels cannot.
type tiledPages interface {
	Tiles() bool
	TileK(kt, scratch []float32, page, head int)
}

// Attend implements model.KVCache with a two-pass softmax over the rows
// [lo, hi) of one sequence: for each KV head, every page the queries see
// is read once for all of them and all heads of the GQA group, scores
// first, then the weighted values. A query's result does not depend on
// the other queries in the call: pages are visited in position order and
// split at the same places whatever the chunk.
func (kv *Storage) Attend(layer, lo, hi int, q, out []float32, p model.AttnParams) {
	kv.AttendHeads(layer, lo, hi, 0, p.NKVHead, q, out, p)
}

// AttendHeads is Attend for the KV heads [kh0, kh1) only: it writes the
// outputs of their query heads and nothing else, so calls for disjoint
// head ranges of the same rows may run concurrently where HeadParallel
// allows (a decode's single query then uses every thread). Each head's
// arithmetic is the same as in Attend, so the result is bit for bit the
// same however the heads are split.
func (kv *Storage) AttendHeads(layer, lo, hi, kh0, kh1 int, q, out []float32, p model.AttnParams) {
	st := &kv.step
	ls := &kv.layers[layer]
	gi := ls.group
	g := &kv.groups[gi]
	a := attnCall{kv: kv, layer: layer, p: p, q: q, out: out, k: ls.k, vp: ls.v, vd: g.VDim, kd: g.KDim}
	if a.vp == nil {
		a.vp, a.vd = ls.k, g.KDim
	}
	if p.NKVHead != g.NKVHead || p.HeadDim != g.KDim || p.NHead%p.NKVHead != 0 {
		panic(fmt.Sprintf("kvcache: attention of %d heads over %d kv heads of %d on layer %d, stored as %d kv heads of %d",
			p.NHead, p.NKVHead, p.HeadDim, layer, g.NKVHead, g.KDim))
	}
	a.sq = &st.seqs[st.rows[lo].seq]
	pol := kv.policyOf(gi, a.sq.id)
	sc, _ := kv.scratch.Get().(*attnScratch)
	if sc == nil {
		sc = new(attnScratch)
	}
	defer kv.scratch.Put(sc)
	a.sc, a.group, a.n = sc, p.NHead/p.NKVHead, hi-lo
	a.total = kv.clip(sc, a.sq, gi, lo, hi, p.Window, a.group)
	a.obs, _ = pol.(ScoreObserver)
	sel, _ := pol.(PageSelector)
	if sel != nil {
		sc.all, sc.allSo = append(sc.all[:0], sc.spans...), append(sc.allSo[:0], sc.so...)
	}
	a.qd, a.od = p.NHead*a.kd, p.NHead*a.vd
	a.shifted = kv.shiftQueries(sc, pol, a.sq.id, q[:a.n*a.qd], a.qd)
	a.tp = kv.tiler(sc, ls.k, a.group, a.kd)
	for kh := kh0; kh < kh1; kh++ {
		sc.ktPage = -1
		if sel != nil {
			kv.selectSpans(sc, sel, layer, a.sq.id, kh, func(i int) []float32 { return a.qOf(q, i, kh) }, a.n, a.group)
			a.total = sc.total
		}
		if kv.ops.Tiled() {
			a.online(kh)
		} else {
			a.twoPass(kh)
		}
	}
}

// attnCall is one AttendHeads call's state, shared by its passes.
type attnCall struct {
	kv                     *Storage
	sc                     *attnScratch
	sq                     *stepSeq
	k, vp                  Pages
	obs                    ScoreObserver
	p                      model.AttnParams
	q, out                 []float32
	layer, n, group, total int
	kd, vd, qd, od         int
	shifted, rows          bool       // rows: online keeps whole score rows
	S                      int        // online block slots
	tp                     tiledPages // nil: the pages score row by row
}

// qOf is query i's vectors of KV head kh's group in q (the queries or
// their rotated copy).
func (a *attnCall) qOf(q []float32, i, kh int) []float32 {
	return q[i*a.qd+kh*a.group*a.kd : i*a.qd+(kh+1)*a.group*a.kd]
}

// outOf is query i's outputs of KV head kh's group.
func (a *attnCall) outOf(i, kh int) []float32 {
	return a.out[i*a.od+kh*a.group*a.vd : i*a.od+(kh+1)*a.group*a.vd]
}

// scoreQuery scores query i against slots [from, to) of page (logical
// block blk) into dst (heads ss apart); keys below a QueryShifter's bound
// are scored from the shifted query.
func (a *attnCall) scoreQuery(dst []float32, ss, i, blk, page, kh, from, to int) {
	sc := a.sc
	qi := a.qOf(a.q, i, kh)
	if a.shifted && sc.shift[i] != 0 {
		b := sc.below[i] - blk*a.kv.bs
		qs := a.qOf(sc.qrot, i, kh)
		if b >= to {
			qi = qs
		} else if b > from {
			a.score(dst, ss, qs, page, kh, from, b)
			dst, from = dst[b-from:], b
		}
	}
	a.score(dst, ss, qi, page, kh, from, to)
}

// twoPass is attention with every query's whole score rows materialized:
// scores, softmax, then the weighted values. Policies that observe the
// attention probabilities need it.
func (a *attnCall) twoPass(kh int) {
	kv, sc := a.kv, a.sc
	if cap(sc.scores) < a.total {
		sc.scores = make([]float32, a.total)
	}
	scores := sc.scores[:a.total]
	kv.walk(sc, a.sq, a.n, func(i, blk, page, from, to, col int) {
		a.scoreQuery(scores[sc.base[i]+col:], sc.ln[i], i, blk, page, kh, from, to)
	})
	for i := 0; i < a.n; i++ {
		L := sc.ln[i]
		clear(a.outOf(i, kh))
		for j := 0; j < a.group && L > 0; j++ {
			row := scores[sc.base[i]+j*L : sc.base[i]+(j+1)*L]
			kv.ops.ScaleF32(row, a.p.Scale)
			kv.ops.Softmax(row)
			if a.obs != nil {
				a.obs.ObserveScores(a.layer, a.sq.id, sc.pos[i], kh*a.group+j, sc.spans[sc.so[i]:sc.so[i+1]], row)
			}
		}
	}
	kv.walk(sc, a.sq, a.n, func(i, _, page, from, to, col int) {
		a.vp.Mix(a.outOf(i, kh), scores[sc.base[i]+col:], sc.ln[i], page, kh, from, to)
	})
}

// onlineSlots is how many positions an online-softmax block spans (a
// whole number of pages): its scores, for a call's queries and heads,
// stay in the core's cache between scoring and mixing.
const onlineSlots = 128

// online is attention one block of positions at a time with an online
// softmax (as FlashAttention computes it): each block's scores are scored,
// exponentiated against the running maximum and mixed while still in
// cache, and the outputs rescaled when a later block raises the maximum.
// Blocks are fixed by absolute position, so a query's arithmetic does not
// depend on the other queries in the call. Without an observer only a
// block's scores are held, never whole rows (sc.ln[i] × group floats per
// query, megabytes at long context). A policy that observes the attention
// probabilities gets the same output from the same arithmetic over whole
// rows, and then the rows' probabilities.
func (a *attnCall) online(kh int) {
	kv, sc := a.kv, a.sc
	S := max(kv.bs, onlineSlots/kv.bs*kv.bs)
	ng := a.n * a.group
	a.layout(S)
	sc.m, sc.l = grow(sc.m, ng), grow(sc.l, ng)
	for r := range ng {
		sc.m[r], sc.l[r] = float32(math.Inf(-1)), 0
	}
	for i := 0; i < a.n; i++ {
		clear(a.outOf(i, kh))
	}
	sc.blockCol, sc.blockM = sc.blockCol[:0], sc.blockM[:0]
	first, last := kv.walkStart(sc, a.n)
	// Blocks start at multiples of S whatever the first position a call
	// sees, so that a query's blocks are the same in every call.
	per := S / kv.bs
	for b0 := first / per * per; first >= 0 && b0 <= last; b0 += per {
		b1 := min(b0+per, last+1)
		a.prefetch(kh, b1, min(b1+per, last+1))
		sc.cur0, sc.col0 = append(sc.cur0[:0], sc.cur...), append(sc.col0[:0], sc.col...)
		kv.walkPages(sc, a.sq, a.n, b0, b1, func(i, blk, page, from, to, col int) {
			a.scoreQuery(sc.scores[a.rowOff(i, 0)+col:], a.ss(i), i, blk, page, kh, from, to)
		})
		a.softmaxBlock(kh)
		copy(sc.cur, sc.cur0)
		copy(sc.col, sc.col0)
		kv.walkPages(sc, a.sq, a.n, b0, b1, func(i, _, page, from, to, col int) {
			a.vp.Mix(a.outOf(i, kh), sc.scores[a.rowOff(i, 0)+col:], a.ss(i), page, kh, from, to)
		})
	}
	for i := 0; i < a.n; i++ {
		for j := 0; j < a.group; j++ {
			if l := sc.l[i*a.group+j]; l > 0 {
				kv.ops.ScaleF32(a.outOf(i, kh)[j*a.vd:(j+1)*a.vd], 1/l)
			}
		}
	}
	if a.obs != nil {
		a.observe(kh)
	}
}

// prefetcher is Pages that can ask for a page's rows of one head ahead
// of use.
type prefetcher interface{ Prefetch(page, head int) }

// prefetch asks for the K and V rows of head kh in logical blocks
// [j0, j1): the next online block's pages, while this block computes.
func (a *attnCall) prefetch(kh, j0, j1 int) {
	kp, _ := a.k.(prefetcher)
	vp, _ := a.vp.(prefetcher)
	if kp == nil || vp == nil {
		return
	}
	for j := j0; j < j1; j++ {
		if pg := int(a.sq.blocks[j]); pg >= 0 {
			kp.Prefetch(pg, kh)
			vp.Prefetch(pg, kh)
		}
	}
}

// layout sizes sc.scores for online: a block of S slots per query and
// head, or whole rows (clip's layout) for an observer.
func (a *attnCall) layout(S int) {
	sc := a.sc
	a.S, a.rows = S, a.obs != nil
	n := a.n * a.group * S
	if a.rows {
		n = a.total
	}
	if cap(sc.scores) < n {
		sc.scores = make([]float32, n)
	}
	sc.scores = sc.scores[:n]
}

// rowOff is where head j's scores of query i start in sc.scores, at the
// column where the row's current block starts counting (col0: columns
// count the query's visible positions from its first).
func (a *attnCall) rowOff(i, j int) int {
	if a.rows {
		return a.sc.base[i] + j*a.sc.ln[i]
	}
	return (i*a.group+j)*a.S - a.sc.col0[i]
}

// ss is how far apart query i's heads' scores are.
func (a *attnCall) ss(i int) int {
	if a.rows {
		return a.sc.ln[i]
	}
	return a.S
}

// softmaxBlock exponentiates each query's and head's scores of the block
// against the running maximum, rescaling the output and sum so far where
// the block raises it; with whole rows kept it notes each block's columns
// and maxima for observe.
func (a *attnCall) softmaxBlock(kh int) {
	kv, sc := a.kv, a.sc
	if a.rows {
		sc.blockCol = append(sc.blockCol, sc.col0...)
	}
	for i := 0; i < a.n; i++ {
		c0, c1 := sc.col0[i], sc.col[i]
		o := a.outOf(i, kh)
		for j := 0; j < a.group; j++ {
			r := i*a.group + j
			off := a.rowOff(i, j)
			kv.ops.FoldOnline(sc.scores[off+c0:off+c1], a.p.Scale, &sc.m[r], &sc.l[r], o[j*a.vd:(j+1)*a.vd])
			if a.rows {
				sc.blockM = append(sc.blockM, sc.m[r])
			}
		}
	}
}

// observe turns the whole rows of exponentials (each block's against its
// running maximum) into probabilities and hands them to the observer.
func (a *attnCall) observe(kh int) {
	sc := a.sc
	nb := len(sc.blockCol) / a.n
	for i := 0; i < a.n; i++ {
		L := sc.ln[i]
		for j := 0; j < a.group && L > 0; j++ {
			r := i*a.group + j
			row := sc.scores[sc.base[i]+j*L : sc.base[i]+(j+1)*L]
			for b := 0; b < nb; b++ {
				c0, c1 := sc.blockCol[b*a.n+i], L
				if b+1 < nb {
					c1 = sc.blockCol[(b+1)*a.n+i]
				}
				if c1 > c0 {
					f := float32(math.Exp(float64(sc.blockM[b*a.n*a.group+r]-sc.m[r]))) / sc.l[r]
					a.kv.ops.ScaleF32(row[c0:c1], f)
				}
			}
			a.obs.ObserveScores(a.layer, a.sq.id, sc.pos[i], kh*a.group+j, sc.spans[sc.so[i]:sc.so[i+1]], row)
		}
	}
}

// grow returns s resized to n (reallocated when short).
func grow(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}

// tiler is how AttendHeads scores pages: through the tiled keys (the
// pages returned) where the pages tile and a GQA group shares them (one
// tiling per page and KV head serves every query and head; a single head
// per KV head gains too little over the row kernels to pay for it), else
// page by page (nil). The choice depends on the model's shape and the
// format only, never on the queries in the call, so every query gets the
// same arithmetic in decode and in any prefill chunk.
func (kv *Storage) tiler(sc *attnScratch, k Pages, group, kd int) tiledPages {
	tp, ok := k.(tiledPages)
	if !ok || group < 2 || !tp.Tiles() {
		return nil
	}
	if n := 2 * kv.bs * kd; cap(sc.kt) < n {
		sc.kt = make([]float32, n)
	}
	return tp
}

// score sets dst[j·ss+t-from] = q_j·k_t for slots [from, to) of page, KV
// head head: from the page's tiled keys (tiled once per page and head,
// kept in sc.kt) or the page's own kernel.
func (a *attnCall) score(dst []float32, ss int, q []float32, page, head, from, to int) {
	if a.tp == nil {
		a.k.Scores(dst, ss, q, page, head, from, to)
		return
	}
	sc, n := a.sc, a.kv.bs*a.kd
	if page != sc.ktPage {
		a.tp.TileK(sc.kt[:n], sc.kt[n:2*n], page, head)
		sc.ktPage = page
	}
	a.kv.ops.AttnScoresTile(dst, ss, q, a.kd, sc.kt[:n], from, to)
}

// clip fills sc with the spans of rows [lo, hi) that group gi's policy
// and the model's window both let each query see, and returns the scores
// the call needs: visible positions times the GQA group, over all queries.
func (kv *Storage) clip(sc *attnScratch, sq *stepSeq, gi, lo, hi, window, group int) int {
	st, vis := &kv.step, &kv.step.vis[gi]
	sc.spans, sc.so, sc.ln, sc.base, sc.pos = sc.spans[:0], sc.so[:0], sc.ln[:0], sc.base[:0], sc.pos[:0]
	total := 0
	for r := lo; r < hi; r++ {
		if st.seqs[st.rows[r].seq].id != sq.id {
			panic(fmt.Sprintf("kvcache: attend over rows %d..%d of sequences %d and %d", lo, hi, sq.id, st.seqs[st.rows[r].seq].id))
		}
		pos := int(st.rows[r].pos)
		wlo := 0
		if window > 0 {
			wlo = max(0, pos+1-window)
		}
		// A window wider than the cache policy's (or none) would read
		// blocks the cache has handed to someone else: wrong output,
		// silently, unless the policy drops positions on purpose.
		if sq.maxHole >= wlo/kv.bs && !kv.lossyOf(gi, sq.id) {
			for b := wlo / kv.bs; b <= min(sq.maxHole, pos/kv.bs); b++ {
				if sq.blocks[b] == released {
					panic(fmt.Sprintf("kvcache: attend from position %d of sequence %d with window %d reads position %d, released by the cache policy %v",
						pos, sq.id, window, b*kv.bs, kv.policyOf(gi, sq.id)))
				}
			}
		}
		sc.so = append(sc.so, len(sc.spans))
		L := 0
		for _, s := range vis.spans[vis.off[r]:vis.off[r+1]] {
			if a := max(s.From, wlo); a < s.To {
				sc.spans = append(sc.spans, Span{a, s.To})
				L += s.To - a
			}
		}
		sc.ln, sc.base, sc.pos = append(sc.ln, L), append(sc.base, total), append(sc.pos, pos)
		total += group * L
	}
	sc.so = append(sc.so, len(sc.spans))
	return total
}

// shiftQueries asks a QueryShifter where each query's positions move and
// rotates the queries that move into sc.qrot; false when none does.
func (kv *Storage) shiftQueries(sc *attnScratch, pol Policy, seq int32, q []float32, qd int) bool {
	qs, ok := pol.(QueryShifter)
	if !ok {
		return false
	}
	n := len(sc.pos)
	sc.below, sc.shift = sc.below[:0], sc.shift[:0]
	any := false
	for i := 0; i < n; i++ {
		b, d := qs.QueryShift(seq, sc.pos[i])
		sc.below, sc.shift = append(sc.below, b), append(sc.shift, d)
		any = any || d != 0
	}
	if !any {
		return false
	}
	if cap(sc.qrot) < len(q) {
		sc.qrot = make([]float32, len(q))
	}
	sc.qrot = sc.qrot[:len(q)]
	copy(sc.qrot, q)
	for i := 0; i < n; i++ {
		if sc.shift[i] != 0 {
			kv.rope.rotate(kv.ops.RoPE, sc.qrot[i*qd:(i+1)*qd], sc.shift[i])
		}
	}
	return true
}

// selectSpans narrows every query's spans to what sel reads for KV head
// kh, recomputing the score layout; it only ever shrinks what clip sized.
func (kv *Storage) selectSpans(sc *attnScratch, sel PageSelector, layer int, seq int32, kh int, qOf func(int) []float32, n, group int) {
	sc.spans, sc.so = sc.spans[:0], sc.so[:0]
	total := 0
	for i := 0; i < n; i++ {
		sc.so = append(sc.so, len(sc.spans))
		all := sc.all[sc.allSo[i]:sc.allSo[i+1]]
		k := len(sc.spans)
		sc.spans = sel.Select(layer, seq, sc.pos[i], kh, qOf(i), all, sc.spans)
		L := 0
		for j, s := range sc.spans[k:] {
			if s.From >= s.To || (j > 0 && s.From < sc.spans[k+j-1].To) || !inside(s, all) {
				panic(fmt.Sprintf("kvcache: policy %T selects %v for position %d of sequence %d, outside %v", sel, s, sc.pos[i], seq, all))
			}
			L += s.To - s.From
		}
		sc.ln[i], sc.base[i] = L, total
		total += group * L
	}
	sc.total = total
	sc.so = append(sc.so, len(sc.spans))
}

// inside says whether s lies within one of the spans of all.
func inside(s Span, all []Span) bool {
	for _, a := range all {
		if a.From <= s.From && s.To <= a.To {
			return true
		}
	}
	return false
}

// walk calls fn for every page and query that sees part of it, pages in
// position order outermost, so a page is read once for all the queries:
// fn(i, blk, page, from, to, col) covers slots [from, to) of logical block
// blk, physical page page, which are positions col.. of query i's visible
// positions.
func (kv *Storage) walk(sc *attnScratch, sq *stepSeq, n int, fn func(i, blk, page, from, to, col int)) {
	if first, last := kv.walkStart(sc, n); first >= 0 {
		kv.walkPages(sc, sq, n, first, last+1, fn)
	}
}

// walkStart resets the walk state of sc's n queries and returns the first
// and last logical blocks any of them sees (-1, -1 when none).
func (kv *Storage) walkStart(sc *attnScratch, n int) (first, last int) {
	first, last = -1, -1
	sc.cur, sc.col = sc.cur[:0], sc.col[:0]
	for i := 0; i < n; i++ {
		sc.cur, sc.col = append(sc.cur, sc.so[i]), append(sc.col, 0)
		if a, b := sc.so[i], sc.so[i+1]; a < b {
			if f := sc.spans[a].From / kv.bs; first < 0 || f < first {
				first = f
			}
			last = max(last, (sc.spans[b-1].To-1)/kv.bs)
		}
	}
	return first, last
}

// walkPages continues the walk over logical blocks [j0, j1), which must
// follow the blocks walked since walkStart.
func (kv *Storage) walkPages(sc *attnScratch, sq *stepSeq, n, j0, j1 int, fn func(i, blk, page, from, to, col int)) {
	for j := j0; j < j1; j++ {
		pLo, pHi := j*kv.bs, (j+1)*kv.bs
		page := -2
		for i := 0; i < n; i++ {
			for sc.cur[i] < sc.so[i+1] {
				s := sc.spans[sc.cur[i]]
				if s.From >= pHi {
					break
				}
				a, e := max(s.From, pLo), min(s.To, pHi)
				if a < e {
					if page == -2 {
						page = int(sq.blocks[j])
						if page == released {
							panic(fmt.Sprintf("kvcache: sequence %d attends position %d, in a block its policy released", sq.id, a))
						}
					}
					fn(i, j, page, a-pLo, e-pLo, sc.col[i])
					sc.col[i] += e - a
				}
				if s.To > pHi {
					break
				}
				sc.cur[i]++
			}
		}
	}
}

var (
	_ model.KVCache = (*Cache)(nil)
	_ model.KVCache = (*Storage)(nil)
)

// ParallelAttend tells the model that Attend may run concurrently for
// different rows once their K/V are stored: it reads the prepared step and
// the storage only, and its scratch comes from a sync.Pool.
func (kv *Storage) ParallelAttend() bool { return true }

// HeadParallel reports whether AttendHeads may run concurrently for
// different KV heads of the rows starting at row: not under a policy that
// observes scores or selects pages, whose per-sequence state the heads of
// one layer would update at once.
func (kv *Storage) HeadParallel(layer, row int) bool {
	pol := kv.policyOf(kv.layers[layer].group, kv.step.seqs[kv.step.rows[row].seq].id)
	_, obs := pol.(ScoreObserver)
	_, sel := pol.(PageSelector)
	return !obs && !sel
}

// stepSeq is seq's entry in the prepared step (nil if it has no rows).
func (kv *Storage) stepSeq(seq int32) *stepSeq {
	for i := range kv.step.seqs {
		if kv.step.seqs[i].id == seq {
			return &kv.step.seqs[i]
		}
	}
	return nil
}
