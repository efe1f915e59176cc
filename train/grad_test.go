package train

import (
	"math"
	"testing"
)

func tinyConfig(tied bool) Config {
	return Config{Dim: 16, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 4, FFN: 24, Vocab: 37, Context: 16,
		RopeTheta: 10000, RMSEps: 1e-5, Tied: tied}
}

func tinyBatch(c Config, B, T int, seed uint64) (tokens, targets []int32) {
	r := NewRNG(seed)
	tokens, targets = make([]int32, B*T), make([]int32, B*T)
	for i := range tokens {
		tokens[i] = int32(r.Intn(c.Vocab))
		targets[i] = int32(r.Intn(c.Vocab))
	}
	return
}

// newTiny is a tiny model with weights large enough (std 0.3 rather than
// 0.02) that attention is not uniform and every path carries gradient.
func newTiny(t *testing.T, c Config) *Model {
	t.Helper()
	m, err := NewModel(c, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	r := NewRNG(7)
	for _, ts := range c.Tensors() {
		for i := ts.Off; i < ts.Off+ts.Len; i++ {
			if ts.Matrix {
				m.Params[i] = float32(r.Normal() * 0.3)
			} else {
				m.Params[i] = float32(1 + 0.2*r.Normal())
			}
		}
	}
	return m
}

func toF64(p []float32) []float64 {
	out := make([]float64, len(p))
	for i, v := range p {
		out[i] = float64(v)
	}
	return out
}

// TestForwardMatchesFloat64: the float32 forward pass (loss and logits)
// agrees with the float64 reference.
func TestForwardMatchesFloat64(t *testing.T) {
	for _, tied := range []bool{false, true} {
		c := tinyConfig(tied)
		m := newTiny(t, c)
		B, T := 3, 7
		tokens, targets := tinyBatch(c, B, T, 1)
		loss, err := m.Forward(tokens, targets, B, T)
		if err != nil {
			t.Fatal(err)
		}
		ref, refLogits := refForward(c, toF64(m.Params), tokens, targets, B, T)
		var worst float64
		for n, row := range refLogits {
			for v, want := range row {
				worst = math.Max(worst, math.Abs(float64(m.Logits()[n*c.Vocab+v])-want))
			}
		}
		t.Logf("tied=%v: loss %.7f (float64 %.7f), max |Δlogit| %.3g", tied, loss, ref, worst)
		if math.Abs(loss-ref) > 1e-5*math.Abs(ref) || worst > 1e-4 {
			t.Errorf("tied=%v: float32 forward differs from float64: loss %v vs %v, logits by %g", tied, loss, ref, worst)
		}
	}
}

// TestGradientsMatchFiniteDifferences compares the hand-written backward
// pass with central differences of the float64 reference loss, for every
// parameter tensor (up to 24 elements of each), and reports the largest
// relative error per tensor: |g − fd| / max(|fd|, 1e-3·max|fd| of the
// tensor) elementwise, the floor keeping tiny gradients from dominating.
func TestGradientsMatchFiniteDifferences(t *testing.T) {
	for _, tied := range []bool{false, true} {
		c := tinyConfig(tied)
		m := newTiny(t, c)
		B, T := 2, 6
		tokens, targets := tinyBatch(c, B, T, 2)
		if _, err := m.Forward(tokens, targets, B, T); err != nil {
			t.Fatal(err)
		}
		if err := m.Backward(); err != nil {
			t.Fatal(err)
		}
		p := toF64(m.Params)
		const h = 1e-5
		r := NewRNG(3)
		var overall float64
		for _, ts := range c.Tensors() {
			idx := make([]int, 0, 24)
			if ts.Len <= 24 {
				for i := 0; i < ts.Len; i++ {
					idx = append(idx, ts.Off+i)
				}
			} else {
				for len(idx) < 24 {
					idx = append(idx, ts.Off+r.Intn(ts.Len))
				}
			}
			fds := make([]float64, len(idx))
			var fdMax float64
			for k, i := range idx {
				old := p[i]
				p[i] = old + h
				lp, _ := refForward(c, p, tokens, targets, B, T)
				p[i] = old - h
				lm, _ := refForward(c, p, tokens, targets, B, T)
				p[i] = old
				fds[k] = (lp - lm) / (2 * h)
				fdMax = math.Max(fdMax, math.Abs(fds[k]))
			}
			var worst float64
			for k, i := range idx {
				den := math.Max(math.Abs(fds[k]), 1e-3*fdMax)
				if den == 0 {
					continue
				}
				worst = math.Max(worst, math.Abs(float64(m.Grads[i])-fds[k])/den)
			}
			t.Logf("tied=%v %-26s max rel err %.2e (max |grad| %.2e)", tied, ts.Name, worst, fdMax)
			if fdMax == 0 {
				t.Errorf("%s: zero gradient everywhere sampled", ts.Name)
			}
			overall = math.Max(overall, worst)
		}
		if overall > 1e-2 {
			t.Errorf("tied=%v: max relative gradient error %.3g", tied, overall)
		}
	}
}
