package engine

import (
	"math/rand/v2"
	"time"

	"pagoda/sample"
	"pagoda/spec"
)

// SpecConfig turns on speculative decoding: before each step a proposer
// guesses up to Tokens next tokens of each decoding sequence, the step
// verifies them in its one forward pass, and exact rejection sampling
// keeps a prefix, so the output is distributed as without speculation.
type SpecConfig struct {
	Proposer spec.Proposer // nil: no speculation
	Method   string        // its name, for logs ("ngram", "draft")
	Tokens   int           // most draft tokens per sequence and step; 0 = 4
	// Fixed always proposes Tokens: no per-request adaptation and no cost
	// model deciding when speculation pays (for measurements).
	Fixed bool
	// Control tunes the controller that turns speculation on or off by
	// the throughput each realises at the current load (specctl.go); it
	// is off when Fixed.
	Control SpecControl
}

// DefaultSpecTokens is SpecConfig.Tokens when 0.
const DefaultSpecTokens = 4

// MaxSpecTokens bounds the draft tokens one step verifies (--spec-tokens,
// a request's spec_tokens): past a few dozen the chance that all are
// accepted is nil and the verify pass only grows.
const MaxSpecTokens = 64

// probSampler is a sampler that reports the distribution it draws from,
// which verifying drafts needs; *sample.Sampler is one.
type probSampler interface {
	tokenSampler
	SampleProbs(logits []float32, history []int32) (int32, []float32)
}

// seqSpec is a sequence's speculation state.
type seqSpec struct {
	acc   spec.Acceptance
	req   spec.Req
	probs []float32 // q rows of the drafts in flight (empty: one-hot)
	// feats are the target's hidden states of positions featFrom, … not
	// yet handed to a FeatureProposer (featBook).
	feats    []float32
	featFrom int
}

// probeEvery: sequences for which drafting does not pay (by acceptance or
// by cost) still draft one token every probeEvery steps, so the estimates
// can recover when the text turns predictable or the batch shrinks. They
// probe in the same step, so a draft model pays one batched pass for all
// of them; probing each on its own clock cost a same-size draft model a
// pass most steps at 8 in flight.
const probeEvery = 32

// specTokens is the most drafts request r may have per step: 0 when it
// does not speculate. This is the one place that decides which requests
// can: the engine must have a proposer, the request must not opt out
// (Request.SpecTokens < 0), and its samplers must report the distribution
// they draw from. A constrained request (Request.Constraint: a
// grammar or JSON schema) never speculates: its constraint's state moves
// with every draw and would have to be rolled back with rejected drafts. A KV policy
// (Config.KVPolicy: sinks, windows, shifted positions) turns speculation
// off too: rolling drafts back under a policy that moves or drops
// positions is not verified yet.
func (e *Engine) specTokens(r *request) int {
	if e.cfg.Spec.Proposer == nil || r.r.SpecTokens < 0 || r.kvLossy || r.constraint != nil {
		return 0
	}
	for i := range r.comps {
		if _, ok := r.comps[i].sampler.(probSampler); !ok {
			return 0
		}
	}
	n := e.specMax
	if r.r.SpecTokens > 0 {
		n = min(n, r.r.SpecTokens)
	}
	return n
}

// propose asks the proposer for the drafts of this step: each running
// sequence that decodes, of a request that speculates, gets up to the
// number of drafts the scheduler finds worth verifying.
func (e *Engine) propose() {
	sc := e.sch
	cands := sc.draftCands(e.specCands[:0], func(s *sequence) int {
		r := s.req
		c := &r.comps[s.index]
		// Each verification yields at most max+1 tokens; drafts beyond
		// max_tokens or the context would be wasted or out of range.
		return min(e.specTokens(r), r.maxTokens-c.nOut-1, e.maxLen-len(s.tokens))
	})
	e.specCands = cands // reused: a step, plain or not, allocates no candidate list
	if e.ctl == nil && !e.cfg.Spec.Fixed && !e.cfg.Spec.Control.Off {
		e.ctl = newSpecCtl(e.cfg.Spec.Control, ladderFor(e.cfg.Spec.Proposer, e.trees, e.specMax), e.specMax)
	}
	var tb treeBudget // the controller's tree for this step (zero: none)
	if e.ctl != nil {
		n, mixed := sc.load()
		if len(cands) == 0 {
			n = 0 // nothing to decide: not measured
		}
		arm := e.ctlBegin(n, mixed)
		e.feat.setWant(e.ctl.wantsFeatures(n, arm, mixed))
		if arm == armPlain {
			return
		}
		tb = e.ctl.budget(arm)
	}
	if len(cands) == 0 {
		return
	}
	e.specSteps++
	if tb.nodes > 0 {
		// The controller measured this tree against plain at this load;
		// the cost model's γ, a chain's, does not second-guess it.
		for i := range cands {
			cands[i].max = min(cands[i].max, tb.nodes)
		}
	}
	sc.draftSizes(cands, &e.cost, e.cfg.Spec.Fixed || tb.nodes > 0)
	reqs := e.specReqs[:0]
	for _, d := range cands {
		ss := d.seq.spec
		g := d.gamma
		if g == 0 {
			if e.specSteps%probeEvery != 0 {
				continue
			}
			g = 1
		}
		r := d.seq.req
		q := ss.ask(d.seq, g, e.draftSampler(r, &r.comps[d.seq.index], d.seq.index), e.feat.dim())
		q.TopK, q.Depth = tb.topK, tb.depth
		reqs = append(reqs, q)
	}
	e.specReqs = reqs
	if len(reqs) == 0 {
		return
	}
	t0 := time.Now()
	err := e.cfg.Spec.Proposer.Propose(reqs)
	for _, d := range cands {
		d.seq.spec.consumed(e.feat.dim())
	}
	if err != nil {
		// The proposer's failure costs speed, never a request: this
		// step runs without drafts.
		e.specErrs++
		return
	}
	n := 0
	for _, q := range reqs {
		n += len(q.Draft)
	}
	sec := time.Since(t0).Seconds()
	e.cost.ObserveDraft(n, sec)
	e.ctl.addDraft(n, sec)
	for _, d := range cands {
		d.seq.takeDraft(e.trees)
	}
}

// draftCands are the running sequences that may carry drafts this step:
// decoding (no prompt or recompute in flight), of a request that is not
// about to fork, with room for at least one draft by limit.
func (sc *scheduler) draftCands(cands []draftCand, limit func(*sequence) int) []draftCand {
	for _, s := range sc.running {
		if s.finished || len(s.tokens)-s.numComputed != 1 || len(s.tokens) <= len(s.req.r.Prompt) {
			continue // a prompt (or its recompute) is in flight
		}
		if s.req.r.N > 1 && !s.req.forked {
			continue
		}
		max := limit(s)
		if max <= 0 {
			continue
		}
		if s.spec == nil {
			s.spec = &seqSpec{}
		}
		cands = append(cands, draftCand{seq: s, max: max, alpha: s.spec.acc.Rate()})
	}
	return cands
}

// draftSampler is the sampler a proposer that samples uses for completion
// c: the request's settings with a seed of its own, so q is processed as
// p is without touching the target's random stream.
func (e *Engine) draftSampler(r *request, c *completion, index int) *sample.Sampler {
	if c.draft == nil {
		p := r.r.Sampling
		if p.HasSeed {
			p.Seed ^= 0x5bd1e9955bd1e995
		}
		s, err := newSampler(p, index, nil)
		if err != nil {
			return nil // validated already; greedy drafting is still exact
		}
		c.draft = s.(*sample.Sampler)
	}
	return c.draft
}

// verifyRNG is completion c's source of the uniforms the acceptance test
// and the residual draw use: seeded from the request's seed when it has
// one, so speculative runs are reproducible too.
func verifyRNG(p sample.Params, index int) *rand.Rand {
	seed := rand.Uint64()
	if p.HasSeed {
		seed = p.Seed + uint64(index)
	}
	return rand.New(rand.NewPCG(seed, 0x7370656364656331))
}

// specKV is the scheduler's KV manager when speculating: every rollback
// and release of a sequence's blocks reaches the proposer too, so a draft
// model's own cache follows the target's.
type specKV struct {
	kvManager
	p spec.Proposer
}

func (k specKV) Truncate(seq int32, n int) {
	k.kvManager.Truncate(seq, n)
	k.p.Truncate(seq, n)
}

func (k specKV) Free(seq int32) {
	k.kvManager.Free(seq)
	k.p.Free(seq)
}
