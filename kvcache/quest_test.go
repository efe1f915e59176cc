package kvcache

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"

	"pagoda/model"
)

// questRef is Quest stated plainly: per KV head, the bound of every full
// block before the query's from its keys' minima and maxima, the best
// over the GQA group, the top budget/bs blocks (ties to the earlier)
// plus the query's own block.
func questRef(keys [][]float32, pos, bs, budget, kh, group, kd int, q []float32) []int {
	cur := pos / bs
	type cand struct {
		b int
		s float64
	}
	var cs []cand
	for b := 0; b < cur; b++ {
		best := math.Inf(-1)
		for g := 0; g < group; g++ {
			var s float64
			for j := 0; j < kd; j++ {
				mx, mn := math.Inf(-1), math.Inf(1)
				for t := b * bs; t < (b+1)*bs; t++ {
					v := float64(keys[t][kh*kd+j])
					mx, mn = math.Max(mx, v), math.Min(mn, v)
				}
				qv := float64(q[(kh*group+g)*kd+j])
				s += math.Max(qv*mx, qv*mn)
			}
			best = math.Max(best, s)
		}
		cs = append(cs, cand{b, best})
	}
	sort.SliceStable(cs, func(i, j int) bool { return cs[i].s > cs[j].s })
	keep := map[int]bool{cur: true}
	for i := 0; i < len(cs) && i < max(budget/bs, 1); i++ {
		keep[cs[i].b] = true
	}
	if budget >= pos+1 {
		for b := 0; b <= cur; b++ {
			keep[b] = true
		}
	}
	var out []int
	for t := 0; t <= pos; t++ {
		if keep[t/bs] {
			out = append(out, t)
		}
	}
	return out
}

// TestQuestMatchesReference decodes token by token through two layers
// (the first dense) and checks every query against the reference
// selection, head by head; a budget covering everything equals dense
// attention bit for bit.
func TestQuestMatchesReference(t *testing.T) {
	const bs, hd, nkv, nh, n = 4, 8, 2, 4, 70
	p := model.AttnParams{NHead: nh, NKVHead: nkv, HeadDim: hd, Scale: 0.35}
	for _, budget := range []int{4, 12, 30, 1000} {
		qp := NewQuest(budget, 1)
		c, err := New(Config{NLayer: 2, NKVHead: nkv, HeadDim: hd, BlockSize: bs, NumBlocks: 20, DType: F32, Policy: qp})
		if err != nil {
			t.Fatal(err)
		}
		dense, _ := New(Config{NLayer: 2, NKVHead: nkv, HeadDim: hd, BlockSize: bs, NumBlocks: 20, DType: F32})
		// The bounds of the one selecting layer count in a block's bytes.
		if got, want := c.Config().BlockBytes(), dense.Config().BlockBytes()+nkv*2*hd*4; got != want {
			t.Fatalf("quest block of %d bytes, want %d", got, want)
		}
		r := rand.New(rand.NewPCG(5, uint64(budget)))
		keys, vals := [2][][]float32{}, [2][][]float32{}
		toks := []int32{}
		for pos := 0; pos < n; pos++ {
			toks = append(toks, int32(pos))
			for _, cc := range []*Cache{c, dense} {
				if !cc.Allocate(3, nil, pos, pos+1) {
					t.Fatal("allocate")
				}
				oneRow(cc, 3, int32(pos))
			}
			for l := 0; l < 2; l++ {
				k, v, q := randRow(r, nkv*hd), randRow(r, nkv*hd), randRow(r, nh*hd)
				// A few loud channels make blocks differ, as real keys do.
				k[r.IntN(nkv*hd)] *= 6
				keys[l], vals[l] = append(keys[l], k), append(vals[l], v)
				c.Store(l, 0, k, v)
				dense.Store(l, 0, k, v)
				got, want := make([]float32, nh*hd), make([]float32, nh*hd)
				c.Attend(l, 0, 1, q, got, p)
				dense.Attend(l, 0, 1, q, want, p)
				if l == 0 || budget >= n {
					closeTo(t, "dense layer or whole budget", got, want, 0)
					continue
				}
				for kh := 0; kh < nkv; kh++ {
					sel := questRef(keys[l], pos, bs, budget, kh, nh/nkv, hd, q)
					ref := refAttend(keys[l], vals[l], sel, q, nh, nkv, hd, hd, p.Scale)
					lo, hi := kh*(nh/nkv)*hd, (kh+1)*(nh/nkv)*hd
					closeTo(t, "quest head", got[lo:hi], ref[lo:hi], 1e-5)
				}
			}
			c.Commit(3, toks, pos+1, 0)
			dense.Commit(3, toks, pos+1, 0)
		}
		c.Free(3)
		mustCheck(t, c)
	}
}

// TestQuestPrefixAndPrefill: a prompt chunk attends densely; bounds come
// with a prefix hit (the second sequence computes none of its own for the
// hit blocks and selects the same blocks); blocks holding positions whose
// queries skipped blocks stay out of the prefix cache.
func TestQuestPrefixAndPrefill(t *testing.T) {
	const bs, hd = 4, 8
	p := model.AttnParams{NHead: 2, NKVHead: 1, HeadDim: hd, Scale: 0.4}
	c, err := New(Config{NLayer: 1, NKVHead: 1, HeadDim: hd, BlockSize: bs, NumBlocks: 40, DType: F32, PrefixCache: true, Policy: NewQuest(8, 0)})
	if err != nil {
		t.Fatal(err)
	}
	qp := c.Policy(0).(*QuestPolicy)
	dense, _ := New(Config{NLayer: 1, NKVHead: 1, HeadDim: hd, BlockSize: bs, NumBlocks: 40, DType: F32})
	toks := make([]int32, 48)
	for i := range toks {
		toks[i] = int32(i % 13)
	}
	q := func(pos int) []float32 { return kvRow(toks, pos, 2*hd, 9) }
	// Prefill 40 tokens in one chunk: dense for every row.
	b := &model.Batch{}
	for pos := 0; pos < 40; pos++ {
		b.Tokens, b.Pos, b.Seq = append(b.Tokens, toks[pos]), append(b.Pos, int32(pos)), append(b.Seq, 1)
	}
	qs, got, want := []float32{}, make([]float32, 40*2*hd), make([]float32, 40*2*hd)
	for pos := 0; pos < 40; pos++ {
		qs = append(qs, q(pos)...)
	}
	for _, cc := range []*Cache{c, dense} {
		cc.Allocate(1, nil, 0, 40)
		if err := cc.Begin(b); err != nil {
			t.Fatal(err)
		}
		for pos := 0; pos < 40; pos++ {
			cc.Store(0, pos, kvRow(toks, pos, hd, 0), kvRow(toks, pos, hd, 1))
		}
	}
	c.Attend(0, 0, 40, qs, got, p)
	dense.Attend(0, 0, 40, qs, want, p)
	closeTo(t, "prefill", got, want, 0)
	c.Commit(1, toks, 40, 0)
	if qp.Sealed(1) != math.MaxInt {
		t.Fatalf("a dense prefill sealed position %d", qp.Sealed(1))
	}
	decode := func(seq int32, pos int) []float32 {
		c.Allocate(seq, nil, pos, pos+1)
		storeTok(c, 0, seq, int32(pos), kvRow(toks, pos, hd, 0), kvRow(toks, pos, hd, 1))
		out := make([]float32, 2*hd)
		c.Attend(0, 0, 1, q(pos), out, p)
		c.Commit(seq, toks, pos+1, 0)
		return out
	}
	a := decode(1, 40)
	if qp.Sealed(1) != 40 {
		t.Fatalf("sealed at %d after a selective decode at 40", qp.Sealed(1))
	}
	for pos := 41; pos < 48; pos++ {
		decode(1, pos)
	}
	// Blocks 0-9 (the prompt) are cached; block 10 (40-43) and 11 are not.
	hit := c.Lookup(toks, 0)
	if len(hit) != 10 {
		t.Fatalf("prefix hit %d blocks, want the 10 of the prompt", len(hit))
	}
	// Mark the stored bounds of a hit block: the hit must use them as
	// they are, not compute its own.
	bd := qp.st.bounds[0][int(hit[3])*2*hd : (int(hit[3])+1)*2*hd]
	saved := append([]float32(nil), bd...)
	bd[0] = 42
	c.Allocate(2, hit, 40, 40)
	c.Commit(2, toks, 40, 0)
	if bd[0] != 42 || qp.st.seqs[2].done != 10 {
		t.Fatalf("the hit recomputed bounds (%v) or starts with %d summarized blocks, want 10", bd[0], qp.st.seqs[2].done)
	}
	copy(bd, saved)
	if b := decode(2, 40); !equalF(a, b) {
		t.Fatalf("through the hit %v, original %v", b, a)
	}
	c.Free(1)
	c.Free(2)
	mustCheck(t, c)
	if c.Usage().Used != 0 || len(qp.st.seqs) != 0 {
		t.Fatalf("leak: %+v, %d policy states", c.Usage(), len(qp.st.seqs))
	}
}

func equalF(a, b []float32) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return len(a) == len(b)
}
