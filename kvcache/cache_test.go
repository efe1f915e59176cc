package kvcache

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"pagoda/model"
)

func newTestCache(t *testing.T, blocks int, d DType, prefix bool) *Cache {
	t.Helper()
	c, err := New(Config{NLayer: 2, NKVHead: 2, HeadDim: 8, BlockSize: 4, NumBlocks: blocks, DType: d, PrefixCache: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func mustCheck(t *testing.T, c *Cache) {
	t.Helper()
	if err := c.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestBudgetSizing(t *testing.T) {
	cfg := Config{NLayer: 2, NKVHead: 2, HeadDim: 8, BlockSize: 4, Bytes: 10000}
	// 2 (K,V) · 2 layers · 4 tokens · 16 floats · 2 bytes = 512 bytes a block.
	if got := cfg.BlockBytes(); got != 512 {
		t.Fatalf("block bytes %d, want 512", got)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if c.Pool().NumBlocks() != 19 {
		t.Fatalf("blocks %d, want 19", c.Pool().NumBlocks())
	}
	if _, err := New(Config{NLayer: 2, NKVHead: 2, HeadDim: 8, Bytes: 10}); err == nil {
		t.Fatal("a budget smaller than one block must be an error")
	}
	if _, err := New(Config{NLayer: 2, NKVHead: 0, HeadDim: 8, NumBlocks: 3}); err == nil {
		t.Fatal("zero KV heads must be an error")
	}
}

func TestAllocateFreeAndExhaustion(t *testing.T) {
	c := newTestCache(t, 4, F32, false)
	if !c.Allocate(1, nil, 0, 9) { // 3 blocks
		t.Fatal("allocate 9 tokens in 4 blocks failed")
	}
	if c.Allocate(2, nil, 0, 5) { // 2 blocks, 1 left
		t.Fatal("allocation beyond the pool succeeded")
	}
	if c.Table(2) != nil {
		t.Fatal("failed allocation left a table")
	}
	mustCheck(t, c)
	u := c.Usage()
	if u.Used != 3 || u.Free != 1 || u.InternalFrag != 3 || u.Filled != 9 || u.ExternalFrag != 0 {
		t.Fatalf("usage %+v", u)
	}
	if !c.Allocate(1, nil, 9, 12) || len(c.Table(1)) != 3 {
		t.Fatal("growing within the last block must not take a block")
	}
	c.Free(1)
	mustCheck(t, c)
	if c.Pool().NumFree() != 4 {
		t.Fatalf("free %d after releasing everything", c.Pool().NumFree())
	}
}

func TestPrefixCacheHitAndTokenCheck(t *testing.T) {
	c := newTestCache(t, 16, F32, true)
	prompt := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	if hit := c.Lookup(prompt, 0); len(hit) != 0 {
		t.Fatalf("cold cache hit %v", hit)
	}
	c.Allocate(1, nil, 0, len(prompt))
	c.Commit(1, prompt, len(prompt), 0)
	if c.Pool().NumCached() != 2 {
		t.Fatalf("cached %d blocks, want 2", c.Pool().NumCached())
	}
	hit := c.Lookup(prompt, 0)
	if len(hit) != 2 || hit[0] != c.Table(1)[0] || hit[1] != c.Table(1)[1] {
		t.Fatalf("hit %v, table %v", hit, c.Table(1))
	}
	// A different extra key (another model or adapter) must miss.
	if h := c.Lookup(prompt, 7); len(h) != 0 {
		t.Fatalf("hit across extra keys: %v", h)
	}
	// Diverging in the second block keeps only the first.
	other := []int32{1, 2, 3, 4, 5, 6, 0, 8, 9}
	if h := c.Lookup(other, 0); len(h) != 1 {
		t.Fatalf("partial hit %v", h)
	}
	// The last token is always recomputed: an exact 8-token prompt hits one block.
	if h := c.Lookup(prompt[:8], 0); len(h) != 1 {
		t.Fatalf("hit of exact-length prompt %v", h)
	}
	// A hash collision is a miss: register content under a hash that
	// another block's tokens produce.
	p := c.Pool()
	h := BlockHash(0, []int32{9, 9, 9, 9}, 0)
	p.register(c.Table(1)[2], h, 0, false, []int32{1, 1, 1, 1}, 0)
	if _, ok := p.lookup(h, []int32{9, 9, 9, 9}, 0); ok {
		t.Fatal("lookup trusted the hash over the token ids")
	}
	// Share, free the owner: the blocks stay cached and come back.
	c.Allocate(2, c.Lookup(prompt, 0), 8, len(prompt))
	c.RecordPrefixQuery(len(prompt), 8)
	mustCheck(t, c)
	c.Free(1)
	c.Free(2)
	mustCheck(t, c)
	if got := c.Lookup(prompt, 0); len(got) != 2 {
		t.Fatalf("cached prefix lost after free: %v", got)
	}
	if c.Usage().CachedFree != 3 {
		t.Fatalf("cached-free %d, want 3", c.Usage().CachedFree)
	}
	if p.Queries != 10 || p.Hits != 8 || p.HitRate() != 0.8 {
		t.Fatalf("counters %d/%d", p.Hits, p.Queries)
	}
}

func TestEvictionOnlyWhenFreeRunsOut(t *testing.T) {
	c := newTestCache(t, 4, F32, true)
	prompt := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9}
	c.Allocate(1, nil, 0, 9)
	c.Commit(1, prompt, 9, 0)
	c.Free(1) // 2 cached free blocks + 2 plain
	c.Allocate(2, nil, 0, 8)
	if len(c.Lookup(prompt, 0)) != 2 {
		t.Fatal("allocation evicted a cached block while plain free blocks remained")
	}
	c.Allocate(3, nil, 0, 4)
	// The prefix's tail block is evicted first, its head survives.
	if got := c.Lookup(prompt, 0); len(got) != 1 {
		t.Fatalf("after one eviction hit %d blocks, want 1", len(got))
	}
	mustCheck(t, c)
}

func TestCopyOnWrite(t *testing.T) {
	for _, d := range []DType{F32, F16} {
		c := newTestCache(t, 8, d, false)
		row := func(x float32) []float32 {
			r := make([]float32, 16)
			for i := range r {
				r[i] = x + float32(i)/16
			}
			return r
		}
		c.Allocate(1, nil, 0, 6)
		for pos := int32(0); pos < 6; pos++ {
			for l := 0; l < 2; l++ {
				storeTok(c, l, 1, pos, row(float32(pos)), row(-float32(pos)))
			}
		}
		if err := c.Fork(1, 2); err != nil {
			t.Fatal(err)
		}
		if c.Table(2)[1] != c.Table(1)[1] || c.Pool().Ref(c.Table(1)[1]) != 2 {
			t.Fatal("fork does not share blocks")
		}
		// The child writes position 6, inside the shared second block.
		if !c.Allocate(2, nil, 6, 7) {
			t.Fatal("cow allocation failed")
		}
		if c.Table(2)[1] == c.Table(1)[1] || c.Table(2)[0] != c.Table(1)[0] {
			t.Fatalf("cow copied the wrong blocks: %v vs %v", c.Table(1), c.Table(2))
		}
		for l := 0; l < 2; l++ {
			storeTok(c, l, 2, 6, row(100), row(-100))
		}
		c.Allocate(1, nil, 6, 7)
		for l := 0; l < 2; l++ {
			storeTok(c, l, 1, 6, row(50), row(-50))
		}
		mustCheck(t, c)
		// Attention with a one-hot query over each sequence recovers its rows.
		p := model.AttnParams{NHead: 2, NKVHead: 2, HeadDim: 8, Scale: 0}
		q := make([]float32, 16)
		for seq, last := range map[int32]float32{1: 50, 2: 100} {
			out := make([]float32, 16)
			attendTok(c, 1, seq, 7, q, out, p)
			// Uniform weights: mean of positions 0..5 and the last one.
			want := (0 + 1 + 2 + 3 + 4 + 5 + last) / 7
			if math.Abs(float64(-out[0]-want)) > 0.05 {
				t.Fatalf("%v seq %d: mean value %v, want %v", d, seq, -out[0], want)
			}
		}
		c.Free(1)
		c.Free(2)
		mustCheck(t, c)
		if c.Pool().NumFree() != 8 {
			t.Fatal("blocks leaked after cow")
		}
	}
}

// naiveAttend is attention over contiguous per-position K/V rows.
func naiveAttend(keys, vals [][]float32, n int, q []float32, p model.AttnParams) []float32 {
	out := make([]float32, p.NHead*p.HeadDim)
	lo := 0
	if p.Window > 0 && n > p.Window {
		lo = n - p.Window
	}
	group := p.NHead / p.NKVHead
	for h := 0; h < p.NHead; h++ {
		kh := h / group
		s := make([]float64, n-lo)
		m := math.Inf(-1)
		for t := lo; t < n; t++ {
			var d float64
			for i := 0; i < p.HeadDim; i++ {
				d += float64(q[h*p.HeadDim+i]) * float64(keys[t][kh*p.HeadDim+i])
			}
			s[t-lo] = d * float64(p.Scale)
			m = math.Max(m, s[t-lo])
		}
		var z float64
		for i := range s {
			s[i] = math.Exp(s[i] - m)
			z += s[i]
		}
		for t := lo; t < n; t++ {
			for i := 0; i < p.HeadDim; i++ {
				out[h*p.HeadDim+i] += float32(s[t-lo] / z * float64(vals[t][kh*p.HeadDim+i]))
			}
		}
	}
	return out
}

func TestPagedAttentionMatchesNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		d   DType
		tol float64
	}{{F32, 2e-6}, {F16, 3e-3}, {BF16, 2e-2}} {
		for _, p := range []model.AttnParams{
			{NHead: 4, NKVHead: 4, HeadDim: 16},
			{NHead: 8, NKVHead: 2, HeadDim: 16},
			{NHead: 8, NKVHead: 2, HeadDim: 16, Window: 7},
		} {
			p.Scale = 1 / float32(math.Sqrt(float64(p.HeadDim)))
			c, err := New(Config{NLayer: 1, NKVHead: p.NKVHead, HeadDim: p.HeadDim, BlockSize: 4, NumBlocks: 64, DType: tc.d})
			if err != nil {
				t.Fatal(err)
			}
			// Interleave two sequences so their blocks are scattered.
			const n = 37
			keys := map[int32][][]float32{}
			vals := map[int32][][]float32{}
			for pos := 0; pos < n; pos++ {
				for _, seq := range []int32{3, 9} {
					if !c.Allocate(seq, nil, pos, pos+1) {
						t.Fatal("allocate")
					}
					k := make([]float32, p.NKVHead*p.HeadDim)
					v := make([]float32, len(k))
					for i := range k {
						k[i] = float32(rng.NormFloat64())
						v[i] = float32(rng.NormFloat64())
					}
					keys[seq] = append(keys[seq], k)
					vals[seq] = append(vals[seq], v)
					storeTok(c, 0, seq, int32(pos), k, v)
				}
			}
			q := make([]float32, p.NHead*p.HeadDim)
			for _, seq := range []int32{3, 9} {
				for _, upto := range []int{1, 5, 16, n} {
					for i := range q {
						q[i] = float32(rng.NormFloat64())
					}
					want := naiveAttend(keys[seq], vals[seq], upto, q, p)
					got := make([]float32, len(q))
					attendTok(c, 0, seq, int32(upto), q, got, p)
					for i := range got {
						if d := math.Abs(float64(got[i] - want[i])); d > tc.tol*(1+math.Abs(float64(want[i]))) {
							t.Fatalf("%v %+v seq %d n %d: out[%d] = %v, want %v", tc.d, p, seq, upto, i, got[i], want[i])
						}
					}
				}
			}
		}
	}
}

// TestRandomWorkloadInvariants drives the cache with random sequences —
// prefix hits, growth, forks, copy-on-write, frees — and checks the pool
// invariants after every operation and that nothing leaks at the end.
func TestRandomWorkloadInvariants(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	c := newTestCache(t, 40, F32, true)
	type seq struct {
		tokens   []int32
		computed int
	}
	live := map[int32]*seq{}
	next := int32(0)
	prefixes := [][]int32{{1, 2, 3, 4, 5, 6, 7, 8}, {9, 9, 9, 9, 1, 1, 1, 1}, {5}}
	steps := 3000
	if testing.Short() {
		steps = 500
	}
	for step := 0; step < steps; step++ {
		switch r := rng.IntN(10); {
		case r < 3: // new sequence, maybe sharing a prefix
			toks := append([]int32(nil), prefixes[rng.IntN(len(prefixes))]...)
			for i := rng.IntN(10); i > 0; i-- {
				toks = append(toks, rng.Int32N(4))
			}
			hit := c.Lookup(toks, 0)
			from := len(hit) * c.BlockSize()
			if !c.Allocate(next, hit, from, len(toks)) {
				continue
			}
			c.Commit(next, toks, len(toks), 0)
			live[next] = &seq{toks, len(toks)}
			next++
		case r < 7: // grow one
			for id, s := range live {
				s.tokens = append(s.tokens, rng.Int32N(4))
				if c.Allocate(id, nil, s.computed, len(s.tokens)) {
					s.computed = len(s.tokens)
					c.Commit(id, s.tokens, s.computed, 0)
				} else {
					s.tokens = s.tokens[:len(s.tokens)-1]
				}
				break
			}
		case r < 8: // fork one
			for id, s := range live {
				if err := c.Fork(id, next); err != nil {
					t.Fatal(err)
				}
				live[next] = &seq{append([]int32(nil), s.tokens...), s.computed}
				next++
				break
			}
		default: // free one
			for id := range live {
				c.Free(id)
				delete(live, id)
				break
			}
		}
		mustCheck(t, c)
	}
	for id := range live {
		c.Free(id)
	}
	mustCheck(t, c)
	u := c.Usage()
	if u.Used != 0 || u.Free != u.Blocks || u.Seqs != 0 {
		t.Fatalf("leak after all sequences ended: %+v", u)
	}
	if c.Pool().Evictions == 0 {
		t.Fatal("workload never evicted; it does not exercise the LRU")
	}
}

func TestSizes(t *testing.T) {
	s, err := LookupShape("Llama-2-7B")
	if err != nil {
		t.Fatal(err)
	}
	// 2 · 32 layers · 32 heads · 128 · 2 bytes = 512 KiB per token.
	if got := KVBytesPerToken(s, F16); got != 512<<10 {
		t.Fatalf("llama-2-7b f16 per token %d", got)
	}
	g, _ := LookupShape("llama-2-70b")
	m, _ := LookupShape("llama-2-70b-mha")
	if KVBytesPerToken(g, F16) != 320<<10 || KVBytesPerToken(m, F16) != 2560<<10 {
		t.Fatalf("70b per token: gqa %d, mha %d", KVBytesPerToken(g, F16), KVBytesPerToken(m, F16))
	}
	// 4096 tokens × 8 sequences of Llama-2-7B in f16: 16 GiB.
	if got, err := Size(s, 8, 4096, F16, 16); err != nil || got != 16<<30 {
		t.Fatalf("size %d, %v", got, err)
	}
	if got, err := Size(s, 1, 17, F32, 16); err != nil || got != 32*(1<<20) {
		t.Fatalf("block rounding: %d, %v", got, err)
	}
	// Absurd batch × length must be an error, not a wrapped negative count.
	for _, c := range [][2]int{{999999999999, 999999999999}, {1, math.MaxInt}, {math.MaxInt, 1}} {
		if got, err := Size(g, c[0], c[1], F16, 16); !errors.Is(err, ErrTooLarge) {
			t.Fatalf("Size(batch %d, len %d) = %d, %v; want ErrTooLarge", c[0], c[1], got, err)
		}
	}
	if _, err := Size(g, -1, 10, F16, 16); err == nil {
		t.Fatal("negative batch accepted")
	}
	if _, err := LookupShape("gpt-17"); err == nil {
		t.Fatal("unknown shape must be an error")
	}
	if _, err := ParseDType("int3"); err == nil {
		t.Fatal("unknown dtype must be an error")
	}
}

func BenchmarkAttend(b *testing.B) {
	for _, d := range []DType{F32, F16} {
		b.Run(d.String(), func(b *testing.B) {
			p := model.AttnParams{NHead: 32, NKVHead: 8, HeadDim: 128, Scale: 0.088}
			c, err := New(Config{NLayer: 1, NKVHead: 8, HeadDim: 128, NumBlocks: 64, DType: d})
			if err != nil {
				b.Fatal(err)
			}
			const n = 1024
			c.Allocate(0, nil, 0, n)
			k := make([]float32, 8*128)
			for i := range k {
				k[i] = float32(i%7) * 0.1
			}
			for pos := int32(0); pos < n; pos++ {
				storeTok(c, 0, 0, pos, k, k)
			}
			q, out := make([]float32, 32*128), make([]float32, 32*128)
			for i := range q {
				q[i] = 0.01
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				attendTok(c, 0, 0, n, q, out, p)
			}
			b.ReportMetric(float64(b.N)*n/b.Elapsed().Seconds(), "pos/s")
		})
	}
}

func TestTruncate(t *testing.T) {
	c, err := New(Config{NLayer: 1, NKVHead: 1, HeadDim: 2, BlockSize: 4, NumBlocks: 8, PrefixCache: true})
	if err != nil {
		t.Fatal(err)
	}
	toks := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	if !c.Allocate(1, nil, 0, 10) {
		t.Fatal("allocate")
	}
	c.Commit(1, toks, 6, 0) // registers block 0 only
	if got := c.Pool().NumFree(); got != 5 {
		t.Fatalf("free %d, want 5", got)
	}
	c.Truncate(1, 5) // keep tokens [0,5): two blocks
	if got := len(c.Table(1)); got != 2 {
		t.Fatalf("table has %d blocks after truncate to 5, want 2", got)
	}
	if err := c.Check(); err != nil {
		t.Fatal(err)
	}
	// Regrow with other tokens: the rolled-back block is not hashed with
	// the rejected content.
	toks2 := []int32{1, 2, 3, 4, 5, 60, 70, 80, 9}
	if !c.Allocate(1, nil, 5, 9) {
		t.Fatal("regrow")
	}
	c.Commit(1, toks2, 9, 0)
	if hit := c.Lookup([]int32{1, 2, 3, 4, 5, 6, 7, 8, 0}, 0); len(hit) != 1 {
		t.Fatalf("lookup of rejected continuation hit %d blocks, want 1", len(hit))
	}
	if hit := c.Lookup(append(toks2[:8:8], 0), 0); len(hit) != 2 {
		t.Fatalf("lookup of accepted continuation hit %d blocks, want 2", len(hit))
	}
	c.Truncate(1, 0)
	c.Free(1)
	if err := c.Check(); err != nil {
		t.Fatal(err)
	}
	if got := c.Pool().NumFree(); got != 8 {
		t.Fatalf("free %d after free, want 8", got)
	}
}

func TestTruncateInsideRegisteredBlock(t *testing.T) {
	c, err := New(Config{NLayer: 1, NKVHead: 1, HeadDim: 2, BlockSize: 4, NumBlocks: 4, PrefixCache: true})
	if err != nil {
		t.Fatal(err)
	}
	toks := []int32{1, 2, 3, 4, 5, 6, 7, 8}
	c.Allocate(1, nil, 0, 8)
	c.Commit(1, toks, 8, 0)
	c.Truncate(1, 6) // block 1 keeps 2 tokens and will be rewritten
	if hit := c.Lookup(append(toks[:8:8], 9), 0); len(hit) != 1 {
		t.Fatalf("lookup hit %d blocks after rollback into block 1, want 1", len(hit))
	}
	if err := c.Check(); err != nil {
		t.Fatal(err)
	}
}
