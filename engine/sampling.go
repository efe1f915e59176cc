package engine

import (
	"math/rand/v2"

	"pagoda/sample"
)

// tokenSampler is what the step loop needs of a sampler: one per sequence.
type tokenSampler interface {
	Sample(logits []float32, history []int32) int32
	Err() error // a constraint's failure (Request.Constraint)
}

// newSampler builds the sampler of completion index of a request. With a
// seed, completion i draws from seed+i so parallel completions differ yet
// each is reproducible.
func newSampler(p sample.Params, index int, con sample.Constraint) (tokenSampler, error) {
	if p.HasSeed {
		p.Seed += uint64(index)
	} else {
		// sample.New would seed from the clock, which can repeat for
		// samplers built in the same instant: parallel completions would
		// then be copies of each other.
		p.Seed, p.HasSeed = rand.Uint64(), true
	}
	return sample.NewConstrained(p, con)
}

// topLogprobs picks the k most likely tokens of logits, best first.
func topLogprobs(logits []float32, k int) []TokenLogprob {
	top := sample.TopLogprobs(logits, k)
	out := make([]TokenLogprob, len(top))
	for i, t := range top {
		out[i] = TokenLogprob(t)
	}
	return out
}
