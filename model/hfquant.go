package model

import (
	"slices"

	"pagoda/hf"
	"pagoda/quant"
)

// quantTensor is the GPTQ/AWQ layer stored in place of the float weight
// hn, repacked to quant.GQ4/GQ8 rows (and, for llama q/k, taken out of the
// rotate-half row order like float weights); false when there is none.
func (s *hfSource) quantTensor(name, hn string) (*rawTensor, bool) {
	r, found, err := s.hc.QuantLinear(s.set, hn)
	if !found {
		return nil, false
	}
	if err != nil {
		t := &rawTensor{Err: err}
		s.perm[name] = t
		return t, true
	}
	data := r.Data
	if heads, ok := s.hc.PermutedHeads(name); ok {
		if rb, err := quant.RowSize(r.Type, r.Cols); err == nil {
			if u := hf.Unpermute(data, rb, r.Rows, heads); u != nil {
				data = u
			}
		}
	}
	t := &rawTensor{Type: r.Type, Dims: []uint64{uint64(r.Cols), uint64(r.Rows)}, Data: data, Perm: s.sharePerm(r.Perm)}
	s.perm[name] = t
	return t, true
}

func (s *hfSource) sharePerm(p []int32) []int32 {
	if p == nil {
		return nil
	}
	for _, q := range s.colPerms {
		if slices.Equal(p, q) {
			return q
		}
	}
	s.colPerms = append(s.colPerms, p)
	return p
}
