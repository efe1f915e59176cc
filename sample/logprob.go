package sample

import "math"

// TokenLogprob is one candidate and its log-probability. It has the same
// fields as engine.TokenLogprob, so a plain conversion maps one to the other.
type TokenLogprob struct {
	ID      int32
	Logprob float32
}

// logSumExp returns max and log Σ exp(l - max) over the non-NaN logits.
func logSumExp(logits []float32) (m float32, lse float64) {
	m, ok := maxLogit(logits)
	if !ok {
		return m, 0
	}
	var sum float64
	for _, l := range logits {
		if l == l {
			sum += math.Exp(float64(l) - float64(m))
		}
	}
	return m, math.Log(sum)
}

// LogSoftmax writes log-probabilities of logits into out (len(out) >=
// len(logits)). Call it on the raw logits before Sample when the API asks
// for logprobs: Sample edits logits in place.
func LogSoftmax(logits []float32, out []float32) {
	if len(logits) == 0 {
		return
	}
	m, lse := logSumExp(logits)
	for i, l := range logits {
		out[i] = float32(float64(l) - float64(m) - lse)
	}
}

// Logprob returns the log-probability of token id under softmax(logits).
func Logprob(logits []float32, id int32) float32 {
	if id < 0 || int(id) >= len(logits) {
		return float32(math.Inf(-1))
	}
	m, lse := logSumExp(logits)
	return float32(float64(logits[id]) - float64(m) - lse)
}

// TopLogprobs returns the k most likely tokens with their log-probabilities,
// best first (lowest id first on ties), without sorting the vocabulary.
func TopLogprobs(logits []float32, k int) []TokenLogprob {
	if k <= 0 || len(logits) == 0 {
		return nil
	}
	if k > len(logits) {
		k = len(logits)
	}
	cands := selectTop(logits, nil, k, make([]cand, 0, k))
	m, lse := logSumExp(logits)
	out := make([]TokenLogprob, len(cands))
	for i, c := range cands {
		out[i] = TokenLogprob{c.id, float32(float64(c.logit) - float64(m) - lse)}
	}
	return out
}
