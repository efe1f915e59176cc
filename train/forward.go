package train

import (
	"fmt"
	"math"

	"pagoda/kernels"
)

// Model is a model being trained: its parameters, their gradients and the
// activations of the last forward pass (kept for the backward pass).
type Model struct {
	Config Config
	Params []float32
	Grads  []float32

	w, g   weights
	pool   *kernels.Pool
	freqs  []float32
	a      *acts
	tokens []int32
	s      scratch
}

// NewModel allocates a model with zero parameters; call Config.Init or
// copy weights into Params. threads <= 0 means one per CPU.
func NewModel(c Config, threads int) (*Model, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	n := c.NumParams()
	m := &Model{Config: c, Params: make([]float32, n), Grads: make([]float32, n), pool: kernels.NewPool(threads), freqs: c.freqs()}
	m.w, m.g = c.views(m.Params), c.views(m.Grads)
	return m, nil
}

// Close stops the model's worker threads.
func (m *Model) Close() { m.pool.Close() }

// layerActs are one block's saved activations.
type layerActs struct {
	x           []float32 // block input (residual stream), N×D
	xn1, rstd1  []float32
	q, k, v     []float32 // q and k after RoPE
	p           []float32 // attention probabilities, B×H×T×T (causal part)
	att         []float32 // attention output before attn_output, N×qd
	xmid        []float32 // residual after attention
	xn2, rstd2  []float32
	gate, up, h []float32 // h = silu(gate)·up
}

// acts are the activations of one forward pass over B sequences of T.
type acts struct {
	B, T    int
	layers  []layerActs
	x       []float32 // final residual
	xnf     []float32
	rstdf   []float32
	logits  []float32 // N×V
	targets []int32
	rowLoss []float64
	cos     []float32 // T×HeadDim/2
	sin     []float32
	// backward buffers
	dx, dxn, dq, dk, dv, datt, dgate, dup, dh, tmp []float32
}

func (m *Model) acts(B, T int) *acts {
	if m.a != nil && m.a.B == B && m.a.T == T {
		return m.a
	}
	m.a = nil // let the old buffers go before allocating
	c := m.Config
	N, D, qd, kvd, F := B*T, c.Dim, c.Heads*c.HeadDim, c.KVHeads*c.HeadDim, c.FFN
	f := func(n int) []float32 { return make([]float32, n) }
	a := &acts{B: B, T: T, layers: make([]layerActs, c.Layers)}
	for l := range a.layers {
		a.layers[l] = layerActs{x: f(N * D), xn1: f(N * D), rstd1: f(N), q: f(N * qd), k: f(N * kvd), v: f(N * kvd),
			p: f(B * c.Heads * T * T), att: f(N * qd), xmid: f(N * D), xn2: f(N * D), rstd2: f(N),
			gate: f(N * F), up: f(N * F), h: f(N * F)}
	}
	a.x, a.xnf, a.rstdf, a.logits, a.rowLoss = f(N*D), f(N*D), f(N), f(N*c.Vocab), make([]float64, N)
	a.dx, a.dxn, a.dq, a.dk, a.dv, a.datt = f(N*D), f(N*D), f(N*qd), f(N*kvd), f(N*kvd), f(N*qd)
	a.dgate, a.dup, a.dh, a.tmp = f(N*F), f(N*F), f(N*F), f(N*max(D, qd))
	half := c.HeadDim / 2
	a.cos, a.sin = f(T*half), f(T*half)
	for t := 0; t < T; t++ {
		for i, fr := range m.freqs {
			s, co := math.Sincos(float64(t) * float64(fr))
			a.cos[t*half+i], a.sin[t*half+i] = float32(co), float32(s)
		}
	}
	m.a = a
	return a
}

// Forward runs B sequences of T tokens (tokens is B×T, row-major) and
// returns the mean cross-entropy against targets (B×T; nil: no loss, 0).
// The logits stay available through Logits until the next call.
func (m *Model) Forward(tokens, targets []int32, B, T int) (float64, error) {
	c := m.Config
	if B <= 0 || T <= 0 || len(tokens) != B*T || (targets != nil && len(targets) != B*T) {
		return 0, fmt.Errorf("train: %d tokens and %d targets for %d×%d", len(tokens), len(targets), B, T)
	}
	if T > c.Context {
		return 0, fmt.Errorf("train: sequence length %d exceeds the context %d", T, c.Context)
	}
	for _, set := range [][]int32{tokens, targets} {
		for _, t := range set {
			if t < 0 || int(t) >= c.Vocab {
				return 0, fmt.Errorf("train: token %d outside the vocabulary of %d", t, c.Vocab)
			}
		}
	}
	a := m.acts(B, T)
	a.targets = targets
	N, D := B*T, c.Dim
	m.tokens = append(m.tokens[:0], tokens...)
	x := a.layers[0].x
	for n, t := range tokens {
		copy(x[n*D:(n+1)*D], m.w.embd[int(t)*D:(int(t)+1)*D])
	}
	for l := 0; l < c.Layers; l++ {
		next := a.x
		if l+1 < c.Layers {
			next = a.layers[l+1].x
		}
		m.blockForward(l, next)
	}
	m.rmsnorm(a.xnf, a.rstdf, a.x, m.w.outNorm, N)
	MatMul(m.pool, a.logits, a.xnf, m.w.out, N, D, c.Vocab)
	if targets == nil {
		return 0, nil
	}
	V := c.Vocab
	m.pool.For(N, 16, func(lo, hi int) {
		for n := lo; n < hi; n++ {
			row := a.logits[n*V : (n+1)*V]
			a.rowLoss[n] = logSumExp(row) - float64(row[targets[n]])
		}
	})
	var sum float64
	for _, v := range a.rowLoss[:N] {
		sum += v
	}
	return sum / float64(N), nil
}

// Logits are the last forward pass's logits, N×Vocab.
func (m *Model) Logits() []float32 { return m.a.logits }

func logSumExp(row []float32) float64 {
	mx := row[0]
	for _, v := range row {
		mx = max(mx, v)
	}
	var s float64
	for _, v := range row {
		s += math.Exp(float64(v - mx))
	}
	return float64(mx) + math.Log(s)
}

// rmsnorm writes out = x·rstd·w per row and saves rstd.
func (m *Model) rmsnorm(out, rstd, x, w []float32, N int) {
	D := m.Config.Dim
	eps := float64(m.Config.RMSEps)
	m.pool.For(N, 32, func(lo, hi int) {
		for n := lo; n < hi; n++ {
			xr, or := x[n*D:(n+1)*D], out[n*D:(n+1)*D]
			var ss float64
			for _, v := range xr {
				ss += float64(v) * float64(v)
			}
			r := float32(1 / math.Sqrt(ss/float64(D)+eps))
			rstd[n] = r
			for i, v := range xr {
				or[i] = v * r * w[i]
			}
		}
	})
}

// rmsnormBack adds into dx the gradient through out = x·rstd·w, and into
// dw Σ_n dout·x·rstd.
func (m *Model) rmsnormBack(dx, dw, dout, x, rstd, w []float32, N int) {
	D := m.Config.Dim
	m.pool.For(N, 32, func(lo, hi int) {
		for n := lo; n < hi; n++ {
			xr, dr, dxr := x[n*D:(n+1)*D], dout[n*D:(n+1)*D], dx[n*D:(n+1)*D]
			r := rstd[n]
			var dot float64
			for i, v := range xr {
				dot += float64(dr[i] * w[i] * v)
			}
			k := float32(dot) * r * r * r / float32(D)
			for i, v := range xr {
				dxr[i] += dr[i]*w[i]*r - v*k
			}
		}
	})
	// dw sums over rows: one pass per thread range of columns, so no
	// two threads write one element.
	m.pool.For(D, 16, func(lo, hi int) {
		for n := 0; n < N; n++ {
			xr, dr, r := x[n*D:(n+1)*D], dout[n*D:(n+1)*D], rstd[n]
			for i := lo; i < hi; i++ {
				dw[i] += dr[i] * xr[i] * r
			}
		}
	})
}

// rope rotates every head of rows (N rows of heads·HeadDim) at position
// n mod T; inverse rotates back (the backward pass).
func (m *Model) rope(rows []float32, heads int, inverse bool) {
	a, hd := m.a, m.Config.HeadDim
	half, w, T := hd/2, heads*hd, a.T
	m.pool.For(a.B*T, 32, func(lo, hi int) {
		for n := lo; n < hi; n++ {
			t := n % T
			cs, sn := a.cos[t*half:(t+1)*half], a.sin[t*half:(t+1)*half]
			for h := 0; h < heads; h++ {
				x := rows[n*w+h*hd : n*w+(h+1)*hd]
				for i := 0; i < half; i++ {
					x0, x1, c, s := x[2*i], x[2*i+1], cs[i], sn[i]
					if inverse {
						s = -s
					}
					x[2*i] = x0*c - x1*s
					x[2*i+1] = x0*s + x1*c
				}
			}
		}
	})
}

func (m *Model) blockForward(l int, next []float32) {
	c, a := m.Config, m.a
	la, lw := &a.layers[l], &m.w.layers[l]
	N, D, qd, kvd, F := a.B*a.T, c.Dim, c.Heads*c.HeadDim, c.KVHeads*c.HeadDim, c.FFN
	m.rmsnorm(la.xn1, la.rstd1, la.x, lw.attnNorm, N)
	MatMul(m.pool, la.q, la.xn1, lw.wq, N, D, qd)
	MatMul(m.pool, la.k, la.xn1, lw.wk, N, D, kvd)
	MatMul(m.pool, la.v, la.xn1, lw.wv, N, D, kvd)
	m.rope(la.q, c.Heads, false)
	m.rope(la.k, c.KVHeads, false)
	m.attnForward(la)
	MatMul(m.pool, la.xmid, la.att, lw.wo, N, qd, D)
	for i, v := range la.x {
		la.xmid[i] += v
	}
	m.rmsnorm(la.xn2, la.rstd2, la.xmid, lw.ffnNorm, N)
	MatMul(m.pool, la.gate, la.xn2, lw.wg, N, D, F)
	MatMul(m.pool, la.up, la.xn2, lw.wu, N, D, F)
	m.pool.For(N*F, 1<<12, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			g := la.gate[i]
			la.h[i] = g / (1 + float32(math.Exp(float64(-g)))) * la.up[i]
		}
	})
	MatMul(m.pool, next, la.h, lw.wd, N, F, D)
	for i, v := range la.xmid {
		next[i] += v
	}
}
