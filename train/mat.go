package train

import (
	"unsafe"

	"pagoda/kernels"
	"pagoda/quant"
)

// The three products of a linear layer y = x·Wᵀ (W out×in, row-major, as
// GGUF stores it) all run through kernels.MatMul's float32 tiles, which
// compute out[n·rows+r] = W[r]·x[n]:
//
//	forward  y[n,o]  = Σ_i x[n,i]·W[o,i]   (W as is)
//	backward dx[n,i] = Σ_o dy[n,o]·W[o,i]  (Wᵀ as the matrix)
//	backward dW[o,i] = Σ_n dy[n,o]·x[n,i]  (xᵀ as the matrix, dyᵀ as input)
//
// The transposes cost O(n·(in+out)) against the product's O(n·in·out).

// F32Bytes is f's memory as bytes (the packages that train beside this
// one, Medusa and EAGLE heads, write and multiply float32 matrices too).
func F32Bytes(f []float32) []byte {
	if len(f) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), 4*len(f))
}

// MatMul writes out[n·O+o] = Σ_i x[n·I+i]·w[o·I+i] for n < N.
func MatMul(p *kernels.Pool, out, x, w []float32, N, I, O int) {
	m := &kernels.Matrix{Type: quant.F32, Rows: O, Cols: I, Data: F32Bytes(w[:O*I]), RowBytes: 4 * I}
	kernels.MatMul(p, m, x[:N*I], out[:N*O], N)
}

// transpose writes dst (cols×rows) = srcᵀ (rows×cols), in cache blocks.
func transpose(p *kernels.Pool, dst, src []float32, rows, cols int) {
	const blk = 32
	nb := (rows + blk - 1) / blk
	p.For(nb, 1, func(lo, hi int) {
		for bi := lo; bi < hi; bi++ {
			r0, r1 := bi*blk, min(rows, (bi+1)*blk)
			for c0 := 0; c0 < cols; c0 += blk {
				c1 := min(cols, c0+blk)
				for r := r0; r < r1; r++ {
					row := src[r*cols : (r+1)*cols]
					for c := c0; c < c1; c++ {
						dst[c*rows+r] = row[c]
					}
				}
			}
		}
	})
}

// scratch is reusable memory for the backward products.
type scratch struct{ a, b, c []float32 }

func grow(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}

// matmulBackX writes dx[n,i] = Σ_o dy[n,o]·w[o,i].
func (s *scratch) matmulBackX(p *kernels.Pool, dx, dy, w []float32, N, I, O int) {
	s.a = grow(s.a, I*O)
	transpose(p, s.a, w[:O*I], O, I)
	MatMul(p, dx, dy, s.a, N, O, I)
}

// matmulBackW adds dw[o,i] += Σ_n dy[n,o]·x[n,i].
func (s *scratch) matmulBackW(p *kernels.Pool, dw, dy, x []float32, N, I, O int) {
	s.a = grow(s.a, I*N)
	s.b = grow(s.b, O*N)
	s.c = grow(s.c, O*I)
	transpose(p, s.a, x[:N*I], N, I)  // I×N
	transpose(p, s.b, dy[:N*O], N, O) // O×N
	MatMul(p, s.c, s.b, s.a, O, N, I) // c[o·I+i] = b[o]·a[i]
	addTo(p, dw[:O*I], s.c)
}

// addTo adds src into dst.
func addTo(p *kernels.Pool, dst, src []float32) {
	p.For(len(dst), 1<<14, func(lo, hi int) {
		d, s := dst[lo:hi], src[lo:hi]
		for i := range d {
			d[i] += s[i]
		}
	})
}
