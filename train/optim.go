package train

import "math"

// Schedule is the learning rate over steps: linear warm-up from 0 to Max
// over Warmup steps, then cosine decay to Min at step Total.
type Schedule struct {
	Max, Min      float64
	Warmup, Total int
}

// At is the learning rate of step (0-based).
func (s Schedule) At(step int) float64 {
	if step < s.Warmup {
		return s.Max * float64(step+1) / float64(s.Warmup)
	}
	if step >= s.Total || s.Total <= s.Warmup {
		return s.Min
	}
	frac := float64(step-s.Warmup) / float64(s.Total-s.Warmup)
	return s.Min + 0.5*(s.Max-s.Min)*(1+math.Cos(math.Pi*frac))
}

// AdamW is Adam with decoupled weight decay (Loshchilov & Hutter), the
// decay applied to matrices only, as GPT-2 and llm.c do.
type AdamW struct {
	Beta1, Beta2, Eps, WeightDecay float64
	// M and V are the moment estimates; Step counts the updates made.
	M, V []float32
	Step int
}

// NewAdamW makes an optimizer for n parameters with the usual settings
// (β = 0.9, 0.95; ε = 1e-8).
func NewAdamW(n int, weightDecay float64) *AdamW {
	return &AdamW{Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: weightDecay, M: make([]float32, n), V: make([]float32, n)}
}

// ClipGradNorm scales grads so that their L2 norm is at most maxNorm
// (maxNorm <= 0: no clipping) and returns the norm before clipping.
func ClipGradNorm(grads []float32, maxNorm float64) float64 {
	var ss float64
	for _, g := range grads {
		ss += float64(g) * float64(g)
	}
	norm := math.Sqrt(ss)
	if maxNorm > 0 && norm > maxNorm {
		s := float32(maxNorm / norm)
		for i := range grads {
			grads[i] *= s
		}
	}
	return norm
}

// Update applies one step at learning rate lr to the parameters of c.
func (o *AdamW) Update(c Config, params, grads []float32, lr float64) {
	o.Step++
	b1, b2 := float32(o.Beta1), float32(o.Beta2)
	c1 := 1 - math.Pow(o.Beta1, float64(o.Step))
	c2 := 1 - math.Pow(o.Beta2, float64(o.Step))
	for _, t := range c.Tensors() {
		decay := float32(0)
		if t.Matrix {
			decay = float32(lr * o.WeightDecay)
		}
		stepSize := float32(lr / c1)
		sq := float32(math.Sqrt(c2))
		eps := float32(o.Eps)
		p, g := params[t.Off:t.Off+t.Len], grads[t.Off:t.Off+t.Len]
		m, v := o.M[t.Off:t.Off+t.Len], o.V[t.Off:t.Off+t.Len]
		for i := range p {
			m[i] = b1*m[i] + (1-b1)*g[i]
			v[i] = b2*v[i] + (1-b2)*g[i]*g[i]
			p[i] -= stepSize*m[i]/(float32(math.Sqrt(float64(v[i])))/sq+eps) + decay*p[i]
		}
	}
}
