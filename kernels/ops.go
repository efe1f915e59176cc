package kernels

import (
	"math"
	"sync/atomic"

	"pagoda/quant"
)

// MatMul computes out[b*w.Rows+r] = Σ_c W[r,c]·x[b*w.Cols+c] for the batch
// rows b in [0, batch). The rows of W are split across the pool.
func MatMul(p *Pool, w *Matrix, x, out []float32, batch int) {
	best.matMul(p, w, x, out, batch)
}

// MatMul is the package-level MatMul with o's kernels.
func (o *Ops) MatMul(p *Pool, w *Matrix, x, out []float32, batch int) {
	o.matMul(p, w, x, out, batch)
}

// MatMulN computes outs[i] = MatMul(ws[i], x) for matrices that share the
// input (attention Q, K and V; FFN gate and up): the activations are
// quantized once per format and all products run in one parallel region.
// All matrices must have x's width (Cols).
func MatMulN(p *Pool, ws []*Matrix, x []float32, outs [][]float32, batch int) {
	best.matMulN(p, ws, x, outs, batch)
}

// MatMulN is the package-level MatMulN with o's kernels.
func (o *Ops) MatMulN(p *Pool, ws []*Matrix, x []float32, outs [][]float32, batch int) {
	o.matMulN(p, ws, x, outs, batch)
}

// MatMulNRef is MatMulN as a loop over MatMulRef.
func MatMulNRef(p *Pool, ws []*Matrix, x []float32, outs [][]float32, batch int) {
	for i, w := range ws {
		MatMulRef(p, w, x, outs[i], batch)
	}
}

// MatMulRef is the plain reference: dequantize each weight row once, dot it
// with every batch row in float32 (DotF32Ref).
func MatMulRef(p *Pool, w *Matrix, x, out []float32, batch int) {
	if w.Perm != nil && batch > 0 {
		xp := gatherCols(w, x, batch)
		defer putGather(xp)
		x = *xp
	}
	matMulRows(p, w, x, out, batch, DotF32Ref)
}

// matMulRows is MatMulRef with the given dot product: the SIMD sets fall
// back to it, with their own dot, for shapes their tiles do not cover.
func matMulRows(p *Pool, w *Matrix, x, out []float32, batch int, dot func(a, b []float32) float32) {
	p.For(w.Rows, 16, func(lo, hi int) {
		row := make([]float32, w.Cols)
		for r := lo; r < hi; r++ {
			quant.Dequantize(w.Type, w.Row(r), row)
			for b := 0; b < batch; b++ {
				out[b*w.Rows+r] = dot(row, x[b*w.Cols:(b+1)*w.Cols])
			}
		}
	})
}

// DotF32 is Σ a[i]·b[i].
func DotF32(a, b []float32) float32 { return best.dotF32(a, b) }

// DotF32 is the package-level DotF32 with o's kernels.
func (o *Ops) DotF32(a, b []float32) float32 { return o.dotF32(a, b) }

// RMSNorm writes x / sqrt(mean(x²)+eps) * w into out (w may be nil).
func RMSNorm(out, x, w []float32, eps float32) { best.rmsNorm(out, x, w, eps) }

// RMSNorm is the package-level RMSNorm with o's kernels.
func (o *Ops) RMSNorm(out, x, w []float32, eps float32) { o.rmsNorm(out, x, w, eps) }

// Softmax normalises x in place.
func Softmax(x []float32) { best.softmax(x) }

// Softmax is the package-level Softmax with o's kernels.
func (o *Ops) Softmax(x []float32) { o.softmax(x) }

// SiLUMul writes silu(g)·u into out (out may alias g or u).
func SiLUMul(out, g, u []float32) { best.siluMul(out, g, u) }

// SiLUMul is the package-level SiLUMul with o's kernels.
func (o *Ops) SiLUMul(out, g, u []float32) { o.siluMul(out, g, u) }

// RoPE is the package-level RoPE for o: the generic set runs RoPERef, the
// SIMD sets the cached-table RoPE (the same float32 values).
func (o *Ops) RoPE(x []float32, pos int, freqs []float32, neox bool) { o.rope(x, pos, freqs, neox) }

// RMSNormRef is the reference RMSNorm, summing squares in float64.
func RMSNormRef(out, x, w []float32, eps float32) {
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	scale := float32(1 / math.Sqrt(ss/float64(len(x))+float64(eps)))
	if w == nil {
		for i, v := range x {
			out[i] = v * scale
		}
		return
	}
	for i, v := range x {
		out[i] = v * scale * w[i]
	}
}

// SoftmaxRef is the reference Softmax.
func SoftmaxRef(x []float32) {
	if len(x) == 0 {
		return
	}
	m := x[0]
	for _, v := range x[1:] {
		if v > m {
			m = v
		}
	}
	var s float32
	for i, v := range x {
		e := float32(math.Exp(float64(v - m)))
		x[i] = e
		s += e
	}
	inv := 1 / s
	for i := range x {
		x[i] *= inv
	}
}

// SiLUMulRef is the reference SiLUMul.
func SiLUMulRef(out, g, u []float32) {
	for i, v := range g {
		out[i] = v / (1 + float32(math.Exp(float64(-v)))) * u[i]
	}
}

// RoPE rotates one head vector x (len headDim) in place at position pos.
// freqs[i] is the angular frequency of pair i (θ^(-2i/dims), already divided
// by any rope_freqs factor). neox selects the half-split pairing (i, i+d/2);
// otherwise pairs are adjacent (2i, 2i+1). Only the first 2·len(freqs)
// dimensions rotate.
//
// A model rotates every head of a token at the same position in a row, so
// the sines and cosines of the last position are kept and reused: the same
// float32 values as RoPERef, one Sincos per pair per token instead of per
// head. Being plain Go, it is the same on every instruction set.
func RoPE(x []float32, pos int, freqs []float32, neox bool) {
	n := len(freqs)
	if n == 0 {
		return
	}
	t := ropeLast.Load()
	if t == nil || t.pos != pos || len(t.cos) != n || t.freqs != &freqs[0] || t.f0 != freqs[0] || t.fn != freqs[n-1] {
		t = &ropeTable{pos: pos, freqs: &freqs[0], f0: freqs[0], fn: freqs[n-1], cos: make([]float32, n), sin: make([]float32, n)}
		for i, f := range freqs {
			s, c := math.Sincos(float64(pos) * float64(f))
			t.sin[i], t.cos[i] = float32(s), float32(c)
		}
		ropeLast.Store(t)
	}
	if neox {
		a, b := x[:n], x[n:2*n]
		for i := range a {
			x0, x1 := a[i], b[i]
			a[i] = x0*t.cos[i] - x1*t.sin[i]
			b[i] = x0*t.sin[i] + x1*t.cos[i]
		}
		return
	}
	x = x[:2*n]
	for i := 0; i < n; i++ {
		x0, x1 := x[2*i], x[2*i+1]
		x[2*i] = x0*t.cos[i] - x1*t.sin[i]
		x[2*i+1] = x0*t.sin[i] + x1*t.cos[i]
	}
}

// ropeTable is an immutable cache entry; the freqs pointer and its first
// and last values identify the frequency table.
type ropeTable struct {
	pos      int
	freqs    *float32
	f0, fn   float32
	cos, sin []float32
}

var ropeLast atomic.Pointer[ropeTable]

// RoPETable writes into tab (reused; 2·len(freqs) floats) the cosines
// then the sines of every pair at position pos: what RoPEWith rotates the
// heads of one row with. A model rotates all of a row's query and key
// heads at one position, so the Sincos per pair is paid once per row, with
// no allocation; the values are RoPE's and RoPERef's.
func RoPETable(tab []float32, pos int, freqs []float32) []float32 {
	n := len(freqs)
	if cap(tab) < 2*n {
		tab = make([]float32, 2*n)
	}
	tab = tab[:2*n]
	for i, f := range freqs {
		s, c := math.Sincos(float64(pos) * float64(f))
		tab[i], tab[n+i] = float32(c), float32(s)
	}
	return tab
}

// RoPEWith rotates one head vector x in place by the table of RoPETable,
// as RoPE does at that table's position.
func RoPEWith(x, tab []float32, neox bool) {
	n := len(tab) / 2
	cos, sin := tab[:n], tab[n:]
	if neox {
		a, b := x[:n], x[n:2*n]
		for i := range a {
			x0, x1 := a[i], b[i]
			a[i] = x0*cos[i] - x1*sin[i]
			b[i] = x0*sin[i] + x1*cos[i]
		}
		return
	}
	x = x[:2*n]
	for i := 0; i < n; i++ {
		x0, x1 := x[2*i], x[2*i+1]
		x[2*i] = x0*cos[i] - x1*sin[i]
		x[2*i+1] = x0*sin[i] + x1*cos[i]
	}
}

// RoPERef is the reference RoPE.
func RoPERef(x []float32, pos int, freqs []float32, neox bool) {
	n := len(freqs)
	for i := 0; i < n; i++ {
		ang := float64(pos) * float64(freqs[i])
		s, c := math.Sincos(ang)
		sf, cf := float32(s), float32(c)
		var a, b int
		if neox {
			a, b = i, i+n
		} else {
			a, b = 2*i, 2*i+1
		}
		x0, x1 := x[a], x[b]
		x[a] = x0*cf - x1*sf
		x[b] = x0*sf + x1*cf
	}
}
