//go:build amd64 && !purego

package kernels

import "math"

//go:noescape
func expSubSumAVX2(x *float32, n int, m float32) float32

//go:noescape
func siluMulAVX2(out, gate, u *float32, n int)

func softmaxAVX2(x []float32) {
	if len(x) == 0 {
		return
	}
	m := x[0]
	for _, v := range x[1:] {
		if v > m {
			m = v
		}
	}
	n8 := len(x) &^ 7
	var s float32
	if n8 > 0 {
		s = expSubSumAVX2(&x[0], n8, m)
	}
	for i := n8; i < len(x); i++ {
		e := float32(math.Exp(float64(x[i] - m)))
		x[i] = e
		s += e
	}
	inv := 1 / s
	for i := range x {
		x[i] *= inv
	}
}

func siluMulAVX2Vec(out, g, u []float32) {
	n := len(g)
	if n == 0 {
		return
	}
	_, _ = out[n-1], u[n-1]
	n8 := n &^ 7
	if n8 > 0 {
		siluMulAVX2(&out[0], &g[0], &u[0], n8)
	}
	SiLUMulRef(out[n8:n], g[n8:], u[n8:n])
}

func setOpsAVX2(o *Ops) {
	o.softmax = softmaxAVX2
	o.siluMul = siluMulAVX2Vec
}
