package spec

import "math"

// Accept is the rejection test of speculative sampling: draft token x,
// drawn from q, is kept with probability min(1, p(x)/q(x)), decided by u,
// uniform in [0, 1). With it and Residual the output is distributed
// exactly as p whatever q is.
func Accept(p, q []float32, x int32, u float64) bool {
	px, qx := float64(p[x]), float64(q[x])
	if qx <= 0 {
		// q never proposes what it gives no mass; treat a proposer bug
		// as a rejection rather than dividing by zero.
		return false
	}
	return u*qx < px // u < p/q, without the division
}

// Residual draws, after a rejection, from normalise(max(0, p - q)) using
// u, uniform in [0, 1). When p <= q everywhere (possible only through
// rounding, since a rejection needs some q(x) > p(x) and both sum to 1),
// it draws from p.
func Residual(p, q []float32, u float64) int32 {
	var total float64
	for i, pi := range p {
		if d := float64(pi) - float64(q[i]); d > 0 {
			total += d
		}
	}
	if total <= 0 {
		return Draw(p, u)
	}
	t := u * total
	var cum float64
	last := int32(-1)
	for i, pi := range p {
		d := float64(pi) - float64(q[i])
		if d <= 0 {
			continue
		}
		cum += d
		last = int32(i)
		if t < cum {
			return int32(i)
		}
	}
	return last
}

// Deplete writes normalise(max(0, p - q)) into dst (which may be p) and
// returns it: the target's distribution after a draft drawn from q was
// rejected, against which the next sibling of a tree is tested (SpecInfer's
// multi-draft rule). When p <= q everywhere (rounding) it is p.
func Deplete(dst, p, q []float32) []float32 {
	if cap(dst) < len(p) {
		dst = make([]float32, len(p))
	}
	dst = dst[:len(p)]
	var total float64
	for i, pi := range p {
		total += max(0, float64(pi)-float64(q[i]))
	}
	if total <= 0 {
		copy(dst, p)
		return dst
	}
	for i, pi := range p {
		dst[i] = float32(max(0, float64(pi)-float64(q[i])) / total)
	}
	return dst
}

// Draw samples from the distribution p (summing to about 1) with u.
func Draw(p []float32, u float64) int32 {
	var total float64
	for _, pi := range p {
		total += float64(pi)
	}
	t := u * total
	var cum float64
	last := int32(0)
	for i, pi := range p {
		if pi <= 0 {
			continue
		}
		cum += float64(pi)
		last = int32(i)
		if t < cum {
			return int32(i)
		}
	}
	return last
}

// Acceptance estimates a request's per-token acceptance rate α under the
// usual model (each draft token accepted independently with probability
// α): from a verification that accepted a of d drafts, a successes and,
// when a < d, one failure. Old rounds decay, so α follows the text.
type Acceptance struct {
	acc, rej float64
}

// Acceptance's prior is one success and one failure (α = 0.5); decay is
// the weight a round keeps per later round.
const (
	priorAcc = 1
	priorRej = 1
	decay    = 0.9
)

// Observe records a verification of drafted tokens of which accepted
// were kept.
func (a *Acceptance) Observe(drafted, accepted int) {
	if drafted <= 0 {
		return
	}
	a.acc = a.acc*decay + float64(accepted)
	a.rej *= decay
	if accepted < drafted {
		a.rej++
	}
}

// Rate is the current estimate of α.
func (a *Acceptance) Rate() float64 {
	return (a.acc + priorAcc) / (a.acc + a.rej + priorAcc + priorRej)
}

// ExpectedTokens is the mean number of tokens one verification of gamma
// drafts yields at acceptance alpha, the bonus or correction included:
// (1 - α^(γ+1)) / (1 - α).
func ExpectedTokens(alpha float64, gamma int) float64 {
	if alpha >= 1 {
		return float64(gamma + 1)
	}
	return (1 - math.Pow(alpha, float64(gamma+1))) / (1 - alpha)
}
