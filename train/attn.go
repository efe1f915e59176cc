package train

import (
	"math"
	"sync"
)

// Attention runs per sequence and KV head (a task owns the query heads of
// its KV head, so the backward pass can give each task its own rows of dk
// and dv), as matrix products on gathered per-head copies: head width 32
// is too short for row-by-row dots and axpys to keep the FMA units busy.
// The probabilities P (T×T per head, zero above the diagonal) are kept for
// the backward pass.

// headBufs is one task's scratch.
type headBufs struct {
	q, k, v, o, kT, vT, s, s2, qT, oT, dk, dv, tmp []float32
}

var headPool sync.Pool

func getHeadBufs(T, hd int) *headBufs {
	if h, ok := headPool.Get().(*headBufs); ok && len(h.q) == T*hd && len(h.s) == T*T {
		return h
	}
	f := func(n int) []float32 { return make([]float32, n) }
	return &headBufs{q: f(T * hd), k: f(T * hd), v: f(T * hd), o: f(T * hd), kT: f(T * hd), vT: f(T * hd),
		s: f(T * T), s2: f(T * T), qT: f(T * hd), oT: f(T * hd), dk: f(T * hd), dv: f(T * hd), tmp: f(T * hd)}
}

// gather copies head h's rows (width hd, stride w) of sequence b into dst.
func gather(dst, src []float32, b, T, w, h, hd int) {
	for t := 0; t < T; t++ {
		copy(dst[t*hd:(t+1)*hd], src[(b*T+t)*w+h*hd:])
	}
}

func scatter(dst, src []float32, b, T, w, h, hd int) {
	for t := 0; t < T; t++ {
		copy(dst[(b*T+t)*w+h*hd:(b*T+t)*w+(h+1)*hd], src[t*hd:(t+1)*hd])
	}
}

// causalChunk is the rows of scores computed together: only the keys up to
// the chunk's last row are multiplied, halving the work of a full T×T.
const causalChunk = 64

func (m *Model) attnForward(la *layerActs) {
	c, a := m.Config, m.a
	B, T, H, KV, hd := a.B, a.T, c.Heads, c.KVHeads, c.HeadDim
	qd, kvd, group := H*hd, KV*hd, H/KV
	scale := float32(1 / math.Sqrt(float64(hd)))
	m.pool.For(B*KV, 1, func(lo, hi int) {
		hb := getHeadBufs(T, hd)
		defer headPool.Put(hb)
		for task := lo; task < hi; task++ {
			b, kh := task/KV, task%KV
			gather(hb.k, la.k, b, T, kvd, kh, hd)
			gather(hb.v, la.v, b, T, kvd, kh, hd)
			transpose(nil, hb.vT, hb.v, T, hd)
			for h := kh * group; h < (kh+1)*group; h++ {
				gather(hb.q, la.q, b, T, qd, h, hd)
				P := la.p[(b*H+h)*T*T : (b*H+h+1)*T*T]
				for t0 := 0; t0 < T; t0 += causalChunk {
					t1 := min(T, t0+causalChunk)
					// scores of rows [t0,t1) against keys [0,t1), stride t1
					MatMul(nil, hb.s, hb.q[t0*hd:], hb.k, t1-t0, hd, t1)
					for t := t0; t < t1; t++ {
						src := hb.s[(t-t0)*t1 : (t-t0)*t1+t+1]
						row := P[t*T : (t+1)*T]
						mx := float32(math.Inf(-1))
						for _, v := range src {
							mx = max(mx, v*scale)
						}
						var sum float32
						for u, v := range src {
							e := float32(math.Exp(float64(v*scale - mx)))
							row[u] = e
							sum += e
						}
						inv := 1 / sum
						for u := range src {
							row[u] *= inv
						}
						clear(row[t+1:])
					}
				}
				MatMul(nil, hb.o, P, hb.vT, T, T, hd)
				scatter(la.att, hb.o, b, T, qd, h, hd)
			}
		}
	})
}

// attnBackward writes a.dq, a.dk and a.dv from a.datt (q and k as rotated):
// dP = dO·Vᵀ, dS = P∘(dP − rowsum(P∘dP))·scale, dQ = dS·K, dK = dSᵀ·Q,
// dV = Pᵀ·dO.
func (m *Model) attnBackward(la *layerActs) {
	c, a := m.Config, m.a
	B, T, H, KV, hd := a.B, a.T, c.Heads, c.KVHeads, c.HeadDim
	qd, kvd, group := H*hd, KV*hd, H/KV
	scale := float32(1 / math.Sqrt(float64(hd)))
	m.pool.For(B*KV, 1, func(lo, hi int) {
		hb := getHeadBufs(T, hd)
		defer headPool.Put(hb)
		for task := lo; task < hi; task++ {
			b, kh := task/KV, task%KV
			gather(hb.k, la.k, b, T, kvd, kh, hd)
			gather(hb.v, la.v, b, T, kvd, kh, hd)
			transpose(nil, hb.kT, hb.k, T, hd)
			clear(hb.dk)
			clear(hb.dv)
			for h := kh * group; h < (kh+1)*group; h++ {
				gather(hb.q, la.q, b, T, qd, h, hd)
				gather(hb.o, a.datt, b, T, qd, h, hd) // dO
				P := la.p[(b*H+h)*T*T : (b*H+h+1)*T*T]
				// dV += Pᵀ·dO
				transpose(nil, hb.s2, P, T, T)
				transpose(nil, hb.oT, hb.o, T, hd)
				MatMul(nil, hb.tmp, hb.s2, hb.oT, T, T, hd)
				for i, v := range hb.tmp {
					hb.dv[i] += v
				}
				// dS in hb.s
				MatMul(nil, hb.s, hb.o, hb.v, T, hd, T)
				for t := 0; t < T; t++ {
					dp, p := hb.s[t*T:(t+1)*T], P[t*T:(t+1)*T]
					var sum float32
					for u := 0; u <= t; u++ {
						sum += p[u] * dp[u]
					}
					for u := 0; u <= t; u++ {
						dp[u] = p[u] * (dp[u] - sum) * scale
					}
					clear(dp[t+1:])
				}
				// dQ = dS·K
				MatMul(nil, hb.tmp, hb.s, hb.kT, T, T, hd)
				scatter(a.dq, hb.tmp, b, T, qd, h, hd)
				// dK += dSᵀ·Q
				transpose(nil, hb.s2, hb.s, T, T)
				transpose(nil, hb.qT, hb.q, T, hd)
				MatMul(nil, hb.tmp, hb.s2, hb.qT, T, T, hd)
				for i, v := range hb.tmp {
					hb.dk[i] += v
				}
			}
			scatter(a.dk, hb.dk, b, T, kvd, kh, hd)
			scatter(a.dv, hb.dv, b, T, kvd, kh, hd)
		}
	})
}
