package model

import "pagoda/kernels"

// mlaAttention runs arch.MLA in the absorbed form llama.cpp uses, for
// prefill and decode alike: each head's q_nope is projected into the
// latent space through KB, so the scores read the cached [latent | rope
// key] rows directly, and the attention output stays in the latent space
// until VB maps it to the head's values. The KV cache thus stores
// KVLoRA+QKRope values per token and layer for all heads, and the K row
// doubles as V (KVShape's vdim 0): a head's output is the first KVLoRA
// values of its mix of those rows.
type mlaAttention struct{}

// mlaScratch is the MLA part's working memory, reused across layers.
type mlaScratch struct {
	qa, q, kv, qt, att, gin, gout, vo []float32
}

func (mlaAttention) forward(m *Model, li int, b *Batch, kv KVCache) {
	c, s, l := &m.Config, &m.buf, &m.W.Layers[li]
	ms := &s.mla
	T, d, H := len(b.Tokens), c.NEmbd, c.NHead
	nope, rope, kvl, vh := c.QKNope, c.QKRope, c.KVLoRA, c.VHeadDim
	qk, kd := nope+rope, kvl+rope
	for i := 0; i < T; i++ {
		m.ops.RMSNorm(s.xn[i*d:(i+1)*d], s.x[i*d:(i+1)*d], l.AttnNorm, c.RMSEps)
	}
	ms.q, ms.kv = grow(ms.q, T*H*qk), grow(ms.kv, T*kd)
	if l.QA != nil {
		ms.qa = grow(ms.qa, T*c.QLoRA)
		m.ops.MatMulN(m.pool, []*kernels.Matrix{l.QA, l.KVA}, s.xn, [][]float32{ms.qa, ms.kv}, T)
		for i := 0; i < T; i++ {
			r := ms.qa[i*c.QLoRA : (i+1)*c.QLoRA]
			m.ops.RMSNorm(r, r, l.QANorm, c.RMSEps)
		}
		m.ops.MatMul(m.pool, l.QB, ms.qa, ms.q, T)
	} else {
		m.ops.MatMulN(m.pool, []*kernels.Matrix{l.Q, l.KVA}, s.xn, [][]float32{ms.q, ms.kv}, T)
	}
	for i := 0; i < T; i++ {
		pos := b.RopePos(i)
		lat := ms.kv[i*kd : i*kd+kvl]
		m.ops.RMSNorm(lat, lat, l.KVANorm, c.RMSEps)
		m.ops.RoPE(ms.kv[i*kd+kvl:(i+1)*kd], pos, m.freqs, false)
		for h := 0; h < H; h++ {
			o := i*H*qk + h*qk
			m.ops.RoPE(ms.q[o+nope:o+qk], pos, m.freqs, false)
		}
	}
	// Absorb: q̃_h = KB_h·q_nope_h, then the head's rope part after it.
	// The heads run in one parallel region, each head's product inline
	// on its worker (a decode step would otherwise pay a barrier per head).
	ms.qt = grow(ms.qt, T*H*kd)
	gw := T * max(nope, kvl, vh)
	ms.gin, ms.gout = grow(ms.gin, H*gw), grow(ms.gout, H*gw)
	m.pool.For(H, 1, func(lo, hi int) {
		for h := lo; h < hi; h++ {
			gin, gout := ms.gin[h*gw:(h+1)*gw], ms.gout[h*gw:(h+1)*gw]
			for i := 0; i < T; i++ {
				copy(gin[i*nope:(i+1)*nope], ms.q[i*H*qk+h*qk:])
			}
			m.ops.MatMul(m.pool, l.KB[h], gin, gout, T)
			for i := 0; i < T; i++ {
				o := i*H*kd + h*kd
				copy(ms.qt[o:o+kvl], gout[i*kvl:(i+1)*kvl])
				copy(ms.qt[o+kvl:o+kd], ms.q[i*H*qk+h*qk+nope:i*H*qk+(h+1)*qk])
			}
		}
	})
	ms.att = grow(ms.att, T*H*kd)
	m.attend(li, b, kv, ms.qt, ms.kv, ms.kv, ms.att, m.AttnParams())
	// Decompress the latent outputs: o_h = VB_h·õ_h.
	ms.vo = grow(ms.vo, T*H*vh)
	m.pool.For(H, 1, func(lo, hi int) {
		for h := lo; h < hi; h++ {
			gin, gout := ms.gin[h*gw:(h+1)*gw], ms.gout[h*gw:(h+1)*gw]
			for i := 0; i < T; i++ {
				copy(gin[i*kvl:(i+1)*kvl], ms.att[i*H*kd+h*kd:])
			}
			m.ops.MatMul(m.pool, l.VB[h], gin, gout, T)
			for i := 0; i < T; i++ {
				copy(ms.vo[i*H*vh+h*vh:i*H*vh+(h+1)*vh], gout[i*vh:(i+1)*vh])
			}
		}
	})
	m.ops.MatMul(m.pool, l.O, ms.vo, s.o, T)
	addTo(s.x, s.o[:T*d])
}
