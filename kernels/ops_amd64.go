//go:build amd64 && !purego

package kernels

import (
	"math"
	"unsafe"
)

//go:noescape
func softmaxOnlineAVX512(x *float32, n int, scale, m float32) (mx, sum float32)

//go:noescape
func siluMulAVX512(out, gate, u *float32, n int)

//go:noescape
func scaleMulAVX512(out, x, w *float32, s float32, n int)

// softmaxVec is one block of the online softmax over the whole row (the
// maximum, then the exponentials and their sum), normalised by the sum.
func softmaxVec(x []float32) {
	if len(x) > 0 {
		_, sum := softmaxOnlineAVX512(&x[0], len(x), 1, float32(math.Inf(-1)))
		scaleMulAVX512(&x[0], &x[0], nil, 1/sum, len(x))
	}
}

func siluMulVec(out, g, u []float32) {
	if len(g) == 0 {
		return
	}
	_, _ = out[len(g)-1], u[len(g)-1]
	siluMulAVX512(&out[0], &g[0], &u[0], len(g))
}

func scaleF32Vec(x []float32, a float32) {
	if len(x) > 0 {
		scaleMulAVX512(&x[0], &x[0], nil, a, len(x))
	}
}

func rmsNormVec(out, x, w []float32, eps float32) {
	if len(x) == 0 {
		return
	}
	_ = out[len(x)-1]
	ss := dotF32AVX512(&x[0], unsafe.Pointer(&x[0]), len(x))
	scale := float32(1 / math.Sqrt(float64(ss)/float64(len(x))+float64(eps)))
	var wp *float32
	if w != nil {
		_ = w[len(x)-1]
		wp = &w[0]
	}
	scaleMulAVX512(&out[0], &x[0], wp, scale, len(x))
}

func setOpsAVX512(o *Ops) {
	o.softmax = softmaxVec
	o.siluMul = siluMulVec
	o.scaleF32 = scaleF32Vec
	o.rmsNorm = rmsNormVec
}
