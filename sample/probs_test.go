package sample

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestSampleProbs holds the returned row to an independent reference (the
// softmax of the scaled logits over refFilter's survivors) and checks that
// SampleProbs draws exactly what Sample draws for the same seed.
func TestSampleProbs(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	logits := make([]float32, 400)
	for i := range logits {
		logits[i] = float32(r.NormFloat64()) * 2
	}
	for _, p := range []Params{
		{Temperature: 0},
		{Temperature: 1},
		{Temperature: 0.7},
		{Temperature: 1.3, TopK: 20},
		{Temperature: 1, TopK: 1},
		{Temperature: 0.8, TopP: 0.9},
		{Temperature: 1, MinP: 0.1},
		{Temperature: 1, TopP: 0.8, MinP: 0.05},
		{Temperature: 0.9, TopK: 50, TopP: 0.7},
	} {
		p.Seed, p.HasSeed = 7, true
		plain, _ := New(p)
		withProbs, _ := New(p)
		for draw := 0; draw < 20; draw++ {
			want := plain.Sample(slices.Clone(logits), nil)
			id, probs := withProbs.SampleProbs(slices.Clone(logits), nil)
			if id != want {
				t.Fatalf("%+v draw %d: SampleProbs drew %d, Sample %d", p, draw, id, want)
			}
			ref := refProbs(logits, p)
			var sum float64
			for i, q := range probs {
				sum += float64(q)
				if math.Abs(float64(q)-ref[i]) > 1e-6 {
					t.Fatalf("%+v: p[%d] = %g, reference %g", p, i, q, ref[i])
				}
			}
			if math.Abs(sum-1) > 1e-5 {
				t.Fatalf("%+v: probabilities sum to %v", p, sum)
			}
			if probs[id] <= 0 {
				t.Fatalf("%+v: drew %d of probability %g", p, id, probs[id])
			}
		}
	}
}

// refProbs is the distribution Params describe over logits (no bias or
// penalties): one-hot on the argmax for temperature 0, else the softmax of
// logits/T renormalised over the top-k/top-p/min-p survivors.
func refProbs(logits []float32, p Params) []float64 {
	out := make([]float64, len(logits))
	if p.Temperature == 0 {
		out[Greedy(logits)] = 1
		return out
	}
	scaled := make([]float32, len(logits))
	for i, l := range logits {
		scaled[i] = l * (1 / p.Temperature)
	}
	keep := refFilter(scaled, Params{Temperature: 1, TopK: p.TopK, TopP: p.TopP, MinP: p.MinP})
	m := math.Inf(-1)
	for id := range keep {
		m = max(m, float64(scaled[id]))
	}
	var total float64
	for id := range keep {
		out[id] = math.Exp(float64(scaled[id]) - m)
		total += out[id]
	}
	for id := range keep {
		out[id] /= total
	}
	return out
}

// TestSampleProbsPenalties: the row reflects bias and penalties (a banned
// token and a repeated one), and greedy is one-hot on the penalised argmax.
func TestSampleProbsPenalties(t *testing.T) {
	logits := []float32{3, 2.9, 1, 0.5}
	history := []int32{0, 0}
	s, _ := New(Params{Temperature: 1, PresencePenalty: 1, LogitBias: map[int32]float32{3: float32(math.Inf(-1))}, Seed: 1, HasSeed: true})
	_, probs := s.SampleProbs(slices.Clone(logits), history)
	// token 0 loses 1: logits 2, 2.9, 1, -Inf.
	want := []float64{math.Exp(2), math.Exp(2.9), math.Exp(1), 0}
	total := want[0] + want[1] + want[2]
	for i := range want {
		if math.Abs(float64(probs[i])-want[i]/total) > 1e-6 {
			t.Fatalf("probs %v, want %v/%v", probs, want, total)
		}
	}
	g, _ := New(Params{PresencePenalty: 1})
	id, probs := g.SampleProbs(slices.Clone(logits), history)
	if id != 1 || !slices.Equal(probs, []float32{0, 1, 0, 0}) {
		t.Fatalf("greedy drew %d with %v, want 1 one-hot", id, probs)
	}
}

// TestSampleProbsFrequencies draws many times with a fixed seed and holds
// the counts to the returned row with a chi-square bound far above its
// expected value (the degrees of freedom), so it is deterministic and not
// tight enough to break on a harmless change of stream.
func TestSampleProbsFrequencies(t *testing.T) {
	logits := []float32{1.2, 0.3, 2.0, -0.5, 0.9, -3, 1.7, 0}
	for _, p := range []Params{
		{Temperature: 1},
		{Temperature: 0.8, TopK: 5},
		{Temperature: 1.2, TopP: 0.8},
		{Temperature: 1, MinP: 0.2},
	} {
		p.Seed, p.HasSeed = 2024, true
		s, _ := New(p)
		const n = 50000
		counts := make([]float64, len(logits))
		var row []float32
		for i := 0; i < n; i++ {
			id, probs := s.SampleProbs(slices.Clone(logits), nil)
			if row == nil {
				row = slices.Clone(probs)
			} else if !slices.Equal(row, probs) {
				t.Fatalf("%+v: the row changed between draws without history", p)
			}
			counts[id]++
		}
		var chi2 float64
		df := -1
		for i, q := range row {
			if q == 0 {
				if counts[i] != 0 {
					t.Fatalf("%+v: token %d drawn %v times at probability 0", p, i, counts[i])
				}
				continue
			}
			df++
			e := float64(q) * n
			chi2 += (counts[i] - e) * (counts[i] - e) / e
		}
		// P(chi2 > 40) is below 1e-5 for df <= 7.
		if chi2 > 40 {
			t.Fatalf("%+v: chi-square %.1f over %d degrees of freedom; counts %v, row %v", p, chi2, df, counts, row)
		}
		t.Logf("%+v: chi-square %.2f, df %d", p, chi2, df)
	}
}
