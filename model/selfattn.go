package model

import "pagoda/kernels"

// selfAttention runs arch.Attention: norm, fused q/k/v projection, biases,
// per-head q/k norm and rope, attention through the KV cache, output
// projection and residual.
type selfAttention struct{}

func (selfAttention) forward(m *Model, li int, b *Batch, kv KVCache) {
	c, s, l := &m.Config, &m.buf, &m.W.Layers[li]
	T := len(b.Tokens)
	d, qd, kvd, hd := c.NEmbd, c.NHead*c.HeadDim, c.NKVHead*c.HeadDim, c.HeadDim
	ap := m.AttnParams()
	for i := 0; i < T; i++ {
		m.ops.RMSNorm(s.xn[i*d:(i+1)*d], s.x[i*d:(i+1)*d], l.AttnNorm, c.RMSEps)
	}
	m.be.MatMulN(l.qkv, s.xn, [][]float32{s.q, s.k, s.v}, T) // q/k/v biases included
	for i := 0; i < T; i++ {
		q, k := s.q[i*qd:(i+1)*qd], s.k[i*kvd:(i+1)*kvd]
		tab := s.rope[i*2*len(m.freqs) : (i+1)*2*len(m.freqs)]
		if c.QKNormFull {
			m.ops.RMSNorm(q, q, l.QNorm, c.RMSEps)
			m.ops.RMSNorm(k, k, l.KNorm, c.RMSEps)
		}
		for h := 0; h < c.NHead; h++ {
			qh := q[h*hd : (h+1)*hd]
			if l.QNorm != nil && !c.QKNormFull {
				m.ops.RMSNorm(qh, qh, l.QNorm, c.RMSEps)
			}
			kernels.RoPEWith(qh, tab, c.RopeNeox)
		}
		for h := 0; h < c.NKVHead; h++ {
			kh := k[h*hd : (h+1)*hd]
			if l.KNorm != nil && !c.QKNormFull {
				m.ops.RMSNorm(kh, kh, l.KNorm, c.RMSEps)
			}
			kernels.RoPEWith(kh, tab, c.RopeNeox)
		}
	}
	m.be.Attend(li, b, kv, s.q, s.k, s.v, s.att, ap)
	m.project(&l.o, s.att, s.o, T)
	addTo(s.x, s.o)
}
