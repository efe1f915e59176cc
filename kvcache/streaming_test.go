package kvcache

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"pagoda/kernels"
	"pagoda/model"
)

func testRope(hd int) *Rotary {
	f := make([]float32, hd/2)
	for i := range f {
		f[i] = float32(math.Pow(10000, -2*float64(i)/float64(hd)))
	}
	return &Rotary{Freqs: f, HeadDim: hd}
}

func roped(r *Rotary, x []float32, pos int) []float32 {
	y := append([]float32(nil), x...)
	r.rotate(kernels.RoPERef, y, pos)
	return y
}

// TestStreamingMatchesReference decodes far past several windows and
// checks every step against the plain statement of each position scheme:
// unrotated keys and query rotated at their cache positions (what the
// StreamingLLM reference and a llama.cpp cache after context shifts
// compute), dense attention over the kept tokens. It also checks the
// block bound at every step and that nothing leaks.
func TestStreamingMatchesReference(t *testing.T) {
	const bs, hd, nkv, nh, steps = 4, 8, 2, 4, 150
	rope := testRope(hd)
	p := model.AttnParams{NHead: nh, NKVHead: nkv, HeadDim: hd, Scale: 0.35}
	for _, pol := range []StreamingPolicy{
		{Sinks: 4, Window: 10},
		{Sinks: 3, Window: 9},
		{Sinks: 0, Window: 7},
		{Sinks: 4, Window: 8, Scheme: PosShift, Ctx: 30},
		{Sinks: 2, Window: 5, Scheme: PosShift, Ctx: 16},
	} {
		c, err := New(Config{NLayer: 1, NKVHead: nkv, HeadDim: hd, BlockSize: bs, NumBlocks: 12, DType: F32, Policy: pol, Rope: rope})
		if err != nil {
			t.Fatal(err)
		}
		if c.PositionLimit() != math.MaxInt32 {
			t.Fatal("streaming cache bounds positions")
		}
		bound := c.MaxSeqBlocks(1)
		r := rand.New(rand.NewPCG(1, uint64(pol.Window)))
		var keys, vals [][]float32 // unrotated
		toks := []int32{}
		for pos := 0; pos < steps; pos++ {
			toks = append(toks, int32(pos))
			if !c.Allocate(7, nil, pos, pos+1) {
				t.Fatalf("%v: out of blocks at %d", pol, pos)
			}
			if h := held(c, 7); h > bound {
				t.Fatalf("%v: holds %d blocks at %d, bound %d", pol, h, pos, bound)
			}
			k, v, q := randRow(r, nkv*hd), randRow(r, nkv*hd), randRow(r, nh*hd)
			keys, vals = append(keys, k), append(vals, v)
			storeTok(c, 0, 7, int32(pos), roped(rope, k, pos), v)
			got := make([]float32, nh*hd)
			c.Attend(0, 0, 1, roped(rope, q, pos), got, p)
			seen, at, qAt := pol.CachePositions(pos)
			rk := make([][]float32, len(seen))
			rv := make([][]float32, len(seen))
			idx := make([]int, len(seen))
			for j, tp := range seen {
				rk[j], rv[j], idx[j] = roped(rope, keys[tp], at[j]), vals[tp], j
			}
			want := refAttend(rk, rv, idx, roped(rope, q, qAt), nh, nkv, hd, hd, p.Scale)
			closeTo(t, pol.String(), got, want, 2e-5)
			c.Commit(7, toks, pos+1, 0)
			mustCheck(t, c)
		}
		c.Free(7)
		mustCheck(t, c)
		if u := c.Usage(); u.Used != 0 {
			t.Fatalf("%v: leak %+v", pol, u)
		}
	}
}

// TestStreamingSchemes pins the positions each scheme gives.
func TestStreamingSchemes(t *testing.T) {
	cache := StreamingPolicy{Sinks: 2, Window: 3}
	seen, at, q := cache.CachePositions(9)
	if want := []int{0, 1, 7, 8, 9}; !eqInts(seen, want) || !eqInts(at, []int{0, 1, 2, 3, 4}) || q != 4 {
		t.Fatalf("cache scheme at 9: %v at %v, query %d", seen, at, q)
	}
	shift := StreamingPolicy{Sinks: 2, Window: 3, Scheme: PosShift, Ctx: 10}
	// Positions 0..9 fill the cache; 10 shifts out 2..6 (5 tokens), keeping 7, 8, 9.
	if seen, at, q := shift.CachePositions(9); len(seen) != 10 || at[9] != 9 || q != 9 {
		t.Fatalf("shift scheme before the shift: %v at %v, query %d", seen, at, q)
	}
	seen, at, q = shift.CachePositions(12)
	if !eqInts(seen, []int{0, 1, 7, 8, 9, 10, 11, 12}) || !eqInts(at, []int{0, 1, 2, 3, 4, 5, 6, 7}) || q != 7 {
		t.Fatalf("shift scheme at 12: %v at %v, query %d", seen, at, q)
	}
	// The next shift comes when the cache is full again, at 15.
	if seen, _, q := shift.CachePositions(15); !eqInts(seen, []int{0, 1, 12, 13, 14, 15}) || q != 5 {
		t.Fatalf("shift scheme at 15: %v, query %d", seen, q)
	}
	if err := (StreamingPolicy{Sinks: 4, Window: 8, Scheme: PosShift, Ctx: 12}).Check(); err == nil {
		t.Fatal("a shift that discards nothing passed")
	}
	if _, err := New(Config{NLayer: 1, NKVHead: 1, HeadDim: 4, NumBlocks: 4, Policy: cache}); err == nil {
		t.Fatal("a streaming cache without the rotary embedding was built")
	}
}

func eqInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestStreamingPrefixCache: a prompt's blocks computed under the policy
// are reused by a second request; the sink block is shared, blocks past
// the window are not claimed, and attention through the hit equals the
// original's.
func TestStreamingPrefixCache(t *testing.T) {
	const bs, hd = 4, 8
	rope := testRope(hd)
	pol := StreamingPolicy{Sinks: 4, Window: 8}
	c, err := New(Config{NLayer: 1, NKVHead: 1, HeadDim: hd, BlockSize: bs, NumBlocks: 32, DType: F32, PrefixCache: true, Policy: pol, Rope: rope})
	if err != nil {
		t.Fatal(err)
	}
	toks := make([]int32, 41)
	for i := range toks {
		toks[i] = int32(i * 3 % 11)
	}
	p := model.AttnParams{NHead: 1, NKVHead: 1, HeadDim: hd, Scale: 0.3}
	run := func(seq int32, hit []int32) []float32 {
		from := len(hit) * bs
		if !c.Allocate(seq, hit, from, len(toks)) {
			t.Fatal("allocate")
		}
		for pos := from; pos < len(toks); pos++ {
			storeTok(c, 0, seq, int32(pos), roped(rope, kvRow(toks, pos, hd, 0), pos), kvRow(toks, pos, hd, 1))
		}
		out := make([]float32, hd)
		attendTok(c, 0, seq, int32(len(toks)), roped(rope, kvRow(toks, 40, hd, 2), 40), out, p)
		c.Commit(seq, toks, len(toks), 0)
		mustCheck(t, c)
		return out
	}
	a := run(1, nil)
	hit := c.Lookup(toks, 0)
	if len(hit) != 10 {
		t.Fatalf("hit %d blocks, want 10", len(hit))
	}
	b := run(2, hit)
	closeTo(t, "through the prefix hit", b, a, 0)
	if c.Pool().Ref(hit[0]) != 2 {
		t.Fatalf("sink block ref %d, want shared by both", c.Pool().Ref(hit[0]))
	}
	if held(c, 2) > c.MaxSeqBlocks(1) {
		t.Fatalf("the hit claimed %d blocks", held(c, 2))
	}
	c.Free(1)
	c.Free(2)
	mustCheck(t, c)
	if c.Usage().Used != 0 {
		t.Fatal("leak")
	}
}

func TestParsePolicy(t *testing.T) {
	for s, want := range map[string]Policy{
		"full":                                 FullPolicy{},
		"":                                     FullPolicy{},
		"window:w=64":                          WindowPolicy{64},
		"streaming":                            StreamingPolicy{Sinks: 4, Window: 256},
		"streaming:sinks=0,window=8":           StreamingPolicy{Window: 8},
		"streaming:window=8,pos=shift":         StreamingPolicy{Sinks: 4, Window: 8, Scheme: PosShift, Ctx: 20},
		"streaming:window=8,pos=shift,ctx=100": StreamingPolicy{Sinks: 4, Window: 8, Scheme: PosShift, Ctx: 100},
		"quest":                                NewQuest(1024, 2),
		"quest:budget=256,dense=0":             NewQuest(256, 0),
		"h2o":                                  NewH2O(0.1, 0.1),
		"h2o:heavy=64,recent=32":               NewH2O(64, 32),
		"snapkv:capacity=512":                  NewSnapKV(512, 32, 7),
	} {
		got, err := ParsePolicy(s)
		if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("ParsePolicy(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"lru", "streaming:sink=4", "streaming:window=0", "streaming:window=x", "streaming:pos=left",
		"streaming:window=8,pos=shift,ctx=10", "window", "streaming:window", "quest:budget=0", "h2o:heavy=0.6,recent=0.5",
		"snapkv:capacity=8,window=32", "snapkv:kernel=4", "h2o:heavy=x"} {
		if _, err := ParsePolicy(s); err == nil {
			t.Errorf("ParsePolicy(%q) accepted", s)
		}
	}
}

func TestConfigure(t *testing.T) {
	cfg := Config{NLayer: 5, NKVHead: 2, HeadDim: 8, NumBlocks: 4}
	if err := Configure(&cfg, "quest:budget=64"); err != nil || cfg.Policy.(*QuestPolicy).Budget != 64 {
		t.Fatalf("quest: %v %v", cfg.Policy, err)
	}
	cfg = Config{NLayer: 5, NKVHead: 2, HeadDim: 8, NumBlocks: 4}
	if err := Configure(&cfg, "minicache:from=1,spare=2"); err != nil {
		t.Fatal(err)
	}
	// Layer 0 plain, pairs (1,2) and (3,4).
	if len(cfg.Groups) != 3 || len(cfg.Groups[0].Layers) != 1 || cfg.Groups[2].Layers[0] != 3 {
		t.Fatalf("groups %+v", cfg.Groups)
	}
	if _, err := New(cfg); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"minicache:from=4", "minicache:frm=1", "minicache:t=2", "bogus"} {
		cfg := Config{NLayer: 5, NKVHead: 2, HeadDim: 8, NumBlocks: 4}
		if err := Configure(&cfg, s); err == nil {
			t.Errorf("Configure(%q) accepted", s)
		}
	}
}
