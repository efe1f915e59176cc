package model

import (
	"fmt"
	"math"
	"sync"

	"pagoda/kernels"
)

// FlatCache is a contiguous float32 KV cache for a fixed set of sequences
// (handles 0..seqs-1), each up to maxLen positions: the simple cache behind
// `pagoda run` and `pagoda score`, and the reference the paged cache is
// tested against.
type FlatCache struct {
	nLayer, kvd, maxLen, seqs int
	k, v                      []float32 // [seq][layer][pos][kvd]; v nil when K serves as V (MLA)
	rows                      []flatRow // the batch Begin prepared
	ops                       *kernels.Ops
	scratch                   sync.Pool // *flatScratch, one per concurrent Attend
}

// flatScratch is one tiled Attend call's working memory.
type flatScratch struct {
	kt, s, m, l []float32
}

type flatRow struct{ seq, pos int32 }

// NewFlatCache allocates seqs·maxLen positions for c, computing with the
// best kernels.
func NewFlatCache(c *Config, seqs, maxLen int) *FlatCache {
	return newFlatCache(c, seqs, maxLen, kernels.Best())
}

// NewFlatCache is a flat cache for m that computes with m's kernels, so a
// Reference model's attention runs in plain Go too.
func (m *Model) NewFlatCache(seqs, maxLen int) *FlatCache {
	c := m.Config
	c.NLayer = m.stage.Hi - m.stage.Lo // a pipeline stage's layers only
	return newFlatCache(&c, seqs, maxLen, m.ops)
}

func newFlatCache(c *Config, seqs, maxLen int, ops *kernels.Ops) *FlatCache {
	nkv, kd, vd := c.KVShape()
	kvd := nkv * kd
	n := seqs * c.NLayer * maxLen * kvd
	// K has a tile of slack at the end: the tiled scores transpose whole
	// tiles of 16 positions, past maxLen on the last sequence's last layer.
	f := &FlatCache{nLayer: c.NLayer, kvd: kvd, maxLen: maxLen, seqs: seqs, k: make([]float32, n+kernels.TileSlots*kvd), ops: ops}
	if vd > 0 {
		f.v = make([]float32, n)
	}
	return f
}

func (f *FlatCache) off(layer int, seq, pos int32) int {
	return ((int(seq)*f.nLayer+layer)*f.maxLen + int(pos)) * f.kvd
}

// Begin implements KVCache: it reports an error when the cache has no
// room for some row, so Forward fails before Store would panic.
func (f *FlatCache) Begin(b *Batch) error {
	f.rows = f.rows[:0]
	for i, pos := range b.Pos {
		seq := b.Seq[i]
		if seq < 0 || int(seq) >= f.seqs || pos < 0 || int(pos) >= f.maxLen {
			return fmt.Errorf("flat cache: sequence %d position %d outside %d×%d", seq, pos, f.seqs, f.maxLen)
		}
		f.rows = append(f.rows, flatRow{seq, pos})
	}
	return nil
}

// MaxLen is the number of positions per sequence.
func (f *FlatCache) MaxLen() int { return f.maxLen }

// Store implements KVCache.
func (f *FlatCache) Store(layer, row int, k, v []float32) {
	r := f.rows[row]
	o := f.off(layer, r.seq, r.pos)
	copy(f.k[o:o+f.kvd], k)
	if f.v != nil {
		copy(f.v[o:o+f.kvd], v)
	}
}

// Attend implements KVCache. Where the kernels tile keys and a GQA group
// shares them, it is attention in blocks with an online softmax, each
// block's keys tiled once for every query of a sequence in the call and
// every head of the group (attendTiled); otherwise one query at a time:
// the positions a query sees are contiguous, so each head is one
// strided-row kernel call. The choice depends on the model's shape only,
// so a query gets the same arithmetic alone and in any chunk.
func (f *FlatCache) Attend(layer, lo, hi int, q, out []float32, p AttnParams) {
	if f.tiles(p) {
		f.attendTiled(layer, lo, hi, 0, p.NKVHead, q, out, p)
		return
	}
	f.attendRows(layer, lo, hi, 0, p.NKVHead, q, out, p)
}

// AttendHeads is Attend for the KV heads [kh0, kh1) only, with the same
// arithmetic per head, so the model can spread a decode step's heads
// over the pool instead of reading the whole context on one core.
func (f *FlatCache) AttendHeads(layer, lo, hi, kh0, kh1 int, q, out []float32, p AttnParams) {
	if f.tiles(p) {
		f.attendTiled(layer, lo, hi, kh0, kh1, q, out, p)
		return
	}
	f.attendRows(layer, lo, hi, kh0, kh1, q, out, p)
}

// HeadParallel reports that any row's heads may be attended apart.
func (f *FlatCache) HeadParallel(layer, row int) bool { return true }

// attendRows is attention one query and head at a time, for KV heads
// [kh0, kh1): the positions a query sees are contiguous, so each head is
// one strided-row kernel call.
func (f *FlatCache) attendRows(layer, lo, hi, kh0, kh1 int, q, out []float32, p AttnParams) {
	hd := p.HeadDim
	group := p.NHead / p.NKVHead
	qd := p.NHead * hd
	scores := make([]float32, f.rows[hi-1].pos+1)
	vs := f.v
	if vs == nil {
		vs = f.k
	}
	for r := lo; r < hi; r++ {
		n := int(f.rows[r].pos) + 1
		start := 0
		if p.Window > 0 && n > p.Window {
			start = n - p.Window
		}
		base := f.off(layer, f.rows[r].seq, 0) + start*f.kvd
		n0 := n - start
		s := scores[:n0]
		end := base + (n0-1)*f.kvd
		qr, or := q[(r-lo)*qd:(r-lo+1)*qd], out[(r-lo)*qd:(r-lo+1)*qd]
		for h := kh0 * group; h < kh1*group; h++ {
			kh := (h / group) * hd
			f.ops.AttnScoresF32(s, qr[h*hd:(h+1)*hd], f.k[base+kh:end+kh+hd], f.kvd)
			f.ops.ScaleF32(s, p.Scale)
			f.ops.Softmax(s)
			oh := or[h*hd : (h+1)*hd]
			clear(oh)
			f.ops.AttnMixF32(oh, s, vs[base+kh:end+kh+hd], f.kvd)
		}
	}
}

// tiles reports whether attention over p's heads runs tiled: as in the
// paged cache, a single head per KV head gains too little to pay for the
// tiling.
func (f *FlatCache) tiles(p AttnParams) bool {
	return f.ops.Tiled() && p.NHead >= 2*p.NKVHead && p.HeadDim%16 == 0 && p.NKVHead*p.HeadDim == f.kvd
}

// flatBlock is how many positions a block of attendTiled spans: its
// scores stay in cache between scoring and mixing. Blocks start at
// multiples of it, so a query's blocks are the same in every call.
const flatBlock = 128

// attendTiled is Attend over rows [lo, hi) in runs of one sequence each,
// KV heads [kh0, kh1).
func (f *FlatCache) attendTiled(layer, lo, hi, kh0, kh1 int, q, out []float32, p AttnParams) {
	sc, _ := f.scratch.Get().(*flatScratch)
	if sc == nil {
		sc = new(flatScratch)
	}
	defer f.scratch.Put(sc)
	sc.kt, sc.s = grow(sc.kt, flatBlock*p.HeadDim), grow(sc.s, p.NHead/p.NKVHead*flatBlock)
	qd := p.NHead * p.HeadDim
	for r0 := lo; r0 < hi; {
		r1 := r0 + 1
		for r1 < hi && f.rows[r1].seq == f.rows[r0].seq {
			r1++
		}
		for kh := kh0; kh < kh1; kh++ {
			f.attendRun(sc, layer, kh, f.rows[r0:r1], q[(r0-lo)*qd:], out[(r0-lo)*qd:], p)
		}
		r0 = r1
	}
}

// visible is the positions [start, pos] row r sees under p's window.
func visible(r flatRow, window int) (start, end int) {
	end = int(r.pos) + 1
	if window > 0 && end > window {
		start = end - window
	}
	return start, end
}

// attendRun is KV head kh's attention for rows of one sequence (q and
// out from the first row's): block by block of positions, the block's
// keys are tiled once, then each query scores the part it sees, folds it
// into its running softmax and mixes the values.
func (f *FlatCache) attendRun(sc *flatScratch, layer, kh int, rows []flatRow, q, out []float32, p AttnParams) {
	hd, g := p.HeadDim, p.NHead/p.NKVHead
	qd, gd := p.NHead*hd, g*hd
	base := f.off(layer, rows[0].seq, 0) + kh*hd
	vs := f.v
	if vs == nil {
		vs = f.k
	}
	sc.m, sc.l = grow(sc.m, len(rows)*g), grow(sc.l, len(rows)*g)
	first, last := math.MaxInt, 0
	for i, r := range rows {
		s, e := visible(r, p.Window)
		first, last = min(first, s), max(last, e)
		clear(out[i*qd+kh*gd : i*qd+(kh+1)*gd])
		for j := range g {
			sc.m[i*g+j], sc.l[i*g+j] = float32(math.Inf(-1)), 0
		}
	}
	for b0 := first / flatBlock * flatBlock; b0 < last; b0 += flatBlock {
		t0 := max(b0, first) / kernels.TileSlots * kernels.TileSlots
		n := (min(b0+flatBlock, last) - t0 + kernels.TileSlots - 1) / kernels.TileSlots * kernels.TileSlots
		f.ops.TileKF32(sc.kt, f.k[base+t0*f.kvd:], f.kvd, hd, n)
		for i, r := range rows {
			s, e := visible(r, p.Window)
			from, to := max(s, b0), min(e, b0+flatBlock)
			if to > from {
				f.block(sc, i*g, q[i*qd+kh*gd:i*qd+(kh+1)*gd], out[i*qd+kh*gd:i*qd+(kh+1)*gd], vs[base+from*f.kvd:], from-t0, to-t0, p)
			}
		}
	}
	for i := range rows {
		o := out[i*qd+kh*gd : i*qd+(kh+1)*gd]
		for j := range g {
			if l := sc.l[i*g+j]; l > 0 {
				f.ops.ScaleF32(o[j*hd:(j+1)*hd], 1/l)
			}
		}
	}
}

// block folds slots [from, to) of the tiled keys into one query's running
// softmax (its heads' maxima and sums at sc.m[r:], sc.l[r:]) and adds
// their weighted values v (rows kvd apart, from slot from on) to o.
func (f *FlatCache) block(sc *flatScratch, r int, q, o, v []float32, from, to int, p AttnParams) {
	hd, n := p.HeadDim, to-from
	g := len(q) / hd
	f.ops.AttnScoresTile(sc.s, flatBlock, q, hd, sc.kt, from, to)
	for j := range g {
		f.ops.FoldOnline(sc.s[j*flatBlock:j*flatBlock+n], p.Scale, &sc.m[r+j], &sc.l[r+j], o[j*hd:(j+1)*hd])
	}
	f.ops.AttnMixHeadsF32(o, hd, sc.s, flatBlock, v, f.kvd, n)
}

// ParallelAttend reports that Attend may run concurrently for different
// rows once their K/V are stored.
func (f *FlatCache) ParallelAttend() bool { return true }

// Ops is the kernel set the cache's attention runs on.
func (f *FlatCache) Ops() *kernels.Ops { return f.ops }
