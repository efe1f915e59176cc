package model

import (
	"math"

	"pagoda/kernels"
)

// swiGLU runs arch.DenseFFN{Gated: true}: x += down(silu(gate(n)) · up(n))
// with n = norm(x).
type swiGLU struct{}

func (swiGLU) forward(m *Model, li int, b *Batch, _ KVCache) {
	c, s, l := &m.Config, &m.buf, &m.W.Layers[li]
	T, d := len(b.Tokens), c.NEmbd
	for i := 0; i < T; i++ {
		m.ops.RMSNorm(s.xn[i*d:(i+1)*d], s.x[i*d:(i+1)*d], l.FFNNorm, c.RMSEps)
	}
	m.ops.MatMulN(m.pool, []*kernels.Matrix{l.Gate, l.Up}, s.xn, [][]float32{s.gate, s.up}, T)
	m.ops.SiLUMul(s.gate, s.gate, s.up)
	m.ops.MatMul(m.pool, l.Down, s.gate, s.o, T)
	addTo(s.x, s.o)
}

// siluMLP runs arch.DenseFFN{Gated: false}: x += down(silu(up(norm(x)))).
type siluMLP struct{}

func (siluMLP) forward(m *Model, li int, b *Batch, _ KVCache) {
	c, s, l := &m.Config, &m.buf, &m.W.Layers[li]
	T, d := len(b.Tokens), c.NEmbd
	for i := 0; i < T; i++ {
		m.ops.RMSNorm(s.xn[i*d:(i+1)*d], s.x[i*d:(i+1)*d], l.FFNNorm, c.RMSEps)
	}
	m.ops.MatMul(m.pool, l.Up, s.xn, s.up, T)
	for i, v := range s.up {
		s.up[i] = v / (1 + float32(math.Exp(float64(-v))))
	}
	m.ops.MatMul(m.pool, l.Down, s.up, s.o, T)
	addTo(s.x, s.o)
}
