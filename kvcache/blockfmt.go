package kvcache

import (
	"encoding/binary"
	"fmt"
	"strings"

	"pagoda/kernels"
	"pagoda/quant"
)

// BlockFormat is a ggml block-quantized KV format: blocks of 32 elements
// along the head dimension, each with its own f16 scale inside the block,
// so a row needs no per-page metadata and the bytes match llama.cpp's
// --cache-type-k/-v of the same name.
type BlockFormat uint8

const (
	Q8_0   BlockFormat = iota + 1 // 8.5 bits an element: f16 d + 32 int8
	Q4_0                          // 4.5 bits an element: f16 d + 16 bytes of nibbles
	Q4_1                          // 5 bits: f16 d and min + nibbles
	Q5_0                          // 5.5 bits: f16 d + nibbles + 32 high bits
	Q5_1                          // 6 bits: f16 d and min + nibbles + high bits
	IQ4_NL                        // 4.5 bits: f16 d + nibbles indexing a non-linear table
)

// blockFormats are the block formats by name, in ggml's spelling.
var blockFormats = []BlockFormat{Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL}

// qk is the elements per block of both formats.
const qk = 32

func (f BlockFormat) qtype() quant.Type {
	switch f {
	case Q8_0:
		return quant.Q8_0
	case Q4_0:
		return quant.Q4_0
	case Q4_1:
		return quant.Q4_1
	case Q5_0:
		return quant.Q5_0
	case Q5_1:
		return quant.Q5_1
	case IQ4_NL:
		return quant.IQ4_NL
	}
	panic(fmt.Sprintf("kvcache: no block format %d", f))
}

func (f BlockFormat) String() string {
	if f >= Q8_0 && f <= IQ4_NL {
		return strings.ToLower(f.qtype().String())
	}
	return fmt.Sprintf("BlockFormat(%d)", f)
}

// RowBytes implements Format; it counts the in-block scales.
func (f BlockFormat) RowBytes(heads, dim int) int { return heads * dim / qk * f.qtype().TypeSize() }

// PageMetaBytes implements Format: the scales live in the blocks.
func (f BlockFormat) PageMetaBytes(tokens, heads, dim int) int { return 0 }

// checkDim rejects a head dimension that would split a block across heads.
func (f BlockFormat) checkDim(dim int) error {
	if dim%qk != 0 {
		return fmt.Errorf("kvcache: %v needs head dims that are multiples of %d, not %d", f, qk, dim)
	}
	return nil
}

// NewPages implements Format.
func (f BlockFormat) NewPages(n, tokens, heads, dim int, ops *kernels.Ops, mem *PageMem) Pages {
	if err := f.checkDim(dim); err != nil {
		panic(err)
	}
	hb := dim / qk * f.qtype().TypeSize()
	p := &blockPages{t: f.qtype(), dim: dim, headBytes: hb, rowBytes: heads * hb, pageBytes: tokens * heads * hb}
	p.data = PageArray[byte](mem, n*p.pageBytes)
	if ops == nil {
		ops = kernels.Best()
	}
	switch f {
	case Q8_0:
		p.attn = ops.AttnQ8_0()
	case Q4_0:
		p.attn = ops.AttnQ4_0()
	case Q4_1:
		p.attn = ops.AttnQ4_1()
	case Q5_0:
		p.attn = ops.AttnQ5_0()
	case Q5_1:
		p.attn = ops.AttnQ5_1()
	case IQ4_NL:
		p.attn = ops.AttnIQ4_NL()
	}
	if ops.Tiled() && p.attn.CanWiden() && tokens%kernels.TileSlots == 0 {
		p.ops, p.tokens = ops, tokens
	}
	return p
}

// ParseFormat reads a KV storage format: a float DType (see ParseDType),
// q8_0 / q4_0, or kivi2 / kivi4 with options (see KIVI).
func ParseFormat(s string) (Format, error) {
	if strings.HasPrefix(strings.ToLower(s), "kivi") {
		return parseKIVI(s)
	}
	switch strings.ToLower(s) {
	case "q8":
		return Q8_0, nil
	case "q4":
		return Q4_0, nil
	}
	for _, f := range blockFormats {
		if strings.EqualFold(s, f.String()) {
			return f, nil
		}
	}
	d, err := ParseDType(s)
	if err != nil {
		return nil, fmt.Errorf("kvcache: unknown KV format %q (want f16, f32, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, kivi2 or kivi4)", s)
	}
	return d, nil
}

// blockPages stores rows as ggml blocks. Mix reads the blocks in place
// with the fused kernels of package kernels (codes times the weight, one
// scale and min per block), and so does Scores; attention that tiles the
// keys (tiledPages) widens a page's keys once for all its queries.
type blockPages struct {
	t                              quant.Type
	dim                            int
	headBytes, rowBytes, pageBytes int
	data                           []byte
	attn                           kernels.BlockAttn
	ops                            *kernels.Ops // set where the keys tile (tiledPages)
	tokens                         int
}

// Tiles implements tiledPages.
func (p *blockPages) Tiles() bool { return p.ops != nil }

// Prefetch implements prefetcher.
func (p *blockPages) Prefetch(page, head int) {
	lo := page*p.pageBytes + head*p.headBytes
	kernels.PrefetchRows(p.data[lo:lo+p.headBytes], p.pageBytes/p.rowBytes, p.rowBytes, p.headBytes)
}

// TileK implements tiledPages: the page's rows of head widened into
// scratch, then transposed.
func (p *blockPages) TileK(kt, scratch []float32, page, head int) {
	p.attn.Widen(scratch, p.rows(page, head, 0, p.tokens), p.dim, p.rowBytes, p.tokens)
	p.ops.TileKF32(kt, scratch, p.dim, p.dim, p.tokens)
}

// nanF16 is the scale a block with a NaN or Inf gets: the row reads back
// as NaN, as an f16 cache would keep it, rather than as made-up numbers.
const nanF16 = 0x7e00

func (p *blockPages) Put(page, slot int, row []float32) {
	o := page*p.pageBytes + slot*p.rowBytes
	dst := p.data[o : o+p.rowBytes]
	if quant.QuantizeInto(p.t, row[:p.rowBytes/p.t.TypeSize()*qk], dst) == nil {
		return
	}
	ts := p.t.TypeSize()
	for b := 0; b < len(dst); b += ts {
		i := b / ts * qk
		if quant.QuantizeInto(p.t, row[i:i+qk], dst[b:b+ts]) != nil {
			clear(dst[b : b+ts])
			binary.LittleEndian.PutUint16(dst[b:], nanF16)
		}
	}
}

func (p *blockPages) Get(page, slot int, row []float32) {
	o := page*p.pageBytes + slot*p.rowBytes
	if err := quant.Dequantize(p.t, p.data[o:o+p.rowBytes], row[:p.rowBytes/p.t.TypeSize()*qk]); err != nil {
		panic(err)
	}
}

// head is the bytes of token t's row for KV head h in page.
func (p *blockPages) head(page, t, h int) []byte {
	o := page*p.pageBytes + t*p.rowBytes + h*p.headBytes
	return p.data[o : o+p.headBytes]
}

// rows is the byte range holding head's rows [from, to) of page.
func (p *blockPages) rows(page, head, from, to int) []byte {
	lo := page*p.pageBytes + from*p.rowBytes + head*p.headBytes
	return p.data[lo : lo+(to-from-1)*p.rowBytes+p.headBytes]
}

func (p *blockPages) Scores(s []float32, ss int, q []float32, page, head, from, to int) {
	if to <= from {
		return
	}
	p.attn.ScoresHeads(s, ss, q, p.dim, p.rows(page, head, from, to), p.rowBytes, to-from)
}

func (p *blockPages) Mix(out, w []float32, ws int, page, head, from, to int) {
	if to <= from {
		return
	}
	p.attn.MixHeads(out, p.dim, w, ws, p.rows(page, head, from, to), p.rowBytes, to-from)
}

func (p *blockPages) CopyPage(dst, src int) {
	copy(p.data[dst*p.pageBytes:(dst+1)*p.pageBytes], p.data[src*p.pageBytes:(src+1)*p.pageBytes])
}
