package sample

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// Validate checks every field's range; errors name the field.
func (p Params) Validate() error {
	finite := func(v float32) bool { return !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0) }
	switch {
	case !finite(p.Temperature) || p.Temperature < 0:
		return fmt.Errorf("sample: temperature %v must be a finite number >= 0", p.Temperature)
	case p.TopK < 0:
		return fmt.Errorf("sample: top_k %d must be >= 0 (0 disables it)", p.TopK)
	case !finite(p.TopP) || p.TopP < 0 || p.TopP > 1:
		return fmt.Errorf("sample: top_p %v must be in [0, 1]", p.TopP)
	case !finite(p.MinP) || p.MinP < 0 || p.MinP > 1:
		return fmt.Errorf("sample: min_p %v must be in [0, 1]", p.MinP)
	case !finite(p.RepetitionPenalty) || p.RepetitionPenalty < 0:
		return fmt.Errorf("sample: repetition_penalty %v must be a finite number >= 0 (0 or 1 disables it)", p.RepetitionPenalty)
	case !finite(p.FrequencyPenalty):
		return fmt.Errorf("sample: frequency_penalty %v must be finite", p.FrequencyPenalty)
	case !finite(p.PresencePenalty):
		return fmt.Errorf("sample: presence_penalty %v must be finite", p.PresencePenalty)
	case p.PenaltyLastN < 0:
		return fmt.Errorf("sample: penalty_last_n %d must be >= 0 (0 means the whole history)", p.PenaltyLastN)
	}
	for id, b := range p.LogitBias {
		// -Inf is allowed: it bans a token outright.
		if math.IsNaN(float64(b)) || math.IsInf(float64(b), 1) {
			return fmt.Errorf("sample: logit_bias[%d] = %v must be finite or -Inf", id, b)
		}
		if id < 0 {
			return fmt.Errorf("sample: logit_bias token id %d is negative", id)
		}
	}
	return nil
}

// CheckVocab reports logit_bias ids outside a vocabulary of n tokens. New
// cannot check this because it does not know the model.
func (p Params) CheckVocab(n int) error {
	for id := range p.LogitBias {
		if int(id) >= n {
			return fmt.Errorf("sample: logit_bias token id %d out of range (vocabulary has %d tokens)", id, n)
		}
	}
	return nil
}

// Sampler applies one request's Params. It keeps scratch buffers between
// calls, so it is not safe for concurrent use; use one per sequence.
type Sampler struct {
	p   Params
	rng rng
	con Constraint // nil: unconstrained
	err error      // the constraint's first failure

	counts  []int32 // per-token occurrences in the penalty window
	touched []int32
	cands   []cand
	border  []cand
	exps    []float64
	ids     []int32
	probs   []float32
}

type cand struct {
	id    int32
	logit float32
}

// New validates p and returns a sampler seeded from p.Seed (or a random seed
// when !p.HasSeed).
func New(p Params) (*Sampler, error) { return NewConstrained(p, nil) }

// NewConstrained is New with con restricting every draw (nil: none).
func NewConstrained(p Params, con Constraint) (*Sampler, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	seed := p.Seed
	if !p.HasSeed {
		// math/rand/v2's global source is randomly seeded per process, so
		// samplers built in the same instant still differ (a clock seed
		// would repeat). Reproducibility only matters with HasSeed.
		seed = rand.Uint64()
	}
	return &Sampler{p: p, rng: newRNG(seed), con: con}, nil
}

// Err is the constraint's failure (no token allowed, or a token it
// rejected), nil when none; once set, the completion cannot go on.
func (s *Sampler) Err() error { return s.err }

// Params returns the settings the sampler was built with.
func (s *Sampler) Params() Params { return s.p }

// Reseed restarts the random stream as if the sampler had been built with seed.
func (s *Sampler) Reseed(seed uint64) { s.rng.seed(seed) }

// Sample picks the next token. history is the prompt plus the tokens
// generated so far (the penalties look at its last PenaltyLastN entries).
// logits is modified in place. The chain is: logit bias, penalties,
// temperature (0 = exact argmax), top-k, top-p, min-p, then a draw from the
// renormalised survivors.
func (s *Sampler) Sample(logits []float32, history []int32) int32 {
	return s.sample(logits, history, false)
}

// SampleProbs is Sample that also returns the distribution the token was
// drawn from: probs[i] is token i's probability after bias, penalties,
// temperature and the top-k/top-p/min-p cut, zero outside the kept set,
// one-hot when the choice is deterministic (temperature 0). Exact
// rejection sampling of draft tokens needs this row. It draws the same
// token as Sample would; probs is the sampler's buffer, valid until its
// next call.
func (s *Sampler) SampleProbs(logits []float32, history []int32) (id int32, probs []float32) {
	if len(logits) == 0 {
		return 0, nil
	}
	id = s.sample(logits, history, true)
	return id, s.probs
}

// sample is Sample; with want it also fills s.probs. A constraint masks
// the logits first and is fed the chosen token.
func (s *Sampler) sample(logits []float32, history []int32, want bool) int32 {
	if len(logits) == 0 {
		return 0
	}
	if s.con == nil {
		return s.draw1(logits, history, want)
	}
	if s.err != nil {
		return 0
	}
	if err := s.con.Mask(logits); err != nil {
		s.err = err
		return 0
	}
	id := s.draw1(logits, history, want)
	if err := s.con.Accept(id); err != nil {
		s.err = err
	}
	return id
}

// draw1 picks a token from logits (the chain of Sample).
func (s *Sampler) draw1(logits []float32, history []int32, want bool) int32 {
	s.applyBias(logits)
	s.applyPenalties(logits, history)
	p := s.p
	if p.Temperature == 0 {
		return s.oneHot(Greedy(logits), len(logits), want)
	}
	if p.Temperature != 1 {
		inv := 1 / p.Temperature
		for i := range logits {
			logits[i] *= inv
		}
	}
	cands, full := s.filter(logits)
	switch {
	case full:
		id := s.sampleAll(logits)
		if want {
			s.softmaxProbs(logits, id)
		}
		return id
	case len(cands) == 0:
		return s.oneHot(Greedy(logits), len(logits), want) // nothing finite survived
	}
	id := s.draw(cands)
	if want {
		s.candProbs(cands, len(logits))
	}
	return id
}

func (s *Sampler) probBuf(n int) []float32 {
	if cap(s.probs) < n {
		s.probs = make([]float32, n)
	}
	s.probs = s.probs[:n]
	clear(s.probs)
	return s.probs
}

// oneHot returns id, first making s.probs one-hot on it when want.
func (s *Sampler) oneHot(id int32, n int, want bool) int32 {
	if want {
		s.probBuf(n)[id] = 1
	}
	return id
}

// softmaxProbs fills s.probs with the softmax sampleAll drew id from.
func (s *Sampler) softmaxProbs(logits []float32, id int32) {
	m, ok := maxLogit(logits)
	if !ok {
		s.oneHot(id, len(logits), true) // sampleAll fell back to Greedy
		return
	}
	exps := s.expBuf(len(logits))
	total := expNegShift(exps, logits, m)
	probs := s.probBuf(len(logits))
	for i, e := range exps {
		probs[i] = float32(e / total)
	}
}

// candProbs fills s.probs with the distribution draw uses over cands.
func (s *Sampler) candProbs(cands []cand, n int) {
	probs := s.probBuf(n)
	if len(cands) == 1 {
		probs[cands[0].id] = 1
		return
	}
	m, total := expTotal(cands)
	for _, c := range cands {
		probs[c.id] = float32(expNeg(float64(c.logit)-float64(m)) / total)
	}
}

// filter applies top-k, top-p and min-p to temperature-scaled logits. It
// returns the survivors (best first when top-k is active), or
// full=true when no filter is active and the whole vocabulary takes part.
func (s *Sampler) filter(logits []float32) (cands []cand, full bool) {
	p := s.p
	n := len(logits)
	topK := p.TopK > 0 && p.TopK < n
	topP := p.TopP > 0 && p.TopP < 1
	minP := p.MinP > 0
	if !topK && !topP && !minP {
		return nil, true
	}

	if !topK {
		return s.filterNoTopK(logits, topP, minP), false
	}
	cands = selectTop(logits, nil, p.TopK, s.cands[:0])
	s.cands = cands
	if len(cands) == 0 {
		return nil, false
	}
	var total float64 // mass the top-p cut is measured against
	for _, c := range cands {
		total += expNeg(float64(c.logit) - float64(cands[0].logit))
	}
	if topP {
		m := float64(cands[0].logit)
		cut := float64(p.TopP) * total
		var cum float64
		for i, c := range cands {
			cum += expNeg(float64(c.logit) - m)
			if cum >= cut {
				cands = cands[:i+1]
				break
			}
		}
	}
	if minP {
		m := float64(cands[0].logit)
		thr := float64(p.MinP)
		for i, c := range cands {
			if expNeg(float64(c.logit)-m) < thr {
				cands = cands[:i]
				break
			}
		}
	}
	return cands, false
}

// filterNoTopK applies top-p and/or min-p to the whole vocabulary without
// sorting it. The survivors come back in no particular order (draw does not
// need one). min-p keeps a prefix of the sorted order, so it commutes with
// top-p and runs first as a cheap threshold; top-p then buckets the
// survivors by probability (1/16-octave buckets), finds the bucket where the
// cumulative mass crosses top_p, and sorts only that bucket.
func (s *Sampler) filterNoTopK(logits []float32, topP, minP bool) []cand {
	n := len(logits)
	m, ok := maxLogit(logits)
	if !ok {
		return nil
	}
	cands := s.cands[:0]
	if !topP {
		// min-p alone needs no exponentials: p/p_max >= min_p is
		// logit - max >= ln(min_p). draw exponentiates the few survivors.
		lthr := math.Log(float64(s.p.MinP))
		for i, l := range logits {
			if float64(l)-float64(m) >= lthr {
				cands = append(cands, cand{int32(i), l})
			}
		}
		s.cands = cands
		return cands
	}
	exps := s.expBuf(n)
	total := expNegShift(exps, logits, m)
	thr := 0.0
	if minP {
		thr = float64(s.p.MinP)
	}

	var mass [numBuckets]float64
	for _, e := range exps {
		if e >= thr && e > 0 {
			mass[bucketOf(e)] += e
		}
	}
	cut := float64(s.p.TopP) * total
	var above float64
	edge := 0 // the bucket in which the cumulative mass reaches cut
	for b := numBuckets - 1; b >= 0; b-- {
		if above+mass[b] >= cut {
			edge = b
			break
		}
		above += mass[b]
	}
	border := s.ids[:0]
	for i, e := range exps {
		if e < thr || e == 0 {
			continue
		}
		switch b := bucketOf(e); {
		case b > edge:
			cands = append(cands, cand{int32(i), logits[i]})
		case b == edge:
			border = append(border, int32(i))
		}
	}
	s.ids = border
	sorted := selectTop(logits, border, len(border), s.border[:0])
	s.border = sorted
	for _, c := range sorted {
		cands = append(cands, c)
		above += exps[c.id]
		if above >= cut {
			break
		}
	}
	s.cands = cands
	return cands
}

const numBuckets = 0x3F800000>>19 + 1

// bucketOf maps a probability ratio in (0, 1] to its 1/16-octave bucket;
// larger values get larger buckets.
func bucketOf(e float64) int {
	return int(math.Float32bits(float32(e)) >> 19)
}

func (s *Sampler) expBuf(n int) []float64 {
	if cap(s.exps) < n {
		s.exps = make([]float64, n)
	}
	return s.exps[:n]
}

// sampleAll draws from the full softmax without sorting: a cumulative scan
// in id order.
func (s *Sampler) sampleAll(logits []float32) int32 {
	m, ok := maxLogit(logits)
	if !ok {
		return Greedy(logits)
	}
	exps := s.expBuf(len(logits))
	total := expNegShift(exps, logits, m)
	u := s.rng.float64() * total
	var cum float64
	last := int32(0)
	for i, e := range exps {
		if e == 0 {
			continue
		}
		cum += e
		last = int32(i)
		if u < cum {
			return int32(i)
		}
	}
	return last // rounding left u just past the final sum
}

// expTotal is the largest logit of cands and Σ exp(logit - largest), the
// normalizer draw and candProbs share.
func expTotal(cands []cand) (float32, float64) {
	m := cands[0].logit
	for _, c := range cands[1:] {
		if c.logit > m {
			m = c.logit
		}
	}
	var total float64
	for _, c := range cands {
		total += expNeg(float64(c.logit) - float64(m))
	}
	return m, total
}

// draw samples from cands (non-empty) proportionally to exp(logit).
func (s *Sampler) draw(cands []cand) int32 {
	if len(cands) == 1 {
		return cands[0].id
	}
	m, total := expTotal(cands)
	u := s.rng.float64() * total
	var cum float64
	last := cands[0].id
	for _, c := range cands {
		e := expNeg(float64(c.logit) - float64(m))
		if e == 0 {
			continue
		}
		cum += e
		last = c.id
		if u < cum {
			return c.id
		}
	}
	return last // rounding left u just past the final sum
}

func (s *Sampler) applyBias(logits []float32) {
	for id, b := range s.p.LogitBias {
		if id >= 0 && int(id) < len(logits) {
			logits[id] += b
		}
	}
}

func (s *Sampler) applyPenalties(logits []float32, history []int32) {
	p := s.p
	rep := p.RepetitionPenalty != 0 && p.RepetitionPenalty != 1
	if !rep && p.FrequencyPenalty == 0 && p.PresencePenalty == 0 {
		return
	}
	if p.PenaltyLastN > 0 && len(history) > p.PenaltyLastN {
		history = history[len(history)-p.PenaltyLastN:]
	}
	if len(s.counts) < len(logits) {
		s.counts = make([]int32, len(logits))
	}
	touched := s.touched[:0]
	for _, id := range history {
		if id < 0 || int(id) >= len(logits) {
			continue
		}
		if s.counts[id] == 0 {
			touched = append(touched, id)
		}
		s.counts[id]++
	}
	for _, id := range touched {
		l := logits[id]
		if rep {
			// HF/llama.cpp: shrink the magnitude either way.
			if l <= 0 {
				l *= p.RepetitionPenalty
			} else {
				l /= p.RepetitionPenalty
			}
		}
		// explicit rounding: no FMA fusion, same result on every platform
		l -= float32(float32(s.counts[id])*p.FrequencyPenalty) + p.PresencePenalty
		logits[id] = l
		s.counts[id] = 0
	}
	s.touched = touched
}

// better orders candidates best first: higher logit, then lower id, so that
// ties are broken the same way as Greedy.
func better(a, b cand) bool {
	return a.logit > b.logit || (a.logit == b.logit && a.id < b.id)
}

// selectTop returns the k best tokens (from all logits, or from pool when
// non-nil) sorted best first, using a size-k min-heap: O(n log k) instead of
// sorting the vocabulary. NaN logits are never selected.
func selectTop(logits []float32, pool []int32, k int, dst []cand) []cand {
	h := dst[:0]
	if k <= 0 {
		return h
	}
	push := func(c cand) {
		if c.logit != c.logit {
			return
		}
		if len(h) < k {
			h = append(h, c)
			// sift up: h[0] is the worst kept candidate
			i := len(h) - 1
			for i > 0 {
				par := (i - 1) / 2
				if !better(h[par], h[i]) {
					break
				}
				h[par], h[i] = h[i], h[par]
				i = par
			}
			return
		}
		if !better(c, h[0]) {
			return
		}
		h[0] = c
		i := 0
		for {
			l, r, w := 2*i+1, 2*i+2, i
			if l < len(h) && better(h[w], h[l]) {
				w = l
			}
			if r < len(h) && better(h[w], h[r]) {
				w = r
			}
			if w == i {
				break
			}
			h[i], h[w] = h[w], h[i]
			i = w
		}
	}
	if pool == nil {
		// Fast reject: once the heap is full, most logits lose to its worst
		// entry and need no call at all.
		i := 0
		for ; i < len(logits) && len(h) < k; i++ {
			push(cand{int32(i), logits[i]})
		}
		if len(h) == k {
			worst := h[0].logit
			for ; i < len(logits); i++ {
				if l := logits[i]; l >= worst {
					push(cand{int32(i), l})
					worst = h[0].logit
				}
			}
		}
	} else {
		for _, id := range pool {
			push(cand{id, logits[id]})
		}
	}
	slices.SortFunc(h, func(a, b cand) int {
		if better(a, b) {
			return -1
		}
		if better(b, a) {
			return 1
		}
		return 0
	})
	return h
}

func maxLogit(logits []float32) (float32, bool) {
	m := float32(math.Inf(-1))
	ok := false
	for _, l := range logits {
		if l > m || (!ok && l == m) {
			m, ok = l, true
		}
	}
	return m, ok && !math.IsInf(float64(m), -1)
}

// Greedy returns the index of the largest logit, the lowest id on ties.
// NaNs are ignored; it returns 0 when nothing else qualifies.
func Greedy(logits []float32) int32 {
	best := -1
	var bv float32
	for i, l := range logits {
		// Strict > keeps the first (lowest) id on ties and never takes a
		// NaN; the second clause seeds best with the first non-NaN value.
		if l > bv || (best < 0 && l == l) {
			best, bv = i, l
		}
	}
	if best < 0 {
		return 0
	}
	return int32(best)
}
