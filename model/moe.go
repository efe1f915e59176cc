package model

import (
	"math"

	"pagoda/arch"
	"pagoda/kernels"
)

// moeFFN runs arch.MoE: x += Σ_j w_j·expert_j(n) (+ shared(n)) with
// n = norm(x). The router picks each token's experts; the batch's tokens are
// then grouped by expert, so every active expert runs one matrix product
// over all its tokens and a decode step reads only the selected experts.
type moeFFN struct{}

// moeScratch is the MoE part's working memory, reused across layers.
type moeScratch struct {
	logits, sel []float32 // T × NExpert router output and selection scores
	rows        [][]int32 // per expert: the batch rows routed to it
	wts         [][]float32
	xin, g, u   []float32 // gathered inputs, gate and up of one expert
	active      []int     // decode: the selected experts
	out         []float32
	shG, shU    []float32
}

func (moeFFN) forward(m *Model, li int, b *Batch, _ KVCache) {
	c, s, l := &m.Config, &m.buf, &m.W.Layers[li]
	ms := &s.moe
	T, d, E, F := len(b.Tokens), c.NEmbd, c.NExpert, c.ExpertFFN
	for i := 0; i < T; i++ {
		m.ops.RMSNorm(s.xn[i*d:(i+1)*d], s.x[i*d:(i+1)*d], l.FFNNorm, c.RMSEps)
	}
	ms.logits = grow(ms.logits, T*E)
	m.ops.MatMul(m.pool, l.Router, s.xn, ms.logits, T)
	m.route(ms, l, T)

	out := s.o[:T*d]
	clear(out)
	if T == 1 {
		m.decodeExperts(ms, l, li, s.xn[:d], out)
	}
	for e := 0; e < E && T > 1; e++ {
		rows := ms.rows[e]
		n := len(rows)
		if n == 0 {
			continue
		}
		ms.xin = grow(ms.xin, n*d)
		for j, r := range rows {
			copy(ms.xin[j*d:(j+1)*d], s.xn[int(r)*d:(int(r)+1)*d])
		}
		ms.g, ms.u, ms.out = grow(ms.g, n*F), grow(ms.u, n*F), grow(ms.out, n*d)
		m.ops.MatMulN(m.pool, []*kernels.Matrix{l.GateExps[e], l.UpExps[e]}, ms.xin, [][]float32{ms.g, ms.u}, n)
		m.ops.SiLUMul(ms.g, ms.g, ms.u)
		m.ops.MatMul(m.pool, l.DownExps[e], ms.g, ms.out, n)
		for j, r := range rows {
			w, o, y := ms.wts[e][j], out[int(r)*d:(int(r)+1)*d], ms.out[j*d:(j+1)*d]
			for t := range o {
				o[t] += w * y[t]
			}
		}
		m.countExpert(l, li, e, n)
	}
	if l.UpShexp != nil {
		SF := l.UpShexp.Rows
		ms.shG, ms.shU, ms.out = grow(ms.shG, T*SF), grow(ms.shU, T*SF), grow(ms.out, T*d)
		m.ops.MatMulN(m.pool, []*kernels.Matrix{l.GateShexp, l.UpShexp}, s.xn, [][]float32{ms.shG, ms.shU}, T)
		m.ops.SiLUMul(ms.shG, ms.shG, ms.shU)
		m.ops.MatMul(m.pool, l.DownShexp, ms.shG, ms.out, T)
		for i := 0; i < T; i++ {
			g := float32(1)
			if l.SharedGate != nil {
				g = sigmoid(m.ops.DotF32(l.SharedGate, s.xn[i*d:(i+1)*d]))
			}
			o, y := out[i*d:(i+1)*d], ms.out[i*d:(i+1)*d]
			for t := range o {
				o[t] += g * y[t]
			}
		}
	}
	addTo(s.x, out)
}

// decodeExperts runs the selected experts of a single token in two
// parallel regions: their gate and up products share the input (MatMulN
// over 2·NExpertUsed matrices), then the down products, one per worker.
func (m *Model) decodeExperts(ms *moeScratch, l *Layer, li int, xn, out []float32) {
	c := &m.Config
	d, F := c.NEmbd, c.ExpertFFN
	var ws []*kernels.Matrix
	var outs [][]float32
	ms.g, ms.u = grow(ms.g, c.NExpertUsed*F), grow(ms.u, c.NExpertUsed*F)
	k := 0
	experts := ms.active[:0]
	for e, rows := range ms.rows {
		if len(rows) == 0 {
			continue
		}
		ws = append(ws, l.GateExps[e], l.UpExps[e])
		outs = append(outs, ms.g[k*F:(k+1)*F], ms.u[k*F:(k+1)*F])
		experts = append(experts, e)
		k++
	}
	ms.active = experts
	m.ops.MatMulN(m.pool, ws, xn, outs, 1)
	m.ops.SiLUMul(ms.g[:k*F], ms.g[:k*F], ms.u[:k*F])
	// The down products have different inputs, so one parallel region
	// over the experts runs them, each product inline on its worker.
	ms.out = grow(ms.out, k*d)
	m.pool.For(k, 1, func(lo, hi int) {
		for j := lo; j < hi; j++ {
			m.ops.MatMul(m.pool, l.DownExps[experts[j]], ms.g[j*F:(j+1)*F], ms.out[j*d:(j+1)*d], 1)
		}
	})
	for j, e := range experts {
		w, y := ms.wts[e][0], ms.out[j*d:(j+1)*d]
		for t := range out {
			out[t] += w * y[t]
		}
		m.countExpert(l, li, e, 1)
	}
}

// countExpert records that expert e of layer li served n tokens, reading
// its three matrices once.
func (m *Model) countExpert(l *Layer, li, e, n int) {
	m.experts[li*m.Config.NExpert+e].Add(uint64(n))
	m.expertBytes.Add(uint64(len(l.GateExps[e].Data) + len(l.UpExps[e].Data) + len(l.DownExps[e].Data)))
}

// route turns the router logits of T tokens into each expert's rows and
// weights, as llama.cpp's build_moe_ffn does: probabilities by softmax over
// all experts (or a sigmoid each), the NExpertUsed largest selected (by
// probability plus exp_probs_b when stored), their probabilities as
// weights, renormalised to sum 1 when the architecture says so (the sum
// clamped below at 2^-14) and scaled when a scale other than 0 or 1 is set.
func (m *Model) route(ms *moeScratch, l *Layer, T int) {
	c := &m.Config
	E, K := c.NExpert, c.NExpertUsed
	if len(ms.rows) != E {
		ms.rows, ms.wts = make([][]int32, E), make([][]float32, E)
	}
	for e := range ms.rows {
		ms.rows[e], ms.wts[e] = ms.rows[e][:0], ms.wts[e][:0]
	}
	ms.sel = grow(ms.sel, E)
	var picked [64]int
	idx := picked[:0]
	if K > len(picked) {
		idx = make([]int, 0, K)
	}
	var wbuf [64]float32
	w := wbuf[:0]
	if K > len(wbuf) {
		w = make([]float32, 0, K)
	}
	for i := 0; i < T; i++ {
		p := ms.logits[i*E : (i+1)*E]
		switch c.Gating {
		case arch.GatingSigmoid:
			for e, v := range p {
				p[e] = sigmoid(v)
			}
		default:
			m.ops.Softmax(p)
		}
		copy(ms.sel, p)
		if l.ProbsBias != nil {
			addTo(ms.sel, l.ProbsBias)
		}
		idx, w = idx[:0], w[:0]
		var sum float32
		for k := 0; k < K; k++ {
			best := -1
			for e, v := range ms.sel {
				if !math.IsInf(float64(v), -1) && (best < 0 || v > ms.sel[best]) {
					best = e
				}
			}
			if best < 0 {
				break
			}
			ms.sel[best] = float32(math.Inf(-1))
			idx, w = append(idx, best), append(w, p[best])
			sum += p[best]
		}
		if c.ExpertNorm {
			sum = max(sum, 6.103515625e-5)
			for k := range w {
				w[k] /= sum
			}
		}
		if s := c.ExpertScale; s != 0 && s != 1 {
			for k := range w {
				w[k] *= s
			}
		}
		for k, e := range idx {
			ms.rows[e] = append(ms.rows[e], int32(i))
			ms.wts[e] = append(ms.wts[e], w[k])
		}
	}
}

func sigmoid(x float32) float32 { return float32(1 / (1 + math.Exp(-float64(x)))) }
