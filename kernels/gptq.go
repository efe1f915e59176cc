package kernels

import (
	"encoding/binary"
	"math"
	"sync"

	"pagoda/quant"
)

// GPTQ/AWQ weights (quant.GQ4, quant.GQ8: w = d·(q − z) per 32-column
// block) run through the existing integer kernels, packed once:
//
//	GQ4: packQ4SM, S = d, M = −z·d (Q4_1's kernels).
//	GQ8: packQ8C, the codes as they are (q − 128 is Q8_0's signed value,
//	     d its scale: Q8_0's kernels), plus, unless every zero is 128, a
//	     correction d·(128 − z)·dx·Σq per block added after the product
//	     (addZeroFix). The SM16 kernels would read 8-bit codes too, but
//	     AVX2's VPMADDUBSW saturates on pairs of 255·127.
//
// S·u + M and d·(128 − z) are exact in float32 (d has 11 significant bits,
// u and z at most 9), so packing loses nothing; activations are quantized
// to Q8_0 as for Q4_1 and Q8_0 weights. For act-order (Matrix.Perm) the
// input is gathered per product, before quantization.

// packGQ chooses the packed kind of a GQ4/GQ8 matrix.
func packGQ(m *Matrix) packed {
	if m.Type == quant.GQ4 {
		return packed{kind: packQ4SM, act: actQ8_0, block: 32, k: 1}
	}
	return packed{kind: packQ8C, act: actQ8_0, block: 32, k: 128}
}

// gqZeroFix is d·(128 − z) for each row and block of the GQ8 matrix m,
// as an F32 matrix (rows × blocks) for the float kernels.
func gqZeroFix(m *Matrix) *Matrix {
	nb := m.Cols / 32
	data := make([]byte, 4*m.Rows*nb)
	for r := 0; r < m.Rows; r++ {
		row := m.Row(r)
		for b := 0; b < nb; b++ {
			d := f16ToF32(binary.LittleEndian.Uint16(row[36*b:]))
			z := int32(binary.LittleEndian.Uint16(row[36*b+2:]))
			binary.LittleEndian.PutUint32(data[4*(r*nb+b):], math.Float32bits(d*float32(128-z)))
		}
	}
	fix, err := NewMatrix(quant.F32, m.Rows, nb, data)
	if err != nil {
		panic(err)
	}
	return fix
}

func growF32(b *[]float32, n int) []float32 {
	if cap(*b) < n {
		*b = make([]float32, n)
	}
	*b = (*b)[:n]
	return *b
}

// gqZerosAll reports whether every block of the GQ8 matrix m has zero z.
func gqZerosAll(m *Matrix, z uint16) bool {
	for r := 0; r < m.Rows; r++ {
		row := m.Row(r)
		for b := 0; b < len(row); b += 36 {
			if binary.LittleEndian.Uint16(row[b+2:]) != z {
				return false
			}
		}
	}
	return true
}

// packRowGQ8C is packRowQ8C for GQ8 blocks whose zero is 128: the codes
// are already Q8_0's q+128.
func packRowGQ8C(dst, src []byte, r, nb int) {
	for b := 0; b < nb; b++ {
		s := src[b*36 : b*36+36]
		t := dst[b*544 : b*544+544]
		t[512+2*r], t[513+2*r] = s[0], s[1]
		for k := 0; k < 8; k++ {
			copy(t[k*64+r*4:k*64+r*4+4], s[4+4*k:8+4*k])
		}
	}
}

// decodeGQ fills d with a GQ4/GQ8 row: codes, S = d and M = −z·d per 16.
func (d *smRow) decodeGQ(t quant.Type, src []byte) {
	ts := t.TypeSize()
	var q [32]uint8
	for i := 0; i < len(d.q)/32; i++ {
		sb, z := quant.GQBlock(t, src[i*ts:(i+1)*ts], &q)
		copy(d.q[32*i:32*i+32], q[:])
		s := f16ToF32(sb)
		m := -float32(z) * s
		d.s[2*i], d.s[2*i+1] = s, s
		d.m[2*i], d.m[2*i+1] = m, m
	}
}

var gatherPool = sync.Pool{New: func() any { return new([]float32) }}

// gatherCols returns x (batch rows of w.Cols) with each row's elements in
// w's stored column order: element j of a row is x[Perm[j]]. Put the
// result back with putGather.
func gatherCols(w *Matrix, x []float32, batch int) *[]float32 {
	buf := gatherPool.Get().(*[]float32)
	n := batch * w.Cols
	if cap(*buf) < n {
		*buf = make([]float32, n)
	}
	*buf = (*buf)[:n]
	perm := w.Perm[:w.Cols]
	for b := 0; b < batch; b++ {
		src := x[b*w.Cols : (b+1)*w.Cols]
		dst := (*buf)[b*w.Cols : (b+1)*w.Cols]
		for j, k := range perm {
			dst[j] = src[k]
		}
	}
	return buf
}

func putGather(b *[]float32) { gatherPool.Put(b) }

// samePerm reports whether two matrices gather their input the same way.
func samePerm(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	return len(a) == 0 || &a[0] == &b[0]
}
