//go:build amd64 && !purego

package kernels

import (
	"math"
	"unsafe"

	"pagoda/quant"
)

// The AVX2 kernels take whole 8-element steps; the wrappers finish the last
// n%8 elements with the reference code.

func dotF32AVX2Vec(a, b []float32) float32 {
	n := len(a)
	if n == 0 {
		return 0
	}
	_ = b[n-1]
	m := n &^ 7
	var s float32
	if m > 0 {
		s = dotF32AVX2(&a[0], unsafe.Pointer(&b[0]), m)
	}
	return s + DotF32Ref(a[m:], b[m:n])
}

func dotF16AVX2Vec(q []float32, k []uint16) float32 {
	n := len(q)
	if n == 0 {
		return 0
	}
	_ = k[n-1]
	m := n &^ 7
	var s float32
	if m > 0 {
		s = dotF16AVX2(&q[0], unsafe.Pointer(&k[0]), m)
	}
	return s + DotF16Ref(q[m:], k[m:n])
}

func dotBF16AVX2Vec(q []float32, k []uint16) float32 {
	n := len(q)
	if n == 0 {
		return 0
	}
	_ = k[n-1]
	m := n &^ 7
	var s float32
	if m > 0 {
		s = dotBF16AVX2(&q[0], unsafe.Pointer(&k[0]), m)
	}
	return s + DotBF16Ref(q[m:], k[m:n])
}

func axpyF32AVX2Vec(out []float32, a float32, x []float32) {
	n := len(out)
	if n == 0 {
		return
	}
	_ = x[n-1]
	if m := n &^ 7; m > 0 {
		axpyF32AVX2(&out[0], a, unsafe.Pointer(&x[0]), m)
		out, x = out[m:], x[m:n]
	}
	AxpyF32Ref(out, a, x)
}

func axpyF16AVX2Vec(out []float32, a float32, v []uint16) {
	n := len(out)
	if n == 0 {
		return
	}
	_ = v[n-1]
	if m := n &^ 7; m > 0 {
		axpyF16AVX2(&out[0], a, unsafe.Pointer(&v[0]), m)
		out, v = out[m:], v[m:n]
	}
	AxpyF16Ref(out, a, v)
}

func axpyBF16AVX2Vec(out []float32, a float32, v []uint16) {
	n := len(out)
	if n == 0 {
		return
	}
	_ = v[n-1]
	if m := n &^ 7; m > 0 {
		axpyBF16AVX2(&out[0], a, unsafe.Pointer(&v[0]), m)
		out, v = out[m:], v[m:n]
	}
	AxpyBF16Ref(out, a, v)
}

func rmsNormAVX2(out, x, w []float32, eps float32) {
	ss := dotF32AVX2Vec(x, x)
	scale := float32(1 / sqrt64(float64(ss)/float64(len(x))+float64(eps)))
	if w == nil {
		for i, v := range x {
			out[i] = v * scale
		}
		return
	}
	w = w[:len(x)]
	for i, v := range x {
		out[i] = v * scale * w[i]
	}
}

func setFloatAVX2(o *Ops) {
	o.dotF32 = dotF32AVX2Vec
	o.dotF16 = dotF16AVX2Vec
	o.dotBF16 = dotBF16AVX2Vec
	o.axpyF32 = axpyF32AVX2Vec
	o.axpyF16 = axpyF16AVX2Vec
	o.axpyBF16 = axpyBF16AVX2Vec
	o.rmsNorm = rmsNormAVX2
	// No AVX2 strided-row kernels yet: a loop of the SIMD dot and axpy is
	// an order of magnitude faster than the Go references they replace.
	o.attnScoresF32, o.attnMixF32 = dotRows(o.dotF32), axpyRows(o.axpyF32)
	o.attnScoresF16, o.attnMixF16 = dotRows(o.dotF16), axpyRows(o.axpyF16)
	o.attnScoresBF16, o.attnMixBF16 = dotRows(o.dotBF16), axpyRows(o.axpyBF16)
}

// dotRows is a strided-row score kernel made of one dot product per row.
func dotRows[E float32 | uint16](dot func([]float32, []E) float32) func(s, q []float32, k []E, stride int) {
	return func(s, q []float32, k []E, stride int) {
		for t := range s {
			s[t] = dot(q, k[t*stride:t*stride+len(q)])
		}
	}
}

// axpyRows is a strided-row mix kernel made of one axpy per row.
func axpyRows[E float32 | uint16](axpy func([]float32, float32, []E)) func(out, w []float32, v []E, stride int) {
	return func(out, w []float32, v []E, stride int) {
		for t, a := range w {
			axpy(out, a, v[t*stride:t*stride+len(out)])
		}
	}
}

// matMulFloatAVX2 is matMulFloatAVX512 with 8-lane 4×2 tiles.
func (o *Ops) matMulFloatAVX2(p *Pool, w *Matrix, x, out []float32, batch int) {
	var fns *[3]floatKernel
	switch w.Type {
	case quant.F32:
		fns = &gemmF32_avx2
	case quant.F16:
		fns = &gemmF16_avx2
	case quant.BF16:
		fns = &gemmBF16_avx2
	}
	if fns == nil || w.Cols%8 != 0 || w.Cols == 0 || batch <= 0 {
		matMulRows(p, w, x, out, batch, o.dotF32)
		return
	}
	w.mustValid()
	_ = x[batch*w.Cols-1]
	_ = out[batch*w.Rows-1]
	rows, cols := w.Rows, w.Cols
	quads := (rows + 3) / 4
	xs := cols * 4
	chunk := max(2, (256<<10)/xs&^1)
	p.For(quads, 4, func(lo, hi int) {
		var tmp [8 * 8]float32
		for b0 := 0; b0 < batch; b0 += chunk {
			b1 := min(batch, b0+chunk)
			for q := lo; q < hi; q++ {
				r0 := 4 * q
				if r0+4 > rows {
					for r := r0; r < rows; r++ {
						wr := w.Row(r)
						for b := b0; b < b1; b++ {
							out[b*rows+r] = o.dotRow(w.Type, wr, x[b*cols:(b+1)*cols])
						}
					}
					continue
				}
				wp := &w.Data[r0*w.RowBytes]
				for b := b0; b < b1; b += 2 {
					n := min(2, b1-b)
					fns[n](wp, w.RowBytes, &x[b*cols], xs, cols/8, &tmp[0])
					for i := 0; i < n; i++ {
						for r := 0; r < 4; r++ {
							v := tmp[(4*i+r)*8:]
							out[(b+i)*rows+r0+r] = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]))
						}
					}
				}
			}
		}
	})
}

func sqrt64(v float64) float64 { return math.Sqrt(v) }
