package kernels

import (
	"encoding/binary"
	"fmt"
)

// Attention over KV rows stored in ggml's 32-element blocks, read in
// place. Every block starts with a little-endian f16 scale d:
//
//	q8_0   (34 bytes): d, 32 int8 q; x = d·q
//	q4_0   (18 bytes): d, 16 bytes of nibbles; x = d·(n−8)
//	q4_1   (20 bytes): d, f16 min m, nibbles; x = d·n + m
//	q5_0   (22 bytes): d, 32 high bits qh, nibbles; x = d·(n|h<<4 − 16)
//	q5_1   (24 bytes): d, m, qh, nibbles; x = d·(n|h<<4) + m
//	iq4_nl (18 bytes): d, nibbles; x = d·kvalues[n]
//
// Element j < 16 is the low nibble of code byte j, element j+16 its high
// nibble; h of element e is bit e of qh. A row of n elements is n/32
// consecutive blocks; rows sit stride bytes apart. Nothing is expanded
// into a float copy of the cache.

// Block sizes of the formats, in bytes per 32 elements.
const (
	Q8_0Bytes   = 34
	Q4_0Bytes   = 18
	Q4_1Bytes   = 20
	Q5_0Bytes   = 22
	Q5_1Bytes   = 24
	IQ4_NLBytes = 18
)

// blockFmt names a block format (Q4_0 and IQ4_NL share a size).
type blockFmt uint8

const (
	fmtQ8_0 blockFmt = iota
	fmtQ4_0
	fmtQ4_1
	fmtQ5_0
	fmtQ5_1
	fmtIQ4_NL
)

var blockFmtBytes = [...]int{Q8_0Bytes, Q4_0Bytes, Q4_1Bytes, Q5_0Bytes, Q5_1Bytes, IQ4_NLBytes}

var blockFmtNames = [...]string{"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"}

// BlockAttn is the scoring and mixing kernel pair of one block format:
// Scores sets s[t] = q·row_t for t < len(s), Mix adds Σ_t w[t]·row_t to
// out; len(q) and len(out) are the row's elements, a multiple of 32.
type BlockAttn struct {
	Scores func(s, q []float32, k []byte, stride int)
	Mix    func(out, w []float32, v []byte, stride int)

	// Four GQA heads at once, where the instruction set has them; hs is
	// the bytes between the heads' scores or weights.
	scores4, mix4 func(a, b *float32, k *byte, n, nb, stride, hs int)
	rows          func(a, b *float32, k *byte, n, nb, stride int) // widens rows; nil where the set has none
	bb            int                                             // bytes a block
}

// CanWiden reports whether Widen has a kernel in this set.
func (a BlockAttn) CanWiden() bool { return a.rows != nil }

// Widen writes the n rows of d elements (stride bytes apart) as floats,
// row t at dst[t·d:(t+1)·d]: what tiled attention transposes. It panics
// where CanWiden is false.
func (a BlockAttn) Widen(dst []float32, k []byte, d, stride, n int) {
	if a.rows == nil || d <= 0 || d%32 != 0 || n <= 0 || len(dst) < n*d || len(k) < (n-1)*stride+d/32*a.bb || stride < d/32*a.bb {
		panic(fmt.Sprintf("kernels: Widen: %d rows of %d at stride %d from %d bytes into %d floats (kernel: %v)", n, d, stride, len(k), len(dst), a.rows != nil))
	}
	a.rows(&dst[0], nil, &k[0], n, d/32, stride)
}

// ScoresHeads sets s[j·ss+t] = q_j·row_t for t < n and the len(q)/d query
// vectors q_j = q[j·d:(j+1)·d] (a GQA group's heads, which share the
// rows): four heads at a time decode each block once where the kernels
// allow, one head at a time otherwise. The sums are Scores's up to the
// order of float additions.
func (a BlockAttn) ScoresHeads(s []float32, ss int, q []float32, d int, k []byte, stride, n int) {
	g := checkHeads("ScoresHeads", len(q), d, ss, n, len(s), 1<<62, 0)
	if n == 0 || g == 0 {
		return
	}
	j := 0
	if a.scores4 != nil && g >= 4 {
		checkBlockRows("ScoresHeads", n, d, len(k), stride, a.bb)
		for ; j+4 <= g; j += 4 {
			a.scores4(&s[j*ss], &q[j*d], &k[0], n, d/32, stride, 4*ss)
		}
	}
	for ; j < g; j++ {
		a.Scores(s[j*ss:j*ss+n], q[j*d:(j+1)*d], k, stride)
	}
}

// MixHeads adds Σ_t w_j[t]·row_t to out_j = out[j·d:(j+1)·d] for the
// len(out)/d heads j, weights w_j = w[j·ws:j·ws+n].
func (a BlockAttn) MixHeads(out []float32, d int, w []float32, ws int, v []byte, stride, n int) {
	g := checkHeads("MixHeads", len(out), d, ws, n, len(w), 1<<62, 0)
	if n == 0 || g == 0 {
		return
	}
	j := 0
	if a.mix4 != nil && g >= 4 {
		checkBlockRows("MixHeads", n, d, len(v), stride, a.bb)
		for ; j+4 <= g; j += 4 {
			a.mix4(&w[j*ws], &out[j*d], &v[0], n, d/32, stride, 4*ws)
		}
	}
	for ; j < g; j++ {
		a.Mix(out[j*d:(j+1)*d], w[j*ws:j*ws+n], v, stride)
	}
}

// AttnQ8_0 is o's kernel pair over q8_0 rows.
func (o *Ops) AttnQ8_0() BlockAttn { return blockAttnFor(o.name, fmtQ8_0) }

// AttnQ4_0 is o's kernel pair over q4_0 rows.
func (o *Ops) AttnQ4_0() BlockAttn { return blockAttnFor(o.name, fmtQ4_0) }

// AttnQ4_1 is o's kernel pair over q4_1 rows.
func (o *Ops) AttnQ4_1() BlockAttn { return blockAttnFor(o.name, fmtQ4_1) }

// AttnQ5_0 is o's kernel pair over q5_0 rows.
func (o *Ops) AttnQ5_0() BlockAttn { return blockAttnFor(o.name, fmtQ5_0) }

// AttnQ5_1 is o's kernel pair over q5_1 rows.
func (o *Ops) AttnQ5_1() BlockAttn { return blockAttnFor(o.name, fmtQ5_1) }

// AttnIQ4_NL is o's kernel pair over iq4_nl rows.
func (o *Ops) AttnIQ4_NL() BlockAttn { return blockAttnFor(o.name, fmtIQ4_NL) }

// checkBlockRows panics on a row layout the kernels would read past.
func checkBlockRows(name string, n, elems, bytes, stride, bb int) {
	if elems%32 != 0 {
		panic(fmt.Sprintf("kernels: %s: row of %d elements is not whole blocks", name, elems))
	}
	if n > 0 && (stride < elems/32*bb || (n-1)*stride+elems/32*bb > bytes) {
		panic(fmt.Sprintf("kernels: %s: %d rows of %d elements, stride %d, in %d bytes", name, n, elems, stride, bytes))
	}
}

// blockAttnRef is the reference pair of the format of bb bytes a block
// (q8_0 or q4_0).
func blockAttnRef(bb int) BlockAttn {
	if bb == Q8_0Bytes {
		return blockRef(fmtQ8_0)
	}
	return blockRef(fmtQ4_0)
}

// blockRef is the plain Go pair of format f.
func blockRef(f blockFmt) BlockAttn {
	bb := blockFmtBytes[f]
	var dot func(q []float32, k []byte) float32
	var axpy func(out []float32, a float32, v []byte)
	switch f {
	case fmtQ8_0:
		dot, axpy = DotQ8_0Ref, AxpyQ8_0Ref
	case fmtQ4_0:
		dot, axpy = DotQ4_0Ref, AxpyQ4_0Ref
	default:
		dot = func(q []float32, k []byte) float32 { return dotBlocksRef(f, q, k) }
		axpy = func(out []float32, a float32, v []byte) { axpyBlocksRef(f, out, a, v) }
	}
	return BlockAttn{Scores: blockDotRows("Scores", bb, dot), Mix: blockAxpyRows("Mix", bb, axpy)}
}

func blockDotRows(name string, bb int, dot func(q []float32, k []byte) float32) func(s, q []float32, k []byte, stride int) {
	return func(s, q []float32, k []byte, stride int) {
		checkBlockRows(name, len(s), len(q), len(k), stride, bb)
		rb := len(q) / 32 * bb
		for t := range s {
			s[t] = dot(q, k[t*stride:t*stride+rb])
		}
	}
}

func blockAxpyRows(name string, bb int, axpy func(out []float32, a float32, v []byte)) func(out, w []float32, v []byte, stride int) {
	return func(out, w []float32, v []byte, stride int) {
		checkBlockRows(name, len(w), len(out), len(v), stride, bb)
		rb := len(out) / 32 * bb
		for t, a := range w {
			axpy(out, a, v[t*stride:t*stride+rb])
		}
	}
}

// DotQ8_0Ref is Σ q[i]·x[i] for x the q8_0 blocks k: per block, the
// integer-weighted sum of q times the block's scale.
func DotQ8_0Ref(q []float32, k []byte) float32 {
	var s float32
	for b := 0; b*32 < len(q); b++ {
		blk := k[b*Q8_0Bytes : (b+1)*Q8_0Bytes]
		d := f16ToF32(binary.LittleEndian.Uint16(blk))
		var bs float32
		for j, v := range blk[2:] {
			bs += q[b*32+j] * float32(int8(v))
		}
		s += d * bs
	}
	return s
}

// AxpyQ8_0Ref adds a·x to out for x the q8_0 blocks v.
func AxpyQ8_0Ref(out []float32, a float32, v []byte) {
	for b := 0; b*32 < len(out); b++ {
		blk := v[b*Q8_0Bytes : (b+1)*Q8_0Bytes]
		ad := a * f16ToF32(binary.LittleEndian.Uint16(blk))
		for j, x := range blk[2:] {
			out[b*32+j] += ad * float32(int8(x))
		}
	}
}

// DotQ4_0Ref is Σ q[i]·x[i] for x the q4_0 blocks k.
func DotQ4_0Ref(q []float32, k []byte) float32 {
	var s float32
	for b := 0; b*32 < len(q); b++ {
		blk := k[b*Q4_0Bytes : (b+1)*Q4_0Bytes]
		d := f16ToF32(binary.LittleEndian.Uint16(blk))
		qb := q[b*32 : b*32+32]
		var bs float32
		for j, v := range blk[2:] {
			bs += qb[j]*float32(int32(v&15)-8) + qb[j+16]*float32(int32(v>>4)-8)
		}
		s += d * bs
	}
	return s
}

// AxpyQ4_0Ref adds a·x to out for x the q4_0 blocks v.
func AxpyQ4_0Ref(out []float32, a float32, v []byte) {
	for b := 0; b*32 < len(out); b++ {
		blk := v[b*Q4_0Bytes : (b+1)*Q4_0Bytes]
		ad := a * f16ToF32(binary.LittleEndian.Uint16(blk))
		ob := out[b*32 : b*32+32]
		for j, x := range blk[2:] {
			ob[j] += ad * float32(int32(x&15)-8)
			ob[j+16] += ad * float32(int32(x>>4)-8)
		}
	}
}

// kvaluesIQ4NL is ggml's iq4_nl codebook.
var kvaluesIQ4NL = [16]int8{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}

// decodeBlock expands one block of format f (q4_1, q5_0, q5_1, iq4_nl)
// into x, as ggml dequantizes it.
func decodeBlock(f blockFmt, blk []byte, x *[32]float32) {
	d := f16ToF32(binary.LittleEndian.Uint16(blk))
	var m float32
	var qh uint32
	qs := blk[2:18]
	switch f {
	case fmtQ4_1:
		m, qs = f16ToF32(binary.LittleEndian.Uint16(blk[2:])), blk[4:20]
	case fmtQ5_0:
		qh, qs = binary.LittleEndian.Uint32(blk[2:]), blk[6:22]
	case fmtQ5_1:
		m = f16ToF32(binary.LittleEndian.Uint16(blk[2:]))
		qh, qs = binary.LittleEndian.Uint32(blk[4:]), blk[8:24]
	}
	for j, c := range qs {
		lo, hi := int32(c&15), int32(c>>4)
		switch f {
		case fmtIQ4_NL:
			x[j] = d * float32(kvaluesIQ4NL[lo])
			x[j+16] = d * float32(kvaluesIQ4NL[hi])
		case fmtQ4_1:
			x[j] = float32(lo)*d + m
			x[j+16] = float32(hi)*d + m
		case fmtQ5_0:
			x[j] = float32(lo|int32(qh>>j&1)<<4-16) * d
			x[j+16] = float32(hi|int32(qh>>(j+16)&1)<<4-16) * d
		case fmtQ5_1:
			x[j] = float32(lo|int32(qh>>j&1)<<4)*d + m
			x[j+16] = float32(hi|int32(qh>>(j+16)&1)<<4)*d + m
		}
	}
}

// dotBlocksRef is Σ q[i]·x[i] for x the blocks k of format f.
func dotBlocksRef(f blockFmt, q []float32, k []byte) float32 {
	bb := blockFmtBytes[f]
	var x [32]float32
	var s float32
	for b := 0; b*32 < len(q); b++ {
		decodeBlock(f, k[b*bb:(b+1)*bb], &x)
		for j, v := range x {
			s += q[b*32+j] * v
		}
	}
	return s
}

// axpyBlocksRef adds a·x to out for x the blocks v of format f.
func axpyBlocksRef(f blockFmt, out []float32, a float32, v []byte) {
	bb := blockFmtBytes[f]
	var x [32]float32
	for b := 0; b*32 < len(out); b++ {
		decodeBlock(f, v[b*bb:(b+1)*bb], &x)
		for j, e := range x {
			out[b*32+j] += a * e
		}
	}
}
