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
	Q8_0 BlockFormat = iota + 1 // 8.5 bits an element: f16 d + 32 int8
	Q4_0                        // 4.5 bits an element: f16 d + 16 bytes of nibbles
)

// qk is the elements per block of both formats.
const qk = 32

func (f BlockFormat) qtype() quant.Type {
	switch f {
	case Q8_0:
		return quant.Q8_0
	case Q4_0:
		return quant.Q4_0
	}
	panic(fmt.Sprintf("kvcache: no block format %d", f))
}

func (f BlockFormat) String() string {
	switch f {
	case Q8_0:
		return "q8_0"
	case Q4_0:
		return "q4_0"
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
func (f BlockFormat) NewPages(n, tokens, heads, dim int, ops *kernels.Ops) Pages {
	if err := f.checkDim(dim); err != nil {
		panic(err)
	}
	hb := dim / qk * f.qtype().TypeSize()
	p := &blockPages{t: f.qtype(), ops: ops, dim: dim, headBytes: hb, rowBytes: heads * hb, pageBytes: tokens * heads * hb}
	p.data = make([]byte, n*p.pageBytes)
	p.dequant = dequantQ8_0
	if f == Q4_0 {
		p.dequant = dequantQ4_0
	}
	return p
}

// ParseFormat reads a KV storage format: a float DType (see ParseDType)
// or q8_0 / q4_0.
func ParseFormat(s string) (Format, error) {
	switch strings.ToLower(s) {
	case "q8_0", "q8":
		return Q8_0, nil
	case "q4_0", "q4":
		return Q4_0, nil
	}
	d, err := ParseDType(s)
	if err != nil {
		return nil, fmt.Errorf("kvcache: unknown KV format %q (want f16, f32, bf16, q8_0 or q4_0)", s)
	}
	return d, nil
}

// blockPages stores rows as ggml blocks. Scores and Mix expand one block
// at a time into a stack buffer and run the f32 kernels over it, so no
// page is ever expanded whole and concurrent Attends share no scratch.
// TODO(perf): a fused int8×f32 SIMD dot would skip the expansion.
type blockPages struct {
	t                              quant.Type
	ops                            *kernels.Ops
	dim                            int
	headBytes, rowBytes, pageBytes int
	data                           []byte
	dequant                        func(b []byte, y *[qk]float32)
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

func (p *blockPages) Scores(s []float32, ss int, q []float32, page, head, from, to int) {
	ts, nq := p.t.TypeSize(), len(q)/p.dim
	var y [qk]float32
	for t := from; t < to; t++ {
		k := p.head(page, t, head)
		for j := 0; j < nq; j++ {
			s[j*ss+t-from] = 0
		}
		for b := 0; b*ts < len(k); b++ {
			p.dequant(k[b*ts:], &y)
			for j := 0; j < nq; j++ {
				s[j*ss+t-from] += p.ops.DotF32(q[j*p.dim+b*qk:][:qk], y[:])
			}
		}
	}
}

func (p *blockPages) Mix(out, w []float32, ws int, page, head, from, to int) {
	ts, nq := p.t.TypeSize(), len(out)/p.dim
	var y [qk]float32
	for t := from; t < to; t++ {
		v := p.head(page, t, head)
		for b := 0; b*ts < len(v); b++ {
			p.dequant(v[b*ts:], &y)
			for j := 0; j < nq; j++ {
				p.ops.AxpyF32(out[j*p.dim+b*qk:][:qk], w[j*ws+t-from], y[:])
			}
		}
	}
}

func (p *blockPages) CopyPage(dst, src int) {
	copy(p.data[dst*p.pageBytes:(dst+1)*p.pageBytes], p.data[src*p.pageBytes:(src+1)*p.pageBytes])
}

// dequantQ8_0 and dequantQ4_0 expand one block as quant.Dequantize does,
// to the bit (the tests hold them to it), without its per-call checks.
func dequantQ8_0(b []byte, y *[qk]float32) {
	d := quant.F16ToF32(binary.LittleEndian.Uint16(b))
	qs := b[2 : 2+qk]
	for j := range y {
		y[j] = float32(int8(qs[j])) * d
	}
}

func dequantQ4_0(b []byte, y *[qk]float32) {
	d := quant.F16ToF32(binary.LittleEndian.Uint16(b))
	qs := b[2 : 2+qk/2]
	for j := 0; j < qk/2; j++ {
		y[j] = float32(int32(qs[j]&0xf)-8) * d
		y[j+qk/2] = float32(int32(qs[j]>>4)-8) * d
	}
}
