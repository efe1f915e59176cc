package kvcache

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"pagoda/model"
)

// held counts the blocks seq still holds (released entries excluded).
func held(c *Cache, seq int32) int {
	n := 0
	for _, id := range c.Table(seq) {
		if id != released {
			n++
		}
	}
	return n
}

// kvRow is a K or V row that depends only on the token prefix ending at
// pos, as a model's would, so blocks reused through the prefix cache hold
// exactly what recomputing them would store.
func kvRow(tokens []int32, pos, n int, salt uint64) []float32 {
	r := rand.New(rand.NewPCG(BlockHash(0, tokens[:pos+1], salt), uint64(pos)))
	row := make([]float32, n)
	for i := range row {
		row[i] = float32(r.NormFloat64())
	}
	return row
}

func TestSlidingWindowReleasesAndReuses(t *testing.T) {
	const W = 6
	c, err := New(Config{NLayer: 1, NKVHead: 1, HeadDim: 4, BlockSize: 4, NumBlocks: 16, DType: F32, PrefixCache: true, Window: W})
	if err != nil {
		t.Fatal(err)
	}
	toks := make([]int32, 40)
	for i := range toks {
		toks[i] = int32(i)
	}
	if !c.Allocate(1, nil, 0, 40) {
		t.Fatal("allocate")
	}
	for pos := range 40 {
		storeTok(c, 0, 1, int32(pos), kvRow(toks, pos, 4, 0), kvRow(toks, pos, 4, 1))
	}
	c.Commit(1, toks, 40, 0)
	mustCheck(t, c)
	// Token 40 on sees positions 35.. only: blocks 0-7 (positions 0-31) go.
	if got := held(c, 1); got != 2 {
		t.Fatalf("holds %d blocks after 40 tokens with window %d, want 2", got, W)
	}
	if u := c.Usage(); u.Used != 2 || u.CachedFree != 8 || u.Filled != 8 {
		t.Fatalf("usage %+v", u)
	}
	// The released blocks stay in the prefix cache: the same prompt hits
	// all 9 full blocks, claims only the two inside the window, and
	// shares block 8 with sequence 1.
	hit := c.Lookup(toks, 0)
	if len(hit) != 9 {
		t.Fatalf("hit %d blocks, want 9", len(hit))
	}
	free := c.Pool().NumFree()
	if !c.Allocate(2, hit, 36, 40) {
		t.Fatal("allocate with hit")
	}
	mustCheck(t, c)
	// Block 7 is revived from the free queue, block 9 is new; block 8 is shared.
	if got := free - c.Pool().NumFree(); got != 2 {
		t.Fatalf("the hit took %d free blocks, want 2", got)
	}
	if c.Pool().Ref(hit[8]) != 2 || held(c, 2) != 3 {
		t.Fatalf("block 8 ref %d, sequence 2 holds %d", c.Pool().Ref(hit[8]), held(c, 2))
	}
	q := []float32{1, 0.5, -1, 2}
	p := model.AttnParams{NHead: 1, NKVHead: 1, HeadDim: 4, Scale: 0.5, Window: W}
	for pos := 36; pos < 40; pos++ {
		storeTok(c, 0, 2, int32(pos), kvRow(toks, pos, 4, 0), kvRow(toks, pos, 4, 1))
	}
	a, b := make([]float32, 4), make([]float32, 4)
	attendTok(c, 0, 1, 40, q, a, p)
	attendTok(c, 0, 2, 40, q, b, p)
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("through the reused blocks %v, original %v", b, a)
		}
	}
	// Reading a released block is refused, never silently wrong.
	if err := c.Begin(&model.Batch{Tokens: []int32{0}, Pos: []int32{3}, Seq: []int32{2}}); err == nil || !strings.Contains(err.Error(), "released") {
		t.Fatalf("Begin on a released block: %v", err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("attend without the window read released blocks")
			}
		}()
		p0 := p
		p0.Window = 0
		attendTok(c, 0, 2, 40, q, b, p0)
	}()
	c.Free(1)
	c.Free(2)
	mustCheck(t, c)
	if u := c.Usage(); u.Used != 0 || u.Seqs != 0 {
		t.Fatalf("leak: %+v", u)
	}
}

// TestSlidingWindowDecodeBound: a long generation holds at most
// ceil(window/block)+1 blocks at any step.
func TestSlidingWindowDecodeBound(t *testing.T) {
	for _, w := range []int{1, 4, 7, 8, 9} {
		c, err := New(Config{NLayer: 1, NKVHead: 1, HeadDim: 4, BlockSize: 4, NumBlocks: 8, DType: F16, PrefixCache: true, Window: w})
		if err != nil {
			t.Fatal(err)
		}
		bound := (w+3)/4 + 1
		if got := c.MaxSeqBlocks(1); got != bound {
			t.Fatalf("window %d: MaxSeqBlocks(1) = %d, want %d", w, got, bound)
		}
		toks := []int32{}
		for pos := 0; pos < 300; pos++ {
			toks = append(toks, int32(pos%7))
			if !c.Allocate(0, nil, pos, pos+1) {
				t.Fatalf("window %d: allocation failed at %d tokens in 8 blocks", w, pos)
			}
			if h := held(c, 0); h > bound {
				t.Fatalf("window %d: %d blocks held at position %d, bound %d", w, h, pos, bound)
			}
			c.Commit(0, toks, pos+1, 0)
		}
		mustCheck(t, c)
		c.Free(0)
		mustCheck(t, c)
	}
}

// TestSlidingWindowRandomWorkload drives a windowed cache with prefix
// hits, chunked prefills, decodes, forks and frees, checking after every
// operation the pool invariants, the per-sequence block bound, and that
// attention equals that of a cache that never releases anything (bit for
// bit) and the naive reference.
func TestSlidingWindowRandomWorkload(t *testing.T) {
	const bs = 4
	p := model.AttnParams{NHead: 4, NKVHead: 2, HeadDim: 4, Scale: 0.5}
	rowLen := p.NKVHead * p.HeadDim
	for _, tc := range []struct {
		d      DType
		window int
	}{{F32, 7}, {F16, 8}, {F32, 3}} {
		p.Window = tc.window
		rng := rand.New(rand.NewPCG(uint64(tc.window), 5))
		win, err := New(Config{NLayer: 1, NKVHead: 2, HeadDim: 4, BlockSize: bs, NumBlocks: 24, DType: tc.d, PrefixCache: true, Window: tc.window})
		if err != nil {
			t.Fatal(err)
		}
		full, err := New(Config{NLayer: 1, NKVHead: 2, HeadDim: 4, BlockSize: bs, NumBlocks: 400, DType: tc.d})
		if err != nil {
			t.Fatal(err)
		}
		type seq struct {
			tokens   []int32
			computed int
		}
		live := map[int32]*seq{}
		next := int32(0)
		prefixes := [][]int32{{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {9, 9, 9, 9, 1, 1, 1, 1}, {5}}
		var tombHits, compared int
		// compute runs tokens [from, upto) of id through both caches.
		compute := func(id int32, s *seq, from, upto int) {
			for pos := from; pos < upto; pos++ {
				k, v := kvRow(s.tokens, pos, rowLen, 0), kvRow(s.tokens, pos, rowLen, 1)
				storeTok(win, 0, id, int32(pos), k, v)
				storeTok(full, 0, id, int32(pos), k, v)
			}
			q := make([]float32, p.NHead*p.HeadDim)
			for pos := from; pos < upto; pos++ {
				for i := range q {
					q[i] = float32(rng.NormFloat64())
				}
				a, b := make([]float32, len(q)), make([]float32, len(q))
				attendTok(win, 0, id, int32(pos+1), q, a, p)
				attendTok(full, 0, id, int32(pos+1), q, b, p)
				for i := range a {
					if a[i] != b[i] {
						t.Fatalf("%v window %d seq %d pos %d: windowed cache %v, full cache %v", tc.d, tc.window, id, pos, a, b)
					}
				}
				if tc.d == F32 {
					var keys, vals [][]float32
					for j := 0; j <= pos; j++ {
						keys = append(keys, kvRow(s.tokens, j, rowLen, 0))
						vals = append(vals, kvRow(s.tokens, j, rowLen, 1))
					}
					want := naiveAttend(keys, vals, pos+1, q, p)
					for i := range a {
						if d := math.Abs(float64(a[i] - want[i])); d > 2e-6*(1+math.Abs(float64(want[i]))) {
							t.Fatalf("window %d seq %d pos %d: out[%d] = %v, naive %v", tc.window, id, pos, i, a[i], want[i])
						}
					}
				}
				compared++
			}
			s.computed = upto
			win.Commit(id, s.tokens, upto, 0)
			if h := held(win, id); h > win.MaxSeqBlocks(1) {
				t.Fatalf("seq %d holds %d blocks between steps, bound %d", id, h, win.MaxSeqBlocks(1))
			}
		}
		steps := 1500
		if testing.Short() {
			steps = 400
		}
		for step := 0; step < steps; step++ {
			switch r := rng.IntN(10); {
			case r < 2: // new sequence, maybe sharing a prefix
				toks := append([]int32(nil), prefixes[rng.IntN(len(prefixes))]...)
				for i := rng.IntN(20); i > 0; i-- {
					toks = append(toks, rng.Int32N(3))
				}
				hit := win.Lookup(toks, 0)
				from := len(hit) * bs
				n := min(len(toks)-from, 1+rng.IntN(6))
				if !win.Allocate(next, hit, from, from+n) {
					continue
				}
				tombHits += len(win.Table(next)) - held(win, next)
				if h := held(win, next); h > win.MaxSeqBlocks(n) {
					t.Fatalf("new seq holds %d blocks for a chunk of %d, bound %d", h, n, win.MaxSeqBlocks(n))
				}
				s := &seq{tokens: toks}
				full.Allocate(next, nil, 0, from+n)
				for pos := 0; pos < from; pos++ {
					storeTok(full, 0, next, int32(pos), kvRow(toks, pos, rowLen, 0), kvRow(toks, pos, rowLen, 1))
				}
				live[next] = s
				compute(next, s, from, from+n)
				next++
			case r < 7: // advance one: the next prefill chunk, or a decode
				for id, s := range live {
					if s.computed == len(s.tokens) {
						if len(s.tokens) >= 60 {
							break
						}
						s.tokens = append(s.tokens, rng.Int32N(3))
					}
					n := min(len(s.tokens)-s.computed, 1+rng.IntN(6))
					if !win.Allocate(id, nil, s.computed, s.computed+n) {
						if s.computed == len(s.tokens)-1 {
							s.tokens = s.tokens[:len(s.tokens)-1]
						}
						break
					}
					if h := held(win, id); h > win.MaxSeqBlocks(n) {
						t.Fatalf("seq %d holds %d blocks for a chunk of %d, bound %d", id, h, n, win.MaxSeqBlocks(n))
					}
					full.Allocate(id, nil, s.computed, s.computed+n)
					compute(id, s, s.computed, s.computed+n)
					break
				}
			case r < 8: // fork one whose tokens are all computed
				for id, s := range live {
					if s.computed != len(s.tokens) {
						break
					}
					if err := win.Fork(id, next); err != nil {
						t.Fatal(err)
					}
					if err := full.Fork(id, next); err != nil {
						t.Fatal(err)
					}
					live[next] = &seq{append([]int32(nil), s.tokens...), s.computed}
					next++
					break
				}
			default:
				for id := range live {
					win.Free(id)
					full.Free(id)
					delete(live, id)
					break
				}
			}
			mustCheck(t, win)
		}
		for id := range live {
			win.Free(id)
			full.Free(id)
		}
		mustCheck(t, win)
		mustCheck(t, full)
		if u := win.Usage(); u.Used != 0 || u.Seqs != 0 {
			t.Fatalf("leak: %+v", u)
		}
		t.Logf("%v window %d: %d attention rows compared, %d prefix hits released on arrival, %d evictions",
			tc.d, tc.window, compared, tombHits, win.Pool().Evictions)
		if tombHits == 0 || compared < steps/2 {
			t.Fatalf("workload too weak: %d released hits, %d rows", tombHits, compared)
		}
	}
}

func TestSaltKey(t *testing.T) {
	if SaltKey(7, "") != 7 {
		t.Fatal("an empty salt must leave the key alone")
	}
	if SaltKey(7, "a") == SaltKey(7, "b") || SaltKey(7, "a") == 7 || SaltKey(7, "a") != SaltKey(7, "a") || SaltKey(7, "a") == SaltKey(8, "a") {
		t.Fatal("salted keys collide")
	}
	c := newTestCache(t, 16, F32, true)
	prompt := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9}
	a, b := SaltKey(0, "alice"), SaltKey(0, "bob")
	c.Allocate(1, nil, 0, len(prompt))
	c.Commit(1, prompt, len(prompt), a)
	if h := c.Lookup(prompt, b); len(h) != 0 {
		t.Fatalf("salt bob hit %d blocks of salt alice", len(h))
	}
	if h := c.Lookup(prompt, 0); len(h) != 0 {
		t.Fatalf("no salt hit %d blocks of salt alice", len(h))
	}
	if h := c.Lookup(prompt, a); len(h) != 2 {
		t.Fatalf("same salt hit %d blocks, want 2", len(h))
	}
	// Even under a colliding hash the extra key is compared.
	id := c.Table(1)[0]
	if _, ok := c.Pool().lookup(c.Pool().blocks[id].hash, prompt[:4], b); ok {
		t.Fatal("lookup ignored the extra key")
	}
}
