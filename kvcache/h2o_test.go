package kvcache

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"

	"pagoda/model"
)

// TestH2OMatchesReference decodes step by step and holds the cache to a
// brute-force H2O: per KV head, softmax over the kept positions, masses
// summed over the group, after each step the top heavy of the older
// positions plus the recent ones kept. Outputs and kept sets must agree.
func TestH2OMatchesReference(t *testing.T) {
	const bs, hd, nkv, nh, n = 4, 8, 2, 4, 60
	p := model.AttnParams{NHead: nh, NKVHead: nkv, HeadDim: hd, Scale: 0.5}
	for _, cfg := range [][2]float64{{6, 4}, {0.2, 0.1}, {3, 9}} {
		c, err := New(Config{NLayer: 1, NKVHead: nkv, HeadDim: hd, BlockSize: bs, NumBlocks: 20, DType: F32, PrefixCache: true, Policy: NewH2O(cfg[0], cfg[1])})
		if err != nil {
			t.Fatal(err)
		}
		pol := c.Policy(0).(*H2OPolicy)
		r := rand.New(rand.NewPCG(9, uint64(cfg[0]*10)))
		var keys, vals [][]float32
		acc := make([][]float64, nkv)
		gone := make([][]bool, nkv)
		toks := []int32{}
		for pos := 0; pos < n; pos++ {
			toks = append(toks, int32(pos))
			if !c.Allocate(1, nil, pos, pos+1) {
				t.Fatal("allocate")
			}
			k, v, q := randRow(r, nkv*hd), randRow(r, nkv*hd), randRow(r, nh*hd)
			keys, vals = append(keys, k), append(vals, v)
			storeTok(c, 0, 1, int32(pos), k, v)
			got := make([]float32, nh*hd)
			c.Attend(0, 0, 1, q, got, p)
			for kh := 0; kh < nkv; kh++ {
				acc[kh], gone[kh] = append(acc[kh], 0), append(gone[kh], false)
				var kept []int
				for tp := 0; tp <= pos; tp++ {
					if !gone[kh][tp] {
						kept = append(kept, tp)
					}
				}
				want := refAttend(keys, vals, kept, q, nh, nkv, hd, hd, p.Scale)
				lo, hi := kh*(nh/nkv)*hd, (kh+1)*(nh/nkv)*hd
				closeTo(t, "h2o head", got[lo:hi], want[lo:hi], 1e-5)
				for h := kh * (nh / nkv); h < (kh+1)*(nh/nkv); h++ {
					s := make([]float64, len(kept))
					mx := math.Inf(-1)
					for i, tp := range kept {
						for j := 0; j < hd; j++ {
							s[i] += float64(q[h*hd+j]) * float64(keys[tp][kh*hd+j])
						}
						s[i] *= float64(p.Scale)
						mx = math.Max(mx, s[i])
					}
					var z float64
					for i := range s {
						s[i] = math.Exp(s[i] - mx)
						z += s[i]
					}
					for i, tp := range kept {
						acc[kh][tp] += s[i] / z
					}
				}
				heavy, recent := pol.budget(pos + 1)
				var cand []int
				for tp := 0; tp < max(0, pos+1-recent); tp++ {
					if !gone[kh][tp] {
						cand = append(cand, tp)
					}
				}
				sort.SliceStable(cand, func(i, j int) bool {
					if acc[kh][cand[i]] != acc[kh][cand[j]] {
						return acc[kh][cand[i]] > acc[kh][cand[j]]
					}
					return cand[i] > cand[j]
				})
				if len(cand) > heavy {
					for _, tp := range cand[heavy:] {
						gone[kh][tp] = true
					}
				}
			}
			c.Commit(1, toks, pos+1, 0)
			s := pol.m.seqs[1]
			for kh := 0; kh < nkv; kh++ {
				for tp := 0; tp <= pos; tp++ {
					if s.gone[kh][tp] != gone[kh][tp] {
						t.Fatalf("%v at %d: head %d position %d evicted %v, reference %v", pol, pos, kh, tp, s.gone[kh][tp], gone[kh][tp])
					}
				}
			}
			mustCheck(t, c)
		}
		// Positions after the first eviction never reach the prefix cache.
		if hit := c.Lookup(append(toks, 0), 0); len(hit)*bs > pol.Sealed(1) {
			t.Fatalf("%v: prefix hit of %d blocks past the seal at %d", pol, len(hit), pol.Sealed(1))
		}
		c.Free(1)
		mustCheck(t, c)
		if c.Usage().Used != 0 || len(pol.m.seqs) != 0 {
			t.Fatalf("%v: leak %+v, %d states", pol, c.Usage(), len(pol.m.seqs))
		}
	}
}
