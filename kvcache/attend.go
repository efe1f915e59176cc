package kvcache

import (
	"fmt"
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
	vp, vd := ls.v, g.VDim
	if vp == nil {
		vp, vd = ls.k, g.KDim
	}
	if p.NKVHead != g.NKVHead || p.HeadDim != g.KDim || p.NHead%p.NKVHead != 0 {
		panic(fmt.Sprintf("kvcache: attention of %d heads over %d kv heads of %d on layer %d, stored as %d kv heads of %d",
			p.NHead, p.NKVHead, p.HeadDim, layer, g.NKVHead, g.KDim))
	}
	sq := &st.seqs[st.rows[lo].seq]
	pol := kv.policyOf(gi, sq.id)
	sc, _ := kv.scratch.Get().(*attnScratch)
	if sc == nil {
		sc = new(attnScratch)
	}
	defer kv.scratch.Put(sc)
	group, n := p.NHead/p.NKVHead, hi-lo
	total := kv.clip(sc, sq, gi, lo, hi, p.Window, group)
	if cap(sc.scores) < total {
		sc.scores = make([]float32, total)
	}
	scores := sc.scores[:total]
	obs, _ := pol.(ScoreObserver)
	sel, _ := pol.(PageSelector)
	if sel != nil {
		sc.all, sc.allSo = append(sc.all[:0], sc.spans...), append(sc.allSo[:0], sc.so...)
	}
	kd, qd, od := g.KDim, p.NHead*g.KDim, p.NHead*vd
	shifted := kv.shiftQueries(sc, pol, sq.id, q[:n*qd], qd)
	for kh := kh0; kh < kh1; kh++ {
		if sel != nil {
			kv.selectSpans(sc, sel, layer, sq.id, kh, func(i int) []float32 {
				return q[i*qd+kh*group*kd : i*qd+(kh+1)*group*kd]
			}, n, group)
		}
		kv.walk(sc, sq, n, func(i, blk, page, from, to, col int) {
			qi := q[i*qd+kh*group*kd : i*qd+(kh+1)*group*kd]
			if shifted && sc.shift[i] != 0 {
				// Keys below the bound are scored from the shifted query.
				b := sc.below[i] - blk*kv.bs
				qs := sc.qrot[i*qd+kh*group*kd : i*qd+(kh+1)*group*kd]
				if b >= to {
					qi = qs
				} else if b > from {
					ls.k.Scores(scores[sc.base[i]+col:], sc.ln[i], qs, page, kh, from, b)
					col, from = col+b-from, b
				}
			}
			ls.k.Scores(scores[sc.base[i]+col:], sc.ln[i], qi, page, kh, from, to)
		})
		for i := 0; i < n; i++ {
			L := sc.ln[i]
			for j := 0; j < group; j++ {
				clear(out[i*od+(kh*group+j)*vd : i*od+(kh*group+j+1)*vd])
				if L == 0 {
					continue
				}
				row := scores[sc.base[i]+j*L : sc.base[i]+(j+1)*L]
				kv.ops.ScaleF32(row, p.Scale)
				kv.ops.Softmax(row)
				if obs != nil {
					obs.ObserveScores(layer, sq.id, sc.pos[i], kh*group+j, sc.spans[sc.so[i]:sc.so[i+1]], row)
				}
			}
		}
		kv.walk(sc, sq, n, func(i, _, page, from, to, col int) {
			oi := out[i*od+kh*group*vd : i*od+(kh+1)*group*vd]
			vp.Mix(oi, scores[sc.base[i]+col:], sc.ln[i], page, kh, from, to)
		})
	}
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
	first, last := -1, -1
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
	if first < 0 {
		return
	}
	for j := first; j <= last; j++ {
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
