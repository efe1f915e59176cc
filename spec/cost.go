package spec

import "math"

// Cost models what a step costs, from measurements: the target's step
// (forward pass, sampling and verification, bookkeeping) as a + b·tokens
// seconds (fitted by least squares over recent steps,
// older ones decaying), and the proposer's time per drafted token d. On a
// CPU a decode step is bound by reading the weights, so a is large and b
// small while the batch is small; as the batch grows the step becomes
// compute-bound, b·tokens dominates, and verifying drafts stops paying.
// The zero value is ready to use.
type Cost struct {
	w, sx, sy, sxx, sxy float64 // decayed sums over steps
	dw, dTok, dSec      float64 // decayed sums over proposals
	explore             int     // turns of Gamma while the fit is unknown
	fitA, fitB          float64 // the last fit the data supported
	fitted              bool
}

// costDecay is the weight a step's measurement keeps per later step.
const costDecay = 0.98

// ObserveStep records a target forward pass over tokens tokens.
func (c *Cost) ObserveStep(tokens int, seconds float64) {
	x := float64(tokens)
	c.w = c.w*costDecay + 1
	c.sx = c.sx*costDecay + x
	c.sy = c.sy*costDecay + seconds
	c.sxx = c.sxx*costDecay + x*x
	c.sxy = c.sxy*costDecay + x*seconds
}

// ObserveDraft records a proposal round that drafted tokens tokens.
func (c *Cost) ObserveDraft(tokens int, seconds float64) {
	c.dw = c.dw*costDecay + 1
	c.dTok = c.dTok*costDecay + float64(tokens)
	c.dSec = c.dSec*costDecay + seconds
}

// Line is the fitted step time a + b·tokens; ok is false until the
// steps seen vary enough in size to separate a from b. When they stop
// varying (speculation found not to pay, every step one size) the last
// fit they supported stands.
func (c *Cost) Line() (a, b float64, ok bool) {
	if c.w >= 4 {
		mx, my := c.sx/c.w, c.sy/c.w
		if vx := c.sxx/c.w - mx*mx; vx >= 0.25 {
			b = max((c.sxy/c.w-mx*my)/vx, 0)
			c.fitA, c.fitB, c.fitted = max(my-b*mx, 0), b, true
		}
	}
	return c.fitA, c.fitB, c.fitted
}

// DraftPerToken is the proposer's measured seconds per drafted token.
func (c *Cost) DraftPerToken() float64 {
	if c.dTok <= 0 {
		return 0
	}
	return c.dSec / c.dTok
}

// payMargin is how much better than break-even a draft must look to be
// verified: the fit is noisy and leaves out costs (the draft's own
// bookkeeping, catching its cache up), and a draft that only breaks even
// on paper made a same-size draft model slower at 8 requests in flight.
const payMargin = 1.25

// Gamma is how many drafts a sequence with acceptance rate alpha should
// have verified in a step that, without drafts, forwards tokens tokens for
// seqs decoding sequences, at most max. The k-th draft yields α^k tokens
// on average and costs b + d seconds; it pays when that beats the step's
// plain rate, seqs/(a + b·tokens) tokens per second, by payMargin. Until
// the fit is known it cycles through 0..max, so that steps of different
// sizes get measured (always drafting max would give steps of one size,
// from which a and b cannot be told apart).
func (c *Cost) Gamma(alpha float64, tokens, seqs, max int) int {
	a, b, ok := c.Line()
	if !ok {
		c.explore++
		return c.explore % (max + 1)
	}
	per := b + c.DraftPerToken()
	if per <= 0 {
		return max
	}
	rate := float64(seqs) / (a + b*float64(tokens))
	g := 0
	for g < max && math.Pow(alpha, float64(g+1)) > payMargin*per*rate {
		g++
	}
	return g
}
