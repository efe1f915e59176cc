package kvcache

import (
	"fmt"
	"math"
)

// H2OPolicy is Heavy-Hitter Oracle (Zhang et al., 2023): per sequence,
// layer and KV head, the attention mass every cached position has
// received so far (summed over the GQA group's query heads); when a head
// holds more than the budget after a step, it keeps the Heavy positions of
// most mass and the Recent latest ones and evicts the rest, for good.
// Heavy and Recent below 1 are fractions of the sequence's length (the
// paper's 10% + 10%), from 1 on token counts. Prompt chunks attend what
// is kept when they run; evictions happen between steps. See mask.go for
// how per-head choices live in the shared block table.
type H2OPolicy struct {
	Heavy, Recent float64
	m             *maskState
}

// NewH2O makes an H2O policy; each cache binds its own copy.
func NewH2O(heavy, recent float64) *H2OPolicy { return &H2OPolicy{Heavy: heavy, Recent: recent} }

func (p *H2OPolicy) String() string {
	return fmt.Sprintf("h2o:heavy=%g,recent=%g", p.Heavy, p.Recent)
}

// Check implements the configuration check.
func (p *H2OPolicy) Check() error {
	if !(p.Heavy >= 0 && p.Recent >= 0) || p.Heavy+p.Recent == 0 || (p.Heavy < 1 && p.Recent < 1 && p.Heavy+p.Recent >= 1) {
		return fmt.Errorf("kvcache: h2o with heavy %g and recent %g (want fractions summing below 1, or counts)", p.Heavy, p.Recent)
	}
	return nil
}

func (p *H2OPolicy) attach(c *Cache, gi int) (Policy, error) {
	return &H2OPolicy{Heavy: p.Heavy, Recent: p.Recent, m: newMaskState(c, gi)}, nil
}

// budget is the heavy and recent counts at sequence length n.
func (p *H2OPolicy) budget(n int) (heavy, recent int) {
	count := func(x float64) int {
		if x < 1 {
			return int(math.Ceil(x * float64(n)))
		}
		return int(x)
	}
	return count(p.Heavy), count(p.Recent)
}

// Visible implements Policy.
func (*H2OPolicy) Visible(_ int32, pos int, dst []Span) []Span { return append(dst, Span{0, pos + 1}) }

// Release implements Policy: blocks every head has evicted.
func (p *H2OPolicy) Release(seq int32, next, bs int, dst []Span) []Span {
	return p.m.release(seq, next, bs, dst)
}

// MaxBlocks implements Policy: no bound (per-head choices rarely free a block).
func (*H2OPolicy) MaxBlocks(_, _ int) int { return 0 }

// Lossy implements Lossy.
func (*H2OPolicy) Lossy() bool { return true }

func (p *H2OPolicy) beginStep(owns func(int32) bool) { p.m.beginStep(owns) }

// ObserveScores implements ScoreObserver.
func (p *H2OPolicy) ObserveScores(layer int, seq int32, _, head int, spans []Span, w []float32) {
	p.m.observe(p.m.seqs[seq], layer, head, spans, w)
}

// Select implements PageSelector: the positions the head still keeps.
func (p *H2OPolicy) Select(layer int, seq int32, _, kvHead int, q []float32, spans, dst []Span) []Span {
	p.m.learnGroup(q)
	return p.m.selectKept(seq, layer, kvHead, spans, dst)
}

// Committed implements Tracker: the eviction step.
func (p *H2OPolicy) Committed(seq int32, next int) {
	s := p.m.seqs[seq]
	if s == nil {
		return
	}
	heavy, recent := p.budget(next)
	var cand, idx []int
	for i := range s.gone {
		gone, acc := s.gone[i], s.acc[i]
		cand = cand[:0]
		for t := 0; t < max(0, next-recent); t++ {
			if !gone[t] {
				cand = append(cand, t)
			}
		}
		if keepTop(gone, cand, func(t int) int64 { return acc[t] }, heavy, idx) && s.sealed == math.MaxInt {
			s.sealed = next
		}
	}
}

// hitLimit: every prompt query adds mass, so a prefix hit would change
// what is evicted; H2O takes no prefix hits.
func (*H2OPolicy) hitLimit(int) int { return 0 }

// Truncated implements Tracker.
func (p *H2OPolicy) Truncated(seq int32, n int) { p.m.truncated(seq, n) }

// Forked implements Tracker.
func (p *H2OPolicy) Forked(parent, child int32) { p.m.forked(parent, child) }

// Sealed implements Sealer.
func (p *H2OPolicy) Sealed(seq int32) int { return p.m.sealedAt(seq) }

func init() {
	policyMakers["h2o"] = func(a *args) Policy { return NewH2O(a.float("heavy", 0.1), a.float("recent", 0.1)) }
}
