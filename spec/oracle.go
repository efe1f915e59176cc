package spec

import (
	"fmt"
	"math/rand/v2"
	"slices"
)

// Oracle is a proposer whose acceptance rate is set by hand, to measure
// what speculation's mechanics buy apart from how good a draft is. It
// knows each request's greedy continuation (Refs: prompt then output) and
// proposes it, replacing each token by a wrong one with probability
// 1-Alpha; a greedy target then accepts each draft token with probability
// Alpha, independently, until the first wrong one.
type Oracle struct {
	Alpha float64
	Vocab int
	Refs  [][]int32
	rng   *rand.Rand
}

// NewOracle checks alpha and the vocabulary size; seed fixes the errors.
func NewOracle(alpha float64, vocab int, refs [][]int32, seed uint64) (*Oracle, error) {
	if alpha < 0 || alpha > 1 || vocab < 2 {
		return nil, fmt.Errorf("spec: oracle: acceptance %v must be in [0, 1], vocabulary %d at least 2", alpha, vocab)
	}
	return &Oracle{Alpha: alpha, Vocab: vocab, Refs: refs, rng: rand.New(rand.NewPCG(seed, 0x0a1c1e))}, nil
}

func (o *Oracle) Propose(reqs []*Req) error {
	for _, r := range reqs {
		r.Draft, r.Probs = r.Draft[:0], r.Probs[:0]
		ref := o.ref(r.Tokens)
		for i := 0; i < r.Max && len(r.Tokens)+i < len(ref); i++ {
			t := ref[len(r.Tokens)+i]
			if o.rng.Float64() >= o.Alpha {
				t = (t + 1) % int32(o.Vocab)
			}
			r.Draft = append(r.Draft, t)
		}
	}
	return nil
}

func (o *Oracle) ref(toks []int32) []int32 {
	for _, ref := range o.Refs {
		if len(ref) > len(toks) && slices.Equal(ref[:len(toks)], toks) {
			return ref
		}
	}
	return nil
}

func (o *Oracle) Truncate(int32, int) {}
func (o *Oracle) Free(int32)          {}
