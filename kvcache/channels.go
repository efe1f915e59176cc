package kvcache

import (
	"fmt"
	"math"
	"slices"

	"pagoda/kernels"
)

// Key-channel reduction (ThinK, Xu et al., 2024): keys carry redundant
// channels; per KV head only the r channels that matter most to q·k are
// stored, and scores are computed on them alone. ChannelFormat is the
// storage side: a key format of r channels per head, so a block of the
// pool really takes r/dim of the key bytes. The channels are chosen per
// layer and head from query and key magnitudes (ChannelImportance), ThinK's
// criterion ‖Q_i‖·‖K_i‖, on calibration text once rather than per request,
// so every sequence shares one layout and blocks stay shareable.

// ChannelFormat stores, for every KV head, only the channels Keep[head]
// (ascending, the same count for every head) of each key row, in Base.
type ChannelFormat struct {
	Base Format
	Keep [][]int // per KV head, the kept channels of the full head dim
}

func (f *ChannelFormat) String() string {
	if len(f.Keep) == 0 {
		return fmt.Sprintf("%v/channels", f.Base)
	}
	return fmt.Sprintf("%v/%dch", f.Base, len(f.Keep[0]))
}

func (f *ChannelFormat) r() int { return len(f.Keep[0]) }

// RowBytes implements Format: r channels per head in Base.
func (f *ChannelFormat) RowBytes(heads, dim int) int { return f.Base.RowBytes(heads, f.r()) }

// PageMetaBytes implements Format.
func (f *ChannelFormat) PageMetaBytes(tokens, heads, dim int) int {
	return f.Base.PageMetaBytes(tokens, heads, f.r())
}

func (f *ChannelFormat) checkDim(dim int) error {
	if len(f.Keep) == 0 || f.r() == 0 {
		return fmt.Errorf("kvcache: channel format keeps no channel")
	}
	for h, k := range f.Keep {
		if len(k) != f.r() || !slices.IsSorted(k) || k[0] < 0 || k[len(k)-1] >= dim {
			return fmt.Errorf("kvcache: channel format: head %d keeps %v, want %d ascending channels below %d", h, k, f.r(), dim)
		}
	}
	return checkDim(f.Base, f.r())
}

// NewPages implements Format.
func (f *ChannelFormat) NewPages(n, tokens, heads, dim int, ops *kernels.Ops, mem *PageMem) Pages {
	if len(f.Keep) != heads {
		panic(fmt.Sprintf("kvcache: channel format for %d heads used with %d", len(f.Keep), heads))
	}
	return &channelPages{inner: f.Base.NewPages(n, tokens, heads, f.r(), ops, mem), keep: f.Keep, dim: dim, r: f.r()}
}

type channelPages struct {
	inner  Pages
	keep   [][]int
	dim, r int
}

// gather copies the kept channels of each head of row (heads·dim) to dst.
func (p *channelPages) gather(dst, row []float32, heads int) []float32 {
	dst = dst[:0]
	for h := 0; h < heads; h++ {
		for _, c := range p.keep[h] {
			dst = append(dst, row[h*p.dim+c])
		}
	}
	return dst
}

func (p *channelPages) Put(page, slot int, row []float32) {
	p.inner.Put(page, slot, p.gather(make([]float32, 0, len(p.keep)*p.r), row, len(p.keep)))
}

// Get implements Pages: the pruned channels read as zero.
func (p *channelPages) Get(page, slot int, row []float32) {
	small := make([]float32, len(p.keep)*p.r)
	p.inner.Get(page, slot, small)
	clear(row[:len(p.keep)*p.dim])
	for h, k := range p.keep {
		for j, c := range k {
			row[h*p.dim+c] = small[h*p.r+j]
		}
	}
}

// Scores implements Pages: q·k over the kept channels of head.
func (p *channelPages) Scores(s []float32, ss int, q []float32, page, head, from, to int) {
	g := len(q) / p.dim
	qs := make([]float32, 0, g*p.r)
	for j := 0; j < g; j++ {
		for _, c := range p.keep[head] {
			qs = append(qs, q[j*p.dim+c])
		}
	}
	p.inner.Scores(s, ss, qs, page, head, from, to)
}

// Mix implements Pages for a pruned row used as a value (the pruned
// channels contribute nothing).
func (p *channelPages) Mix(out, w []float32, ws int, page, head, from, to int) {
	g := len(out) / p.dim
	small := make([]float32, g*p.r)
	p.inner.Mix(small, w, ws, page, head, from, to)
	for j := 0; j < g; j++ {
		for i, c := range p.keep[head] {
			out[j*p.dim+c] += small[j*p.r+i]
		}
	}
}

func (p *channelPages) CopyPage(dst, src int) { p.inner.CopyPage(dst, src) }

// ChannelStats accumulates ThinK's channel importance on calibration
// text: it is a pass-through policy that reads every query (Select) and,
// with Keys, the keys stored. Importance of channel i of a KV head is
// ‖Q_i‖·‖K_i‖, the query norm over the head's GQA group.
type ChannelStats struct {
	FullPolicy
	nkv, kd int
	q2, k2  [][]float64 // per layer: [kvHead·kd + i]
	mu      chan struct{}
}

// NewChannelStats sizes the statistics for a model's shape.
func NewChannelStats(nLayer, nkv, kd int) *ChannelStats {
	s := &ChannelStats{nkv: nkv, kd: kd, mu: make(chan struct{}, 1)}
	for l := 0; l < nLayer; l++ {
		s.q2 = append(s.q2, make([]float64, nkv*kd))
		s.k2 = append(s.k2, make([]float64, nkv*kd))
	}
	return s
}

// Select implements PageSelector: it reads all, noting the query.
func (s *ChannelStats) Select(layer int, _ int32, _, kvHead int, q []float32, spans, dst []Span) []Span {
	s.mu <- struct{}{}
	for j := 0; j+s.kd <= len(q); j += s.kd {
		for i, v := range q[j : j+s.kd] {
			s.q2[layer][kvHead*s.kd+i] += float64(v) * float64(v)
		}
	}
	<-s.mu
	return append(dst, spans...)
}

// Keys adds the stored keys of positions [0, n) of seq in c.
func (s *ChannelStats) Keys(c *Cache, seq int32, n int) error {
	return c.MapKeys(seq, 0, n, func(layer, _ int, k []float32) {
		for i, v := range k {
			s.k2[layer][i] += float64(v) * float64(v)
		}
	})
}

// Keep is, per layer, the channel sets of r channels per KV head with the
// highest importance.
func (s *ChannelStats) Keep(r int) [][][]int {
	out := make([][][]int, len(s.q2))
	for l := range s.q2 {
		for h := 0; h < s.nkv; h++ {
			idx := make([]int, s.kd)
			imp := make([]float64, s.kd)
			for i := range idx {
				idx[i] = i
				imp[i] = math.Sqrt(s.q2[l][h*s.kd+i]) * math.Sqrt(s.k2[l][h*s.kd+i])
			}
			slices.SortStableFunc(idx, func(a, b int) int {
				if imp[a] != imp[b] {
					if imp[a] > imp[b] {
						return -1
					}
					return 1
				}
				return a - b
			})
			keep := slices.Clone(idx[:min(r, s.kd)])
			slices.Sort(keep)
			out[l] = append(out[l], keep)
		}
	}
	return out
}
