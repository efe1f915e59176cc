package spec

import "fmt"

// NGram is prompt lookup decoding (vLLM's "ngram" method): find the
// longest suffix of the sequence, between Min and Max tokens long, that
// occurred earlier in the sequence (prompt and output alike), and propose
// the tokens that followed that occurrence. It needs no model and keeps
// no state; it suits outputs that copy their input (rewriting, editing,
// extraction, code).
type NGram struct {
	Min, Max int // suffix lengths tried
}

// NewNGram checks the lengths: 1 <= min <= max.
func NewNGram(min, max int) (*NGram, error) {
	if min < 1 || max < min {
		return nil, fmt.Errorf("spec: n-gram lengths [%d, %d]: want 1 <= min <= max", min, max)
	}
	return &NGram{Min: min, Max: max}, nil
}

func (g *NGram) Propose(reqs []*Req) error {
	for _, r := range reqs {
		r.Probs = nil
		r.Draft = r.Draft[:0]
		if r.Max <= 0 {
			continue
		}
		if at, _ := g.Match(r.Tokens); at >= 0 {
			end := min(at+r.Max, len(r.Tokens))
			r.Draft = append(r.Draft, r.Tokens[at:end]...)
		}
	}
	return nil
}

// Match finds the longest n in [Min, Max] such that the last n tokens of
// toks occur earlier in toks, the latest such occurrence on ties, and
// returns the index just after that occurrence and n; (-1, 0) when there
// is none. It runs in O(len(toks)·Max).
func (g *NGram) Match(toks []int32) (at, n int) {
	L := len(toks)
	at = -1
	if L < g.Min+1 {
		return -1, 0
	}
	// e is the end (exclusive) of a candidate occurrence; it must leave
	// at least one token after it, and be before the suffix itself.
	for e := L - 1; e >= g.Min; e-- {
		k := 0
		for k < g.Max && k < e && toks[e-1-k] == toks[L-1-k] {
			k++
		}
		if k >= g.Min && k > n {
			at, n = e, k
			if n == g.Max {
				break // latest occurrence of the longest possible match
			}
		}
	}
	return at, n
}

func (g *NGram) Truncate(int32, int) {}
func (g *NGram) Free(int32)          {}
