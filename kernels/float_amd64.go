//go:build amd64 && !purego

package kernels

import (
	"unsafe"

	"pagoda/quant"
)

// floatKernel multiplies 4 weight rows by n activation rows over nblk·16
// columns. The AVX-512 kernels write the 4·n dot products to out (row i's
// at out[4i:4i+4]); the AVX2 ones leave 4·n vectors of 8 partial sums.
type floatKernel func(w *byte, ws int, x *float32, xs int, nblk int, out *float32)

// matMulFloat is the float-weight path of o's instruction set.
func (o *Ops) matMulFloat(p *Pool, w *Matrix, x, out []float32, batch int) {
	if o.avx2 {
		o.matMulFloatAVX2(p, w, x, out, batch)
		return
	}
	o.matMulFloatAVX512(p, w, x, out, batch)
}

// matMulFloatAVX512 runs F32, F16 and BF16 weights through the 4×n FMA
// micro-kernels: each weight vector is converted once and used against up to
// four activation rows held in registers.
func (o *Ops) matMulFloatAVX512(p *Pool, w *Matrix, x, out []float32, batch int) {
	var fns *[5]floatKernel
	switch w.Type {
	case quant.F32:
		fns = &gemmF32Fns
	case quant.F16:
		fns = &gemmF16Fns
	case quant.BF16:
		fns = &gemmBF16Fns
	}
	if fns == nil || w.Cols%16 != 0 || w.Cols == 0 || batch <= 0 {
		matMulRows(p, w, x, out, batch, o.dotF32)
		return
	}
	w.mustValid()
	_ = x[batch*w.Cols-1]
	_ = out[batch*w.Rows-1]
	rows, cols := w.Rows, w.Cols
	quads := (rows + 3) / 4
	xs := cols * 4
	// Activation rows per pass: keep the chunk within L2.
	chunk := max(4, min(64, (512<<10)/xs&^3))
	// With several activation tiles per weight quad, convert the quad's
	// half-precision rows to float32 once and run the F32 kernel on them:
	// the conversions otherwise compete with the FMAs for the same ports.
	convert := w.Type != quant.F32 && batch > 4
	p.For(quads, 4, func(lo, hi int) {
		var res [16]float32
		var wf []float32
		if convert {
			wf = make([]float32, 4*cols)
		}
		for b0 := 0; b0 < batch; b0 += chunk {
			b1 := min(batch, b0+chunk)
			for q := lo; q < hi; q++ {
				r0 := 4 * q
				if r0+4 > rows {
					// Ragged last rows: one row at a time.
					for r := r0; r < rows; r++ {
						wr := w.Row(r)
						for b := b0; b < b1; b++ {
							out[b*rows+r] = o.dotRow(w.Type, wr, x[b*cols:(b+1)*cols])
						}
					}
					continue
				}
				wp, ws, kern := &w.Data[r0*w.RowBytes], w.RowBytes, fns
				if convert {
					for r := 0; r < 4; r++ {
						src := unsafe.Slice((*uint16)(unsafe.Pointer(&w.Data[(r0+r)*w.RowBytes])), cols)
						if w.Type == quant.F16 {
							o.f16ToF32Row(wf[r*cols:(r+1)*cols], src)
						} else {
							o.bf16ToF32Row(wf[r*cols:(r+1)*cols], src)
						}
					}
					wp, ws, kern = (*byte)(unsafe.Pointer(&wf[0])), cols*4, &gemmF32Fns
				}
				for b := b0; b < b1; b += 4 {
					n := min(4, b1-b)
					kern[n](wp, ws, &x[b*cols], xs, cols/16, &res[0])
					for i := 0; i < n; i++ {
						copy(out[(b+i)*rows+r0:(b+i)*rows+r0+4], res[4*i:4*i+4])
					}
				}
			}
		}
	})
}

// dotRow is one weight row (stored as t) against float32 x.
func (o *Ops) dotRow(t quant.Type, row []byte, x []float32) float32 {
	switch t {
	case quant.F16:
		return o.dotF16(x, unsafe.Slice((*uint16)(unsafe.Pointer(&row[0])), len(x)))
	case quant.BF16:
		return o.dotBF16(x, unsafe.Slice((*uint16)(unsafe.Pointer(&row[0])), len(x)))
	}
	return o.dotF32(x, unsafe.Slice((*float32)(unsafe.Pointer(&row[0])), len(x)))
}
