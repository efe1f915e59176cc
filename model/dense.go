package model

import (
	"math"
)

// swiGLU runs arch.DenseFFN{Gated: true}: x += down(silu(gate(n)) · up(n))
// with n = norm(x).
type swiGLU struct{}

func (swiGLU) forward(m *Model, li int, b *Batch, _ KVCache) {
	c, s, l := &m.Config, &m.buf, &m.W.Layers[li]
	T, d := len(b.Tokens), c.NEmbd
	m.be.RMSNorm(s.xn[:T*d], s.x[:T*d], l.FFNNorm, T, c.RMSEps)
	m.be.MatMulN(l.gateUp, s.xn, [][]float32{s.gate, s.up}, T)
	m.ops.SiLUMul(s.gate, s.gate, s.up)
	m.project(&l.down, s.gate, s.o, T)
	addTo(s.x, s.o)
}

// siluMLP runs arch.DenseFFN{Gated: false}: x += down(silu(up(norm(x)))).
type siluMLP struct{}

func (siluMLP) forward(m *Model, li int, b *Batch, _ KVCache) {
	c, s, l := &m.Config, &m.buf, &m.W.Layers[li]
	T, d := len(b.Tokens), c.NEmbd
	m.be.RMSNorm(s.xn[:T*d], s.x[:T*d], l.FFNNorm, T, c.RMSEps)
	m.be.MatMul(&l.up, s.xn, s.up, T)
	for i, v := range s.up {
		s.up[i] = v / (1 + float32(math.Exp(float64(-v))))
	}
	m.project(&l.down, s.up, s.o, T)
	addTo(s.x, s.o)
}
