package sample

import (
	"errors"
	"math"
	"testing"
)

// evenOnly allows even token ids and records what it was fed.
type evenOnly struct {
	accepted []int32
	fail     bool
}

func (c *evenOnly) Mask(logits []float32) error {
	if c.fail {
		return errors.New("nothing allowed")
	}
	for i := 1; i < len(logits); i += 2 {
		logits[i] = float32(math.Inf(-1))
	}
	return nil
}

func (c *evenOnly) Accept(tok int32) error {
	if tok%2 != 0 {
		return errors.New("odd token")
	}
	c.accepted = append(c.accepted, tok)
	return nil
}

// TestConstraint: every draw (greedy, full softmax, top-k, top-p, min-p,
// with probabilities) obeys the mask and is fed back; each sampler gets its
// own constraint; a failing mask surfaces as Err.
func TestConstraint(t *testing.T) {
	var made []*evenOnly
	factory := func() Constraint { c := &evenOnly{}; made = append(made, c); return c }
	for _, p := range []Params{
		{Temperature: 0}, {Temperature: 1}, {Temperature: 1, TopK: 40}, {Temperature: 0.7, TopP: 0.9}, {Temperature: 1.5, MinP: 0.05},
	} {
		p.Seed, p.HasSeed = 7, true
		s, err := NewConstrained(p, factory())
		if err != nil {
			t.Fatal(err)
		}
		c := made[len(made)-1]
		for i := range 200 {
			logits := make([]float32, 101)
			for j := range logits {
				logits[j] = float32((j*7919+i*31)%97) / 10
			}
			logits[1] = 100 // the best token is forbidden
			var tok int32
			if i%2 == 0 {
				tok = s.Sample(logits, nil)
			} else {
				var probs []float32
				tok, probs = s.SampleProbs(logits, nil)
				for j := 1; j < len(probs); j += 2 {
					if probs[j] != 0 {
						t.Fatalf("%+v: probs[%d] = %v", p, j, probs[j])
					}
				}
			}
			if tok%2 != 0 || s.Err() != nil || c.accepted[len(c.accepted)-1] != tok || len(c.accepted) != i+1 {
				t.Fatalf("%+v step %d: token %d, err %v, accepted %v", p, i, tok, s.Err(), c.accepted)
			}
		}
	}
	if len(made) != 5 {
		t.Fatalf("%d constraints made, want one per sampler", len(made))
	}
	s, _ := NewConstrained(Params{Temperature: 1}, &evenOnly{fail: true})
	s.Sample(make([]float32, 8), nil)
	if s.Err() == nil {
		t.Fatal("a failing mask left no error")
	}
}
