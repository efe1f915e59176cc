package encoder

import (
	"fmt"
	"math"

	"pagoda/kernels"
	"pagoda/quant"
)

// Hidden runs the sequences through the encoder together and returns each
// one's last-layer hidden states (len(seq)·NEmbd floats). Every token
// attends to every token of its own sequence and none of another's, and
// every other step works row by row, so a sequence's states do not depend
// on what it is batched with.
func (m *Model) Hidden(seqs [][]int32) ([][]float32, error) {
	c := &m.Config
	T := 0
	for i, s := range seqs {
		if len(s) == 0 {
			return nil, fmt.Errorf("encoder: input %d is empty", i)
		}
		if len(s) > c.ContextLen {
			return nil, fmt.Errorf("encoder: input %d has %d tokens, more than the model's %d positions", i, len(s), c.ContextLen)
		}
		for _, t := range s {
			if t < 0 || int(t) >= m.embd.Rows {
				return nil, fmt.Errorf("encoder: input %d: token %d out of range [0, %d)", i, t, m.embd.Rows)
			}
		}
		T += len(s)
	}
	if T == 0 {
		return nil, fmt.Errorf("encoder: no input")
	}
	d := c.NEmbd
	x := make([]float32, T*d)
	row := make([]float32, d)
	r := 0
	var typ0 []float32
	if m.types != nil {
		typ0 = make([]float32, d)
		if err := quant.Dequantize(m.types.Type, m.types.Row(0), typ0); err != nil {
			return nil, err
		}
	}
	for _, s := range seqs {
		for p, t := range s {
			xr := x[r*d : (r+1)*d]
			if err := quant.Dequantize(m.embd.Type, m.embd.Row(int(t)), xr); err != nil {
				return nil, fmt.Errorf("encoder: embedding: %v", err)
			}
			// Token type 0 ("sentence A") for every token, as llama.cpp.
			if typ0 != nil {
				addTo(xr, typ0)
			}
			if err := quant.Dequantize(m.pos.Type, m.pos.Row(p), row); err != nil {
				return nil, fmt.Errorf("encoder: positions: %v", err)
			}
			addTo(xr, row)
			layerNorm(xr, m.embdNorm, m.embdNormB, c.Eps)
			r++
		}
	}

	q := make([]float32, T*d)
	k := make([]float32, T*d)
	v := make([]float32, T*d)
	att := make([]float32, T*d)
	o := make([]float32, T*d)
	hid := make([]float32, T*c.FFN)
	starts := make([]int, len(seqs)+1)
	for i, s := range seqs {
		starts[i+1] = starts[i] + len(s)
	}
	hd := d / c.NHead
	scale := float32(1 / math.Sqrt(float64(hd)))
	for li := range m.layers {
		L := &m.layers[li]
		m.ops.MatMulN(m.pool, []*kernels.Matrix{L.q, L.k, L.v}, x, [][]float32{q, k, v}, T)
		addBias(q, L.qb, d)
		addBias(k, L.kb, d)
		addBias(v, L.vb, d)
		// One task per (sequence, head).
		m.pool.For(len(seqs)*c.NHead, 1, func(lo, hi int) {
			var sc []float32
			for job := lo; job < hi; job++ {
				si, h := job/c.NHead, job%c.NHead
				a, b := starts[si], starts[si+1]
				n := b - a
				if cap(sc) < n {
					sc = make([]float32, n)
				}
				sc = sc[:n]
				for i := a; i < b; i++ {
					qi := q[i*d+h*hd : i*d+(h+1)*hd]
					mx := float32(math.Inf(-1))
					for j := a; j < b; j++ {
						s := m.ops.DotF32(qi, k[j*d+h*hd:j*d+(h+1)*hd]) * scale
						sc[j-a] = s
						mx = max(mx, s)
					}
					var sum float64
					for j := range sc {
						e := float32(math.Exp(float64(sc[j] - mx)))
						sc[j] = e
						sum += float64(e)
					}
					out := att[i*d+h*hd : i*d+(h+1)*hd]
					clear(out)
					inv := float32(1 / sum)
					for j := a; j < b; j++ {
						m.ops.AxpyF32(out, sc[j-a]*inv, v[j*d+h*hd:j*d+(h+1)*hd])
					}
				}
			}
		})
		m.ops.MatMul(m.pool, L.o, att, o, T)
		addBias(o, L.ob, d)
		for i := 0; i < T; i++ {
			xr := x[i*d : (i+1)*d]
			addTo(xr, o[i*d:(i+1)*d])
			layerNorm(xr, L.attnNorm, L.attnNormB, c.Eps)
		}
		m.ops.MatMul(m.pool, L.up, x, hid, T)
		addBias(hid, L.upb, c.FFN)
		for i, h := range hid {
			hid[i] = gelu(h)
		}
		m.ops.MatMul(m.pool, L.down, hid, o, T)
		addBias(o, L.downb, d)
		for i := 0; i < T; i++ {
			xr := x[i*d : (i+1)*d]
			addTo(xr, o[i*d:(i+1)*d])
			layerNorm(xr, L.outNorm, L.outNormB, c.Eps)
		}
	}
	out := make([][]float32, len(seqs))
	for i := range seqs {
		out[i] = x[starts[i]*d : starts[i+1]*d : starts[i+1]*d]
	}
	for _, f := range x {
		if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
			return nil, fmt.Errorf("encoder: non-finite hidden state (corrupt weights?)")
		}
	}
	return out, nil
}

// Embed runs the sequences and pools each with p (the model's own pooling
// when p < 0); vectors are not normalized.
func (m *Model) Embed(seqs [][]int32, p Pooling) ([][]float32, error) {
	if p < 0 {
		p = m.Config.Pooling
	}
	hs, err := m.Hidden(seqs)
	if err != nil {
		return nil, err
	}
	out := make([][]float32, len(hs))
	for i, h := range hs {
		if out[i], err = Pool(p, h, len(seqs[i]), m.Config.NEmbd); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func addTo(dst, src []float32) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] += src[i]
	}
}

func addBias(x, b []float32, n int) {
	if b == nil {
		return
	}
	for i := 0; i < len(x); i += n {
		addTo(x[i:i+n], b)
	}
}

// layerNorm normalizes x to zero mean and unit variance (in float64), then
// scales by w and shifts by b, as ggml_norm followed by mul and add.
func layerNorm(x, w, b []float32, eps float32) {
	var mean float64
	for _, v := range x {
		mean += float64(v)
	}
	mean /= float64(len(x))
	var vr float64
	for _, v := range x {
		dv := float64(v) - mean
		vr += dv * dv
	}
	vr /= float64(len(x))
	inv := 1 / math.Sqrt(vr+float64(eps))
	for i, v := range x {
		y := float32((float64(v) - mean) * inv)
		if w != nil {
			y *= w[i]
		}
		if b != nil {
			y += b[i]
		}
		x[i] = y
	}
}

// gelu is the tanh approximation ggml (and BERT's "gelu_new") uses.
func gelu(x float32) float32 {
	const c = 0.7978845608028654 // √(2/π)
	xf := float64(x)
	return float32(0.5 * xf * (1 + math.Tanh(c*xf*(1+0.044715*xf*xf))))
}

// SequenceHidden is Hidden, under the name the engine's embedder uses
// for decoders and encoders alike.
func (m *Model) SequenceHidden(seqs [][]int32) ([][]float32, error) { return m.Hidden(seqs) }
