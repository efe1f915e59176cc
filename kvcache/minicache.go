package kvcache

import (
	"fmt"
	"math"
	"sync"

	"pagoda/kernels"
)

// MiniCache (Liu et al., 2024) merges the KV of adjacent layers from the
// middle of the model on: for each token and head, the two layers'
// vectors are split into magnitudes, kept per layer, and directions,
// merged by SLERP into one shared vector; a token whose two directions
// differ too much (mean cosine over heads below Retain) is kept unmerged
// in one of a page's spare slots, while any are left. A merged pair takes
// one row per token, two magnitudes per head, and Spare rows per page,
// against two rows per token: the pool's blocks really are smaller.
//
// The two layers of a pair form one layer group whose key format and value
// format are each a MiniCacheFormat: the cache calls NewPages for the
// first layer and then the second, and the format pairs the two calls
// over shared storage. The model stores a token's K/V of the first layer
// before the second's (and attends the first in between, reading it
// exact); storing the second merges the two.
type MiniCacheFormat struct {
	Base   Format  // storage of the shared directions and the spare rows
	T      float64 // SLERP interpolation (0.5: halfway)
	Retain float64 // cosine below which a token stays unmerged
	Spare  int     // unmerged tokens a page can hold

	mu      sync.Mutex
	pending *mergedStore // made for the first layer, waiting for the second
}

// MiniCacheGroups lays out a model's layers for MiniCache: layers before
// from are one plain group; from there on, pairs of adjacent layers are
// merged (an odd one out stays plain). Each call makes fresh formats, one
// set per cache.
func MiniCacheGroups(nLayer, nkv, headDim, from int, base Format, t, retain float64, spare int) []GroupSpec {
	var plain []int
	var gs []GroupSpec
	for l := 0; l < nLayer; l++ {
		if l >= from && l+1 < nLayer {
			mk := func() *MiniCacheFormat { return &MiniCacheFormat{Base: base, T: t, Retain: retain, Spare: spare} }
			gs = append(gs, GroupSpec{Layers: []int{l, l + 1}, NKVHead: nkv, KDim: headDim, VDim: headDim, KFormat: mk(), VFormat: mk()})
			l++
			continue
		}
		plain = append(plain, l)
	}
	if len(plain) > 0 {
		gs = append([]GroupSpec{{Layers: plain, NKVHead: nkv, KDim: headDim, VDim: headDim, KFormat: base, VFormat: base}}, gs...)
	}
	return gs
}

func (f *MiniCacheFormat) String() string {
	return fmt.Sprintf("minicache(%v,t=%g,retain=%g,spare=%d)", f.Base, f.T, f.Retain, f.Spare)
}

// RowBytes implements Format: per layer, half of the pair's row: the shared
// direction, a float32 magnitude per head for each layer, and a 2-byte
// index of the token's spare row.
func (f *MiniCacheFormat) RowBytes(heads, dim int) int {
	return (f.Base.RowBytes(heads, dim) + 8*heads + 2) / 2
}

// PageMetaBytes implements Format: half of the page's spare rows.
func (f *MiniCacheFormat) PageMetaBytes(tokens, heads, dim int) int {
	return (f.Spare*f.Base.RowBytes(heads, dim) + f.Base.PageMetaBytes(tokens+f.Spare, heads, dim)) / 2
}

func (f *MiniCacheFormat) checkDim(dim int) error {
	if f.Spare < 0 || f.Spare > math.MaxInt16 || !(f.T >= 0 && f.T <= 1) {
		return fmt.Errorf("kvcache: %v: want 0 <= t <= 1 and a spare count below 32768", f)
	}
	return checkDim(f.Base, dim)
}

// NewPages implements Format: the first call makes the pair's storage and
// the first layer's view, the second the second layer's.
func (f *MiniCacheFormat) NewPages(n, tokens, heads, dim int, ops *kernels.Ops, mem *PageMem) Pages {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s := f.pending; s != nil {
		f.pending = nil
		return &mergedPages{s: s, layer: 1}
	}
	s := &mergedStore{f: f, tokens: tokens, heads: heads, dim: dim,
		dir:   f.Base.NewPages(n, tokens, heads, dim, ops, mem),
		spare: f.Base.NewPages(n, max(f.Spare, 1), heads, dim, ops, mem),
		side:  PageArray[int16](mem, n*tokens)}
	for i := range s.mag {
		s.mag[i] = PageArray[float32](mem, n*tokens*heads)
	}
	f.pending = s
	return &mergedPages{s: s, layer: 0}
}

// mergedStore holds a layer pair's K (or V). For each token: dir holds the
// first layer's raw vector until the second is stored, then the merged
// direction, or, for a token kept unmerged, the first layer's vector;
// mag[l] scales dir for layer l (0 for the second layer of an unmerged
// token, whose vector is in spare row side-1).
type mergedStore struct {
	f                   *MiniCacheFormat
	tokens, heads, dim  int
	dir, spare          Pages
	mag                 [2][]float32
	side                []int16 // 0: merged; k > 0: unmerged, in spare row k-1
	Merged, Kept, Spilt int     // counters: merged, kept unmerged, over the spare rows (merged anyway)
}

type mergedPages struct {
	s     *mergedStore
	layer int
}

func (p *mergedPages) at(page, slot int) int { return page*p.s.tokens + slot }

func (p *mergedPages) Put(page, slot int, row []float32) {
	s := p.s
	i := p.at(page, slot)
	h, d := s.heads, s.dim
	if p.layer == 0 {
		s.dir.Put(page, slot, row)
		for j := 0; j < h; j++ {
			s.mag[0][i*h+j], s.mag[1][i*h+j] = 1, 0
		}
		s.side[i] = 0
		return
	}
	a := make([]float32, h*d)
	s.dir.Get(page, slot, a)
	var cos float64
	ua, ub := make([]float64, h*d), make([]float64, h*d)
	na, nb := make([]float64, h), make([]float64, h)
	for j := 0; j < h; j++ {
		for k := j * d; k < (j+1)*d; k++ {
			na[j] += float64(a[k]) * float64(a[k])
			nb[j] += float64(row[k]) * float64(row[k])
		}
		na[j], nb[j] = math.Sqrt(na[j]), math.Sqrt(nb[j])
		var c float64
		for k := j * d; k < (j+1)*d; k++ {
			ua[k], ub[k] = float64(a[k])/max(na[j], 1e-30), float64(row[k])/max(nb[j], 1e-30)
			c += ua[k] * ub[k]
		}
		cos += c / float64(h)
	}
	if cos < s.f.Retain {
		// Spare rows of this page in use: the unmerged tokens before slot.
		used := 0
		for t := page * s.tokens; t < i; t++ {
			if s.side[t] > 0 {
				used++
			}
		}
		if used < s.f.Spare {
			s.spare.Put(page, used, row)
			s.side[i] = int16(used + 1)
			s.Kept++
			return
		}
		s.Spilt++
	}
	s.Merged++
	e := make([]float32, h*d)
	for j := 0; j < h; j++ {
		c := 0.0
		for k := j * d; k < (j+1)*d; k++ {
			c += ua[k] * ub[k]
		}
		slerp(e[j*d:(j+1)*d], ua[j*d:(j+1)*d], ub[j*d:(j+1)*d], math.Acos(max(-1, min(1, c))), s.f.T)
		s.mag[0][i*h+j], s.mag[1][i*h+j] = float32(na[j]), float32(nb[j])
	}
	s.dir.Put(page, slot, e)
}

// slerp sets e to the spherical interpolation at t of unit vectors a and b
// an angle theta apart (linear, renormalized, when they nearly coincide).
func slerp(e []float32, a, b []float64, theta, t float64) {
	wa, wb := 1-t, t
	if s := math.Sin(theta); s > 1e-6 {
		wa, wb = math.Sin((1-t)*theta)/s, math.Sin(t*theta)/s
	}
	var n float64
	for k := range e {
		v := wa*a[k] + wb*b[k]
		n += v * v
		e[k] = float32(v)
	}
	if n = math.Sqrt(n); n > 0 {
		for k := range e {
			e[k] = float32(float64(e[k]) / n)
		}
	}
}

func (p *mergedPages) Get(page, slot int, row []float32) {
	s := p.s
	i := p.at(page, slot)
	if p.layer == 1 && s.side[i] > 0 {
		s.spare.Get(page, int(s.side[i]-1), row)
		return
	}
	s.dir.Get(page, slot, row)
	for j := 0; j < s.heads; j++ {
		m := s.mag[p.layer][i*s.heads+j]
		for k := j * s.dim; k < (j+1)*s.dim; k++ {
			row[k] *= m
		}
	}
}

func (p *mergedPages) Scores(sc []float32, ss int, q []float32, page, head, from, to int) {
	s := p.s
	s.dir.Scores(sc, ss, q, page, head, from, to)
	g := len(q) / s.dim
	for t := from; t < to; t++ {
		i := p.at(page, t)
		m := s.mag[p.layer][i*s.heads+head]
		for j := 0; j < g; j++ {
			sc[j*ss+t-from] *= m
		}
		if p.layer == 1 && s.side[i] > 0 {
			one := make([]float32, g)
			s.spare.Scores(one, 1, q, page, head, int(s.side[i]-1), int(s.side[i]))
			for j := 0; j < g; j++ {
				sc[j*ss+t-from] = one[j]
			}
		}
	}
}

func (p *mergedPages) Mix(out, w []float32, ws int, page, head, from, to int) {
	s := p.s
	g := len(out) / s.dim
	n := to - from
	wm := make([]float32, g*n)
	for t := from; t < to; t++ {
		i := p.at(page, t)
		m := s.mag[p.layer][i*s.heads+head]
		for j := 0; j < g; j++ {
			wm[j*n+t-from] = w[j*ws+t-from] * m
		}
		if p.layer == 1 && s.side[i] > 0 {
			one := make([]float32, g)
			for j := 0; j < g; j++ {
				one[j] = w[j*ws+t-from]
			}
			s.spare.Mix(out, one, 1, page, head, int(s.side[i]-1), int(s.side[i]))
		}
	}
	s.dir.Mix(out, wm, n, page, head, from, to)
}

// CopyPage copies the pair's page once, from the first layer's view (the
// cache copies every layer's page; the second view's copy is the same).
func (p *mergedPages) CopyPage(dst, src int) {
	if p.layer == 1 {
		return
	}
	s := p.s
	s.dir.CopyPage(dst, src)
	s.spare.CopyPage(dst, src)
	n := s.tokens
	copy(s.side[dst*n:(dst+1)*n], s.side[src*n:(src+1)*n])
	for l := range s.mag {
		copy(s.mag[l][dst*n*s.heads:(dst+1)*n*s.heads], s.mag[l][src*n*s.heads:(src+1)*n*s.heads])
	}
}
