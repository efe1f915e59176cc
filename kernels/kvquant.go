package kernels

import (
	"encoding/binary"
	"fmt"
)

// Attention over KV rows stored in ggml's q8_0 and q4_0 blocks, read in
// place: each 32-element block is a little-endian f16 scale d followed by
// 32 int8 (q8_0, x = d·q) or 16 bytes of nibbles (q4_0, element j in the
// low nibble of byte j and element j+16 in its high nibble, x = d·(n−8)).
// A row of n elements is n/32 consecutive blocks; rows sit stride bytes
// apart. Nothing is expanded into a float copy of the cache.

// Block sizes of the formats, in bytes per 32 elements.
const (
	Q8_0Bytes = 34
	Q4_0Bytes = 18
)

// BlockAttn is the scoring and mixing kernel pair of one block format:
// Scores sets s[t] = q·row_t for t < len(s), Mix adds Σ_t w[t]·row_t to
// out; len(q) and len(out) are the row's elements, a multiple of 32.
type BlockAttn struct {
	Scores func(s, q []float32, k []byte, stride int)
	Mix    func(out, w []float32, v []byte, stride int)
}

// AttnQ8_0 is o's kernel pair over q8_0 rows.
func (o *Ops) AttnQ8_0() BlockAttn { return blockAttnFor(o.name, Q8_0Bytes) }

// AttnQ4_0 is o's kernel pair over q4_0 rows.
func (o *Ops) AttnQ4_0() BlockAttn { return blockAttnFor(o.name, Q4_0Bytes) }

// checkBlockRows panics on a row layout the kernels would read past.
func checkBlockRows(name string, n, elems, bytes, stride, bb int) {
	if elems%32 != 0 {
		panic(fmt.Sprintf("kernels: %s: row of %d elements is not whole blocks", name, elems))
	}
	if n > 0 && (stride < elems/32*bb || (n-1)*stride+elems/32*bb > bytes) {
		panic(fmt.Sprintf("kernels: %s: %d rows of %d elements, stride %d, in %d bytes", name, n, elems, stride, bytes))
	}
}

func blockAttnRef(bb int) BlockAttn {
	dot, axpy := DotQ8_0Ref, AxpyQ8_0Ref
	if bb == Q4_0Bytes {
		dot, axpy = DotQ4_0Ref, AxpyQ4_0Ref
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
