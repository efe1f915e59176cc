package train

import (
	"math"
	"testing"
)

func TestScheduleShape(t *testing.T) {
	s := Schedule{Max: 1e-3, Min: 1e-4, Warmup: 10, Total: 110}
	for _, c := range []struct {
		step int
		want float64
	}{{0, 1e-4}, {9, 1e-3}, {60, 5.5e-4}, {110, 1e-4}, {500, 1e-4}} {
		if got := s.At(c.step); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("step %d: lr %g, want %g", c.step, got, c.want)
		}
	}
}

func TestClipGradNorm(t *testing.T) {
	g := []float32{3, 4}
	if n := ClipGradNorm(g, 1); n != 5 || math.Abs(float64(g[0])-0.6) > 1e-6 || math.Abs(float64(g[1])-0.8) > 1e-6 {
		t.Errorf("norm %v, clipped %v; want 5, [0.6 0.8]", n, g)
	}
	g = []float32{0.3, 0.4}
	if ClipGradNorm(g, 1); g[0] != 0.3 || g[1] != 0.4 {
		t.Errorf("clipping below the bound changed the gradient: %v", g)
	}
}

// TestTrainingReducesLoss: a few AdamW steps on one repeated toy sequence
// drive the loss well down (memorisation), with warm-up, decay and
// clipping in the loop.
func TestTrainingReducesLoss(t *testing.T) {
	c := tinyConfig(false)
	m, err := NewModel(c, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	c.Init(m.Params, 1)
	B, T := 2, 12
	tokens, targets := make([]int32, B*T), make([]int32, B*T)
	seq := []int32{5, 9, 2, 7, 7, 1, 30, 4, 11, 3, 8, 20, 17}
	for b := 0; b < B; b++ {
		copy(tokens[b*T:], seq[:T])
		copy(targets[b*T:], seq[1:T+1])
	}
	opt := NewAdamW(len(m.Params), 0.1)
	sched := Schedule{Max: 1e-2, Min: 1e-3, Warmup: 5, Total: 60}
	var first, last float64
	for step := 0; step < 60; step++ {
		loss, err := m.Forward(tokens, targets, B, T)
		if err != nil {
			t.Fatal(err)
		}
		if step == 0 {
			first = loss
		}
		last = loss
		if err := m.Backward(); err != nil {
			t.Fatal(err)
		}
		ClipGradNorm(m.Grads, 1)
		opt.Update(c, m.Params, m.Grads, sched.At(step))
	}
	t.Logf("loss %.4f → %.4f in 60 steps (ln %d = %.4f)", first, last, c.Vocab, math.Log(float64(c.Vocab)))
	if math.Abs(first-math.Log(float64(c.Vocab))) > 0.1 {
		t.Errorf("initial loss %.4f, want about ln V = %.4f", first, math.Log(float64(c.Vocab)))
	}
	if last > 0.5 {
		t.Errorf("loss only fell from %.4f to %.4f", first, last)
	}
}
