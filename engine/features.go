package engine

import (
	"fmt"

	"pagoda/spec"
)

// featBook hands the target's hidden states to a FeatureProposer (Medusa
// heads, an EAGLE draft): the steps that may lead to a proposal ask the
// executor for them (want), and the rows of positions a sequence kept (its
// prompt, each decoded token, a verified tree's accepted path) wait in the
// sequence's seqSpec until the proposer's next call. nil when the
// proposer reads none.
//
// While the controller keeps a load on plain steps nothing is asked or
// kept: computing, copying and handing over every row's state made the
// plain steps of a speculating engine dearer than a plain engine's. A
// sequence that does not draft for a while keeps only its newest rows
// (featTail); a proposer that sees a gap restarts from the rows it gets
// (EAGLE's draft attends them only until its context grows back), which
// costs acceptance on the first drafts, never exactness.
type featBook struct {
	d    int
	want bool // this step's rows are asked for (set per step by propose)
	// steps and rows count the steps that asked for hidden states and the
	// rows kept: what tests check stays bounded on plain steps.
	steps, rows uint64
}

// featTail is the most feature rows a sequence keeps between proposals
// (up to twice as many before they are trimmed, so trimming copies each
// row at most once): the context an EAGLE draft restarts from after the
// sequence drafted nothing for a while.
const featTail = ctlFeatLead

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
	return &featBook{d: fp.FeatureDim(), want: true}, nil
}

// dim is the feature width, 0 when no proposer reads features.
func (f *featBook) dim() int {
	if f == nil {
		return 0
	}
	return f.d
}

// setWant sets whether the next step asks for hidden states.
func (f *featBook) setWant(w bool) {
	if f != nil {
		f.want = w
	}
}

// wants reports whether the step being built asks for hidden states.
func (f *featBook) wants() bool {
	return f != nil && f.want
}

// collect keeps the feature rows of the step's kept positions (hidden:
// every row's, in row order; empty when the step asked for none) for the
// sequences that may speculate.
func (f *featBook) collect(p *plan, res []outcome, hidden []float32, speculates func(*request) bool) {
	if f == nil || len(hidden) == 0 {
		return
	}
	f.steps++
	d := f.d
	row := 0
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
			// Not where the pending rows end (steps that asked for no
			// rows, a recompute after preemption): the proposer
			// restarts from here.
			ss.feats, ss.featFrom = ss.feats[:0], w.start
		}
		n0 := len(ss.feats)
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
		f.rows += uint64(len(ss.feats)-n0) / uint64(d)
		if over := len(ss.feats)/d - featTail; over >= featTail {
			ss.feats = append(ss.feats[:0], ss.feats[over*d:]...)
			ss.featFrom += over
		}
	}
}
