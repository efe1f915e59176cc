package kvcache

import (
	"fmt"
	"unsafe"

	"pagoda/kernels"
)

// Format is how a layer group stores its K (or V) rows: the bytes a token
// takes, and the page storage that computes over them. F32, F16 and BF16
// are formats; a quantized one (q8_0, KIVI) keeps its scales as per-page
// metadata inside the Pages it makes.
type Format interface {
	String() string
	// RowBytes is the storage of one token's row: heads vectors of dim.
	RowBytes(heads, dim int) int
	// PageMetaBytes is the storage a page of tokens rows needs beyond its
	// rows (scales, zero points; 0 for plain floats).
	PageMetaBytes(tokens, heads, dim int) int
	// NewPages allocates n pages of tokens rows each, computing with ops,
	// their arrays from mem (PageArray; mem may be nil).
	NewPages(n, tokens, heads, dim int, ops *kernels.Ops, mem *PageMem) Pages
}

// Pages is the storage of one layer's K or V rows, page by page, and the
// attention arithmetic over it. The cache calls it once per page and KV
// head, never per position, so the element type is chosen once per page.
type Pages interface {
	// Put stores row (heads·dim floats) as token slot of page.
	Put(page, slot int, row []float32)
	// Get reads token slot of page back into row (heads·dim floats), as
	// the format stores it: keys re-rotated to new positions and
	// evaluation read through it.
	Get(page, slot int, row []float32)
	// Scores sets s[j·ss+t-from] = q_j·k_t for the query vectors q_j of q
	// (dim floats each: the heads of a GQA group, consecutive) and the
	// tokens t in [from, to) of page, KV head head.
	Scores(s []float32, ss int, q []float32, page, head, from, to int)
	// Mix adds Σ_t w[j·ws+t-from]·v_t to out_j (dim floats each) over the
	// tokens t in [from, to) of page, KV head head.
	Mix(out, w []float32, ws int, page, head, from, to int)
	// CopyPage copies page src, metadata included, over page dst.
	CopyPage(dst, src int)
}

// RowBytes implements Format.
func (d DType) RowBytes(heads, dim int) int { return heads * dim * d.Size() }

// PageMetaBytes implements Format: plain floats need none.
func (d DType) PageMetaBytes(tokens, heads, dim int) int { return 0 }

// NewPages implements Format.
func (d DType) NewPages(n, tokens, heads, dim int, ops *kernels.Ops, mem *PageMem) Pages {
	g := pageGeom{dim: dim, rowLen: heads * dim, pageLen: tokens * heads * dim}
	switch d {
	case F32:
		cp := func(dst, src []float32) { copy(dst, src) }
		return tiled(&floatPages[float32]{pageGeom: g, data: PageArray[float32](mem, n*g.pageLen),
			put: cp, get: cp, scores: ops.AttnScoresHeadsF32, mix: ops.AttnMixHeadsF32, tile: ops.TileKF32}, ops, tokens)
	case F16:
		return tiled(&floatPages[uint16]{pageGeom: g, data: PageArray[uint16](mem, n*g.pageLen),
			put: ops.F32ToF16Row, get: ops.F16ToF32Row, scores: ops.AttnScoresHeadsF16, mix: ops.AttnMixHeadsF16, tile: ops.TileKF16}, ops, tokens)
	case BF16:
		return tiled(&floatPages[uint16]{pageGeom: g, data: PageArray[uint16](mem, n*g.pageLen),
			put: ops.F32ToBF16Row, get: ops.BF16ToF32Row, scores: ops.AttnScoresHeadsBF16, mix: ops.AttnMixHeadsBF16, tile: ops.TileKBF16}, ops, tokens)
	}
	panic(fmt.Sprintf("kvcache: no pages for %v", d))
}

// tiled keeps p's key tiling only where the kernels can use it: a set
// with the tiled kernels, heads a multiple of 16 wide, whole tiles a page.
func tiled[E float32 | uint16](p *floatPages[E], ops *kernels.Ops, tokens int) *floatPages[E] {
	if !ops.Tiled() || p.dim%16 != 0 || tokens%kernels.TileSlots != 0 {
		p.tile = nil
	}
	p.tokens = tokens
	return p
}

// pageGeom locates rows in a flat array of pages: heads interleaved in a
// token's row, so one head's rows sit rowLen apart.
type pageGeom struct{ dim, rowLen, pageLen int }

// rows is the element range holding head's rows [from, to) of page.
func (g *pageGeom) rows(page, head, from, to int) (lo, hi int) {
	lo = page*g.pageLen + from*g.rowLen + head*g.dim
	return lo, lo + (to-from-1)*g.rowLen + g.dim
}

// floatPages stores f32, f16 or bf16 elements (E is the stored word); the
// kernels are picked at construction, so the page loop has no dtype switch.
// They take all the query heads of a GQA group in one call.
type floatPages[E float32 | uint16] struct {
	pageGeom
	data   []E
	put    func(dst []E, src []float32)
	get    func(dst []float32, src []E)
	scores func(s []float32, ss int, q []float32, d int, k []E, stride, n int)
	mix    func(out []float32, d int, w []float32, ws int, v []E, stride, n int)
	tile   func(kt []float32, k []E, stride, d, n int) // nil: no tiled scores
	tokens int
}

// Tiles implements tiledPages.
func (p *floatPages[E]) Tiles() bool { return p.tile != nil }

// Prefetch implements prefetcher.
func (p *floatPages[E]) Prefetch(page, head int) {
	var e E
	w := int(unsafe.Sizeof(e))
	lo := page*p.pageLen + head*p.dim
	kernels.PrefetchRows(p.data[lo:lo+p.dim], p.pageLen/p.rowLen, p.rowLen*w, p.dim*w)
}

// TileK implements tiledPages; floats need no scratch.
func (p *floatPages[E]) TileK(kt, _ []float32, page, head int) {
	lo := page*p.pageLen + head*p.dim
	p.tile(kt, p.data[lo:lo+(p.tokens-1)*p.rowLen+p.dim], p.rowLen, p.dim, p.tokens)
}

func (p *floatPages[E]) Put(page, slot int, row []float32) {
	o := page*p.pageLen + slot*p.rowLen
	p.put(p.data[o:o+p.rowLen], row[:p.rowLen])
}

func (p *floatPages[E]) Get(page, slot int, row []float32) {
	o := page*p.pageLen + slot*p.rowLen
	p.get(row[:p.rowLen], p.data[o:o+p.rowLen])
}

func (p *floatPages[E]) Scores(s []float32, ss int, q []float32, page, head, from, to int) {
	if to <= from {
		return
	}
	lo, hi := p.rows(page, head, from, to)
	p.scores(s, ss, q, p.dim, p.data[lo:hi], p.rowLen, to-from)
}

func (p *floatPages[E]) Mix(out, w []float32, ws int, page, head, from, to int) {
	if to <= from {
		return
	}
	lo, hi := p.rows(page, head, from, to)
	p.mix(out, p.dim, w, ws, p.data[lo:hi], p.rowLen, to-from)
}

func (p *floatPages[E]) CopyPage(dst, src int) {
	copy(p.data[dst*p.pageLen:(dst+1)*p.pageLen], p.data[src*p.pageLen:(src+1)*p.pageLen])
}
