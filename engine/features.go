package engine

import (
	"fmt"

	"pagoda/spec"
)

// featBook hands the target's hidden states to a FeatureProposer (Medusa
// heads, an EAGLE draft): each step asks the executor for them, and the
// rows of positions a sequence kept (its prompt, each decoded token, a
// verified tree's accepted path) wait in the sequence's seqSpec until the
// proposer's next call. nil when the proposer reads none.
type featBook struct {
	fp   spec.FeatureProposer
	d    int
	reqs []*spec.Req
	pend []*seqSpec // whose reqs they are
}

// newFeatBook is the book for cfg's proposer: nil when it reads no
// features, an error when the model or executor cannot give them.
func newFeatBook(fw Forwarder, cfg Config) (*featBook, error) {
	fp, ok := cfg.Spec.Proposer.(spec.FeatureProposer)
	if !ok {
		return nil, nil
	}
	if cfg.Executor != nil {
		return nil, fmt.Errorf("engine: speculation %q reads the target's hidden states, which a distributed executor does not return", cfg.Spec.Method)
	}
	hs, ok := fw.(interface{ HiddenSize() int })
	if !ok || fp.FeatureDim() != hs.HiddenSize() {
		return nil, fmt.Errorf("engine: speculation %q reads features of width %d, which the model does not return", cfg.Spec.Method, fp.FeatureDim())
	}
	return &featBook{fp: fp, d: fp.FeatureDim()}, nil
}

// dim is the feature width, 0 when no proposer reads features.
func (f *featBook) dim() int {
	if f == nil {
		return 0
	}
	return f.d
}

// collect keeps the feature rows of the step's kept positions (hidden:
// every row's, in row order) for the sequences that may speculate.
func (f *featBook) collect(p *plan, res []outcome, hidden []float32, speculates func(*request) bool) {
	if f == nil || len(hidden) == 0 {
		return
	}
	d := f.d
	row := 0
	f.reqs, f.pend = f.reqs[:0], f.pend[:0]
	for i := range p.seqs {
		w := &p.seqs[i]
		s, base := w.seq, row
		row += w.n
		if s.finished || (w.rows > 0 && res[i].done) || !speculates(s.req) {
			continue
		}
		if s.spec == nil {
			s.spec = &seqSpec{}
		}
		ss := s.spec
		lead := w.n - len(w.draft)
		if ss.featFrom+len(ss.feats)/d != w.start {
			// Not where the pending rows end (a recompute after
			// preemption starts over): the proposer restarts from here.
			ss.feats, ss.featFrom = ss.feats[:0], w.start
		}
		ss.feats = append(ss.feats, hidden[base*d:(base+lead)*d]...)
		if w.rows > 0 && len(w.draft) > 0 {
			for j := range res[i].accepted {
				k := j
				if w.parent != nil {
					k = int(res[i].path[j])
				}
				r := base + lead + k
				ss.feats = append(ss.feats, hidden[r*d:(r+1)*d]...)
			}
		}
		if len(ss.feats) > maxPendingFeatures*d {
			f.reqs, f.pend = append(f.reqs, ss.ask(s, 0, nil, d)), append(f.pend, ss)
		}
	}
	if len(f.reqs) == 0 {
		return
	}
	// A backlog: handed over now, no drafts asked. The proposer's error
	// costs its state only (the next drafts are worse), never a request.
	_ = f.fp.Propose(f.reqs)
	for _, ss := range f.pend {
		ss.consumed(d)
		ss.req.Tokens = nil
	}
}
