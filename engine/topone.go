package engine

import (
	"fmt"
	"math"
)

// Greedy steps across workers (StepInput.TopK).
//
// A tensor-parallel group splits the output head by vocabulary, so whole
// logits rows cost an all-gather among the ranks and V floats per row on
// the wire back; a step that asks for each row's largest logit alone has
// every rank reduce its slice to one candidate and ships one number per
// row. The engine asks for it when an executor elsewhere runs its steps
// and every row of the step only feeds a greedy choice: no log-probabilities
// (of the prompt or the output), no logit bias, penalties or grammar (they
// edit the row before the choice), one completion per request (forks
// sample one row several times), no drafts to verify. The reply is spread
// back into rows that hold the top logit and -Inf elsewhere, which the
// greedy sampler reads as it reads a whole row: the largest entry, ties to
// the lower id on both paths.

// topOnly reports whether r's tokens depend on nothing but each row's
// largest logit.
func topOnly(r *Request, constrained bool) bool {
	s := &r.Sampling
	return s.Temperature == 0 && !r.Logprobs && r.TopLogprobs == 0 && !r.PromptLogprobs && !r.ScoreOnly &&
		len(s.LogitBias) == 0 && (s.RepetitionPenalty == 0 || s.RepetitionPenalty == 1) &&
		s.FrequencyPenalty == 0 && s.PresencePenalty == 0 && !constrained && r.N <= 1
}

// stepTopK is the StepInput.TopK for plan p: 1 when an executor on other
// processes runs it (remote) and every row only feeds a greedy choice.
func stepTopK(p *plan, remote bool) int {
	if !remote || p.rows == 0 {
		return 0
	}
	for i := range p.seqs {
		w := &p.seqs[i]
		if w.promptRows > 0 || len(w.draft) > 0 || w.fork || !topOnly(&w.seq.req.r, w.seq.req.constraint != nil) {
			return 0
		}
	}
	return 1
}

// spreadTop writes rows×V logits into dst (reused) holding each row's k
// top entries (ids and vals, k per row, as executor.TopK returns them) and
// -Inf everywhere else.
func spreadTop(dst []float32, ids []int32, vals []float32, rows, V, k int) ([]float32, error) {
	if len(ids) != rows*k || len(vals) != len(ids) {
		return dst, fmt.Errorf("engine: %d top-k ids and %d logits for %d rows of %d", len(ids), len(vals), rows, k)
	}
	if cap(dst) < rows*V {
		dst = make([]float32, rows*V)
	}
	dst = dst[:rows*V]
	inf := float32(math.Inf(-1))
	for i := range dst {
		dst[i] = inf
	}
	for r := range rows {
		for j := r * k; j < (r+1)*k; j++ {
			if ids[j] < 0 || int(ids[j]) >= V {
				return dst, fmt.Errorf("engine: top-k id %d outside the vocabulary of %d", ids[j], V)
			}
			dst[r*V+int(ids[j])] = vals[j]
		}
	}
	return dst, nil
}
