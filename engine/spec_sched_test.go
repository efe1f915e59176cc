package engine

import (
	"testing"

	"pagoda/spec"
)

// TestDraftSizes: drafts count in the token budget (never crowding out a
// decode), and the cost model gives drafts to a memory-bound step and
// none to a compute-bound one.
func TestDraftSizes(t *testing.T) {
	mk := func(budget, decodes int) (*scheduler, []draftCand) {
		sc := newScheduler(Config{MaxNumBatchedTokens: budget, MaxNumSeqs: 64}, nil)
		var cands []draftCand
		for i := range decodes {
			s := &sequence{id: int32(i), tokens: []int32{1, 2, 3}, numComputed: 2}
			sc.running = append(sc.running, s)
			cands = append(cands, draftCand{seq: s, max: 4, alpha: 0.8})
		}
		return sc, cands
	}
	// Budget: 10 tokens, 4 decodes: 6 left for drafts, first come first.
	sc, cands := mk(10, 4)
	sc.draftSizes(cands, &spec.Cost{}, true)
	if got := [4]int{cands[0].gamma, cands[1].gamma, cands[2].gamma, cands[3].gamma}; got != [4]int{4, 2, 0, 0} {
		t.Fatalf("γ %v, want [4 2 0 0]", got)
	}
	// A waiting prompt is part of the step's size: in a compute-bound
	// fit (no fixed cost) nothing pays.
	var compute, memory spec.Cost
	for i := range 40 {
		n := 1 + i%16
		compute.ObserveStep(n, 0.002*float64(n))
		memory.ObserveStep(n, 0.050+0.001*float64(n))
	}
	sc, cands = mk(512, 1)
	sc.draftSizes(cands, &memory, false)
	if cands[0].gamma != 4 {
		t.Fatalf("memory-bound single decode: γ %d, want 4", cands[0].gamma)
	}
	sc.draftSizes(cands, &compute, false)
	if cands[0].gamma != 0 {
		t.Fatalf("compute-bound: γ %d, want 0", cands[0].gamma)
	}
	// Memory-bound per token but a large batch: 48 decodes make the
	// step's per-token cost small against a draft's, so γ shrinks.
	sc, cands = mk(512, 48)
	sc.draftSizes(cands, &memory, false)
	if cands[0].gamma >= 4 {
		t.Fatalf("48 decodes: γ %d, want fewer than at batch 1", cands[0].gamma)
	}
}
