package model

import (
	"fmt"

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
	f := &FlatCache{nLayer: c.NLayer, kvd: kvd, maxLen: maxLen, seqs: seqs, k: make([]float32, n), ops: ops}
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

// Attend implements KVCache, one query at a time: the positions a query
// sees are contiguous, so each head is one strided-row kernel call.
func (f *FlatCache) Attend(layer, lo, hi int, q, out []float32, p AttnParams) {
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
		for h := 0; h < p.NHead; h++ {
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

// ParallelAttend reports that Attend may run concurrently for different
// rows once their K/V are stored.
func (f *FlatCache) ParallelAttend() bool { return true }

// Ops is the kernel set the cache's attention runs on.
func (f *FlatCache) Ops() *kernels.Ops { return f.ops }
