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
	k, v                      []float32 // [seq][layer][pos][kvd]
	scores                    [][]float32
}

// NewFlatCache allocates seqs·maxLen positions for c.
func NewFlatCache(c *Config, seqs, maxLen int) *FlatCache {
	kvd := c.NKVHead * c.HeadDim
	n := seqs * c.NLayer * maxLen * kvd
	return &FlatCache{nLayer: c.NLayer, kvd: kvd, maxLen: maxLen, seqs: seqs,
		k: make([]float32, n), v: make([]float32, n)}
}

func (f *FlatCache) off(layer int, seq, pos int32) int {
	if seq < 0 || int(seq) >= f.seqs || pos < 0 || int(pos) >= f.maxLen {
		panic(fmt.Sprintf("flat cache: sequence %d position %d outside %d×%d", seq, pos, f.seqs, f.maxLen))
	}
	return ((int(seq)*f.nLayer+layer)*f.maxLen + int(pos)) * f.kvd
}

// CheckPos reports an error when the cache has no room for position pos of
// sequence seq, so Forward fails before Store would panic.
func (f *FlatCache) CheckPos(seq, pos int32) error {
	if seq < 0 || int(seq) >= f.seqs || pos < 0 || int(pos) >= f.maxLen {
		return fmt.Errorf("flat cache: sequence %d position %d outside %d×%d", seq, pos, f.seqs, f.maxLen)
	}
	return nil
}

// MaxLen is the number of positions per sequence.
func (f *FlatCache) MaxLen() int { return f.maxLen }

// Store implements KVCache.
func (f *FlatCache) Store(layer int, seq, pos int32, k, v []float32) {
	o := f.off(layer, seq, pos)
	copy(f.k[o:o+f.kvd], k)
	copy(f.v[o:o+f.kvd], v)
}

// Attend implements KVCache.
func (f *FlatCache) Attend(layer int, seq, n int32, q, out []float32, p AttnParams) {
	hd := p.HeadDim
	group := p.NHead / p.NKVHead
	lo := 0
	if p.Window > 0 && int(n) > p.Window {
		lo = int(n) - p.Window
	}
	base := f.off(layer, seq, 0) + lo*f.kvd
	n0 := int(n) - lo
	scores := make([]float32, n0)
	end := base + (n0-1)*f.kvd
	for h := 0; h < p.NHead; h++ {
		kh := (h / group) * hd
		qh := q[h*hd : (h+1)*hd]
		kernels.AttnScoresF32(scores, qh, f.k[base+kh:end+kh+hd], f.kvd)
		kernels.ScaleF32(scores, p.Scale)
		kernels.Softmax(scores)
		oh := out[h*hd : (h+1)*hd]
		clear(oh)
		kernels.AttnMixF32(oh, scores, f.v[base+kh:end+kh+hd], f.kvd)
	}
}

// ParallelAttend reports that Attend may run concurrently for different
// tokens once their K/V are stored.
func (f *FlatCache) ParallelAttend() bool { return true }
