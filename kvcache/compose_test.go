package kvcache

import (
	"math/rand/v2"
	"testing"

	"pagoda/model"
)

// TestPoliciesOverQuantizedFormat: each policy on q8_0 keys and values.
// Quest with a budget covering everything, and H2O and SnapKV with
// budgets that evict nothing, equal the full cache on the same format bit
// for bit; with tight budgets they run, select inside what they may, and
// release everything at the end. Quest's bounds are of the keys as q8_0
// stores them, so the ranking reads what attention reads.
func TestPoliciesOverQuantizedFormat(t *testing.T) {
	const bs, hd, nkv, nh, n = 8, 32, 2, 4, 90
	p := model.AttnParams{NHead: nh, NKVHead: nkv, HeadDim: hd, Scale: 0.2}
	rope := testRope(hd)
	for _, c := range []struct {
		pol   Policy
		exact bool
	}{
		{NewQuest(4096, 0), true}, {NewH2O(500, 500), true}, {NewSnapKV(4096, 8, 7), true},
		{NewQuest(16, 1), false}, {NewH2O(8, 8), false}, {NewSnapKV(24, 8, 7), false},
		{StreamingPolicy{Sinks: 4, Window: 20}, false},
	} {
		mk := func(pol Policy) *Cache {
			cc, err := New(Config{NLayer: 2, NKVHead: nkv, HeadDim: hd, BlockSize: bs, NumBlocks: 16, KFormat: Q8_0, VFormat: Q8_0, Policy: pol, Rope: rope})
			if err != nil {
				t.Fatal(err)
			}
			cc.NotePrompt(0, 40)
			return cc
		}
		pc, full := mk(c.pol), mk(nil)
		r := rand.New(rand.NewPCG(8, 8))
		toks := make([]int32, n)
		for pos := 0; pos < n; pos++ {
			for _, cc := range []*Cache{pc, full} {
				cc.Allocate(0, nil, pos, pos+1)
				oneRow(cc, 0, int32(pos))
			}
			for l := 0; l < 2; l++ {
				k, v, q := randRow(r, nkv*hd), randRow(r, nkv*hd), randRow(r, nh*hd)
				pc.Store(l, 0, k, v)
				full.Store(l, 0, k, v)
				a, b := make([]float32, nh*hd), make([]float32, nh*hd)
				pc.Attend(l, 0, 1, q, a, p)
				full.Attend(l, 0, 1, q, b, p)
				if c.exact {
					closeTo(t, "no eviction over q8_0", a, b, 0)
				}
			}
			pc.Commit(0, toks, pos+1, 0)
			full.Commit(0, toks, pos+1, 0)
			mustCheck(t, pc)
		}
		pc.Free(0)
		mustCheck(t, pc)
		if pc.Usage().Used != 0 {
			t.Fatalf("%v: leak", c.pol)
		}
	}
}
