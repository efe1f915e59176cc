package train

import (
	"fmt"
	"math"

	"pagoda/kernels"
)

// Backward sets Grads to the gradient of the last Forward's mean loss.
// It turns the saved logits into their gradient, so Logits is no longer
// valid afterwards.
func (m *Model) Backward() error {
	a := m.a
	if a == nil || a.targets == nil {
		return fmt.Errorf("train: backward without a forward pass with targets")
	}
	c := m.Config
	N, D, V := a.B*a.T, c.Dim, c.Vocab
	clear(m.Grads)
	// d loss / d logits = (softmax − onehot) / N, in place.
	invN := float32(1 / float64(N))
	m.pool.For(N, 16, func(lo, hi int) {
		for n := lo; n < hi; n++ {
			row := a.logits[n*V : (n+1)*V]
			lse := float32(logSumExp(row))
			for i, v := range row {
				row[i] = float32(math.Exp(float64(v-lse))) * invN
			}
			row[a.targets[n]] -= invN
		}
	})
	m.s.matmulBackW(m.pool, m.g.out, a.logits, a.xnf, N, D, V)
	m.s.matmulBackX(m.pool, a.dxn, a.logits, m.w.out, N, D, V)
	clear(a.dx)
	m.rmsnormBack(a.dx, m.g.outNorm, a.dxn, a.x, a.rstdf, m.w.outNorm, N)
	for l := c.Layers - 1; l >= 0; l-- {
		m.blockBackward(l)
	}
	// a.dx is now the gradient of the embedded tokens; rows of one token
	// add into one embedding row, so this stays serial.
	for n := 0; n < N; n++ {
		t := int(m.tokens[n])
		kernels.AxpyF32(m.g.embd[t*D:(t+1)*D], 1, a.dx[n*D:(n+1)*D])
	}
	return nil
}

// blockBackward takes a.dx as the gradient of block l's output and leaves
// the gradient of its input there, adding the weights' gradients.
func (m *Model) blockBackward(l int) {
	c, a := m.Config, m.a
	la, lw, lg := &a.layers[l], &m.w.layers[l], &m.g.layers[l]
	N, D, qd, kvd, F := a.B*a.T, c.Dim, c.Heads*c.HeadDim, c.KVHeads*c.HeadDim, c.FFN
	// FFN: next = xmid + down(h); dx (the residual) flows on unchanged.
	m.s.matmulBackW(m.pool, lg.wd, a.dx, la.h, N, F, D)
	m.s.matmulBackX(m.pool, a.dh, a.dx, lw.wd, N, F, D)
	m.pool.For(N*F, 1<<12, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			g := la.gate[i]
			sg := float32(1 / (1 + math.Exp(float64(-g))))
			silu := g * sg
			a.dup[i] = a.dh[i] * silu
			a.dgate[i] = a.dh[i] * la.up[i] * sg * (1 + g*(1-sg))
		}
	})
	m.s.matmulBackW(m.pool, lg.wg, a.dgate, la.xn2, N, D, F)
	m.s.matmulBackW(m.pool, lg.wu, a.dup, la.xn2, N, D, F)
	m.s.matmulBackX(m.pool, a.dxn, a.dgate, lw.wg, N, D, F)
	m.s.matmulBackX(m.pool, a.tmp, a.dup, lw.wu, N, D, F)
	addTo(m.pool, a.dxn, a.tmp[:N*D])
	m.rmsnormBack(a.dx, lg.ffnNorm, a.dxn, la.xmid, la.rstd2, lw.ffnNorm, N)
	// Attention: xmid = x + attn_output(att).
	m.s.matmulBackW(m.pool, lg.wo, a.dx, la.att, N, qd, D)
	m.s.matmulBackX(m.pool, a.datt, a.dx, lw.wo, N, qd, D)
	m.attnBackward(la)
	m.rope(a.dq, c.Heads, true)
	m.rope(a.dk, c.KVHeads, true)
	m.s.matmulBackW(m.pool, lg.wq, a.dq, la.xn1, N, D, qd)
	m.s.matmulBackW(m.pool, lg.wk, a.dk, la.xn1, N, D, kvd)
	m.s.matmulBackW(m.pool, lg.wv, a.dv, la.xn1, N, D, kvd)
	m.s.matmulBackX(m.pool, a.dxn, a.dq, lw.wq, N, D, qd)
	m.s.matmulBackX(m.pool, a.tmp, a.dk, lw.wk, N, D, kvd)
	addTo(m.pool, a.dxn, a.tmp[:N*D])
	m.s.matmulBackX(m.pool, a.tmp, a.dv, lw.wv, N, D, kvd)
	addTo(m.pool, a.dxn, a.tmp[:N*D])
	m.rmsnormBack(a.dx, lg.attnNorm, a.dxn, la.x, la.rstd1, lw.attnNorm, N)
}
