package kvcache

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"

	"pagoda/kernels"
	"pagoda/model"
)

// refAttend is attention in float64 over exactly the given positions, with
// K rows of kd and V rows of vd per KV head.
func refAttend(keys, vals [][]float32, positions []int, q []float32, nh, nkv, kd, vd int, scale float32) []float32 {
	out := make([]float32, nh*vd)
	group := nh / nkv
	for h := 0; h < nh; h++ {
		kh := h / group
		s := make([]float64, len(positions))
		m := math.Inf(-1)
		for i, t := range positions {
			var d float64
			for j := 0; j < kd; j++ {
				d += float64(q[h*kd+j]) * float64(keys[t][kh*kd+j])
			}
			s[i] = d * float64(scale)
			m = math.Max(m, s[i])
		}
		var z float64
		for i := range s {
			s[i] = math.Exp(s[i] - m)
			z += s[i]
		}
		for i, t := range positions {
			for j := 0; j < vd; j++ {
				out[h*vd+j] += float32(s[i] / z * float64(vals[t][kh*vd+j]))
			}
		}
	}
	return out
}

func randRow(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

func closeTo(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	for i := range want {
		if d := math.Abs(float64(got[i] - want[i])); d > tol*(1+math.Abs(float64(want[i]))) || math.IsNaN(float64(got[i])) {
			t.Fatalf("%s: out[%d] = %v, want %v", what, i, got[i], want[i])
		}
	}
}

// int8Format is a toy quantized format: int8 rows with one float32 scale
// per token and head, the scales kept as per-page metadata.
type int8Format struct{}

func (int8Format) String() string                     { return "int8" }
func (int8Format) RowBytes(heads, dim int) int        { return heads * dim }
func (int8Format) PageMetaBytes(tokens, h, _ int) int { return 4 * tokens * h }
func (int8Format) NewPages(n, tokens, heads, dim int, _ *kernels.Ops, mem *PageMem) Pages {
	return &int8Pages{tokens: tokens, heads: heads, dim: dim,
		data: PageArray[int8](mem, n*tokens*heads*dim), scale: PageArray[float32](mem, n*tokens*heads)}
}

type int8Pages struct {
	tokens, heads, dim int
	data               []int8
	scale              []float32
}

// at is the index of head's row of token slot of page, in scale units.
func (p *int8Pages) at(page, slot, head int) int { return (page*p.tokens+slot)*p.heads + head }

func (p *int8Pages) Put(page, slot int, row []float32) {
	for h := 0; h < p.heads; h++ {
		x := row[h*p.dim : (h+1)*p.dim]
		var m float64
		for _, v := range x {
			m = math.Max(m, math.Abs(float64(v)))
		}
		i := p.at(page, slot, h)
		p.scale[i] = float32(m / 127)
		for j, v := range x {
			if m > 0 {
				p.data[i*p.dim+j] = int8(math.Round(float64(v) / m * 127))
			}
		}
	}
}

func (p *int8Pages) Scores(s []float32, ss int, q []float32, page, head, from, to int) {
	for j := 0; j*p.dim < len(q); j++ {
		for t := from; t < to; t++ {
			i := p.at(page, t, head)
			var d float32
			for e, v := range p.data[i*p.dim : (i+1)*p.dim] {
				d += q[j*p.dim+e] * float32(v)
			}
			s[j*ss+t-from] = d * p.scale[i]
		}
	}
}

func (p *int8Pages) Mix(out, w []float32, ws int, page, head, from, to int) {
	for j := 0; j*p.dim < len(out); j++ {
		for t := from; t < to; t++ {
			i := p.at(page, t, head)
			a := w[j*ws+t-from] * p.scale[i]
			for e, v := range p.data[i*p.dim : (i+1)*p.dim] {
				out[j*p.dim+e] += a * float32(v)
			}
		}
	}
}

func (p *int8Pages) Get(page, slot int, row []float32) {
	for h := 0; h < p.heads; h++ {
		i := p.at(page, slot, h)
		for e, v := range p.data[i*p.dim : (i+1)*p.dim] {
			row[h*p.dim+e] = float32(v) * p.scale[i]
		}
	}
}

func (p *int8Pages) CopyPage(dst, src int) {
	n := p.tokens * p.heads
	copy(p.scale[dst*n:(dst+1)*n], p.scale[src*n:(src+1)*n])
	copy(p.data[dst*n*p.dim:(dst+1)*n*p.dim], p.data[src*n*p.dim:(src+1)*n*p.dim])
}

// prefill stores tokens [from, to) of seq in one batch and attends from all
// of them in one Attend call per layer, returning each row's output.
func prefill(t *testing.T, c *Cache, layers []int, seq int32, from, to int, keys, vals, qs [][]float32, p model.AttnParams, od int) [][]float32 {
	t.Helper()
	b := &model.Batch{}
	for pos := from; pos < to; pos++ {
		b.Tokens, b.Pos, b.Seq = append(b.Tokens, 0), append(b.Pos, int32(pos)), append(b.Seq, seq)
	}
	if err := c.Begin(b); err != nil {
		t.Fatal(err)
	}
	n, qd := to-from, p.NHead*p.HeadDim
	out := make([][]float32, n)
	for _, l := range layers {
		for i := 0; i < n; i++ {
			c.Store(l, i, keys[from+i], vals[from+i])
		}
		q, o := make([]float32, 0, n*qd), make([]float32, n*p.NHead*od)
		for i := 0; i < n; i++ {
			q = append(q, qs[from+i]...)
		}
		c.Attend(l, 0, n, q, o, p)
		for i := range out {
			out[i] = o[i*p.NHead*od : (i+1)*p.NHead*od]
		}
	}
	return out
}

// TestQuantizedFormatThroughSeam: a format the package does not know,
// with per-page metadata, stores and attends through the cache, within
// int8 rounding of float64 attention.
func TestQuantizedFormatThroughSeam(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	p := model.AttnParams{NHead: 8, NKVHead: 2, HeadDim: 16, Scale: 0.25}
	g := GroupSpec{Layers: []int{0}, NKVHead: 2, KDim: 16, VDim: 16, KFormat: int8Format{}, VFormat: int8Format{}}
	cfg := Config{BlockSize: 4, NumBlocks: 16, Groups: []GroupSpec{g}}
	if got, want := cfg.BlockBytes(), int64(2*(4*2*16+4*4*2)); got != want {
		t.Fatalf("block bytes %d, want %d", got, want)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	const n = 23
	var keys, vals, qs [][]float32
	for i := 0; i < n; i++ {
		keys, vals, qs = append(keys, randRow(r, 32)), append(vals, randRow(r, 32)), append(qs, randRow(r, 128))
	}
	c.Allocate(1, nil, 0, n)
	got := prefill(t, c, []int{0}, 1, 0, n, keys, vals, qs, p, 16)
	for i := 0; i < n; i++ {
		var pos []int
		for j := 0; j <= i; j++ {
			pos = append(pos, j)
		}
		closeTo(t, "int8", got[i], refAttend(keys, vals, pos, qs[i], 8, 2, 16, 16, p.Scale), 3e-2)
	}
}

// TestChunkEqualsRows: attending a chunk of queries in one call gives
// bit for bit what attending each query alone does (batch invariance).
func TestChunkEqualsRows(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	for _, w := range []int{0, 7} {
		p := model.AttnParams{NHead: 4, NKVHead: 2, HeadDim: 8, Scale: 0.3, Window: w}
		c, err := New(Config{NLayer: 1, NKVHead: 2, HeadDim: 8, BlockSize: 4, NumBlocks: 32, DType: F16})
		if err != nil {
			t.Fatal(err)
		}
		const n = 29
		var keys, vals, qs [][]float32
		for i := 0; i < n; i++ {
			keys, vals, qs = append(keys, randRow(r, 16)), append(vals, randRow(r, 16)), append(qs, randRow(r, 32))
		}
		c.Allocate(0, nil, 0, n)
		whole := prefill(t, c, []int{0}, 0, 0, n, keys, vals, qs, p, 8)
		for i := 0; i < n; i++ {
			one := make([]float32, 32)
			attendTok(c, 0, 0, int32(i+1), qs[i], one, p)
			for j := range one {
				if one[j] != whole[i][j] {
					t.Fatalf("window %d row %d: chunk %v, alone %v", w, i, whole[i], one)
				}
			}
		}
	}
}

// sinkPolicy keeps the first block as attention sinks plus the last W
// positions (StreamingLLM), and releases the blocks between.
type sinkPolicy struct{ bs, W int }

func (s sinkPolicy) Visible(_ int32, pos int, dst []Span) []Span {
	lo := max(s.bs, pos+1-s.W)
	dst = append(dst, Span{0, min(s.bs, pos+1)})
	if lo <= pos {
		dst = append(dst, Span{lo, pos + 1})
	}
	return dst
}

func (s sinkPolicy) Release(_ int32, next, bs int, dst []Span) []Span {
	if n := (next + 1 - s.W) / bs; next+1-s.W > 0 && n > 1 {
		dst = append(dst, Span{1, n})
	}
	return dst
}

func (s sinkPolicy) MaxBlocks(chunk, bs int) int { return 1 + (s.W+chunk-2)/bs + 2 }
func (sinkPolicy) Lossy() bool                   { return true }

// TestSinkPolicy: with block 0 as sinks and a window of W, attention equals
// attention over exactly those positions, the middle blocks go back to the
// pool while block 0 stays, and the pool invariants hold throughout.
func TestSinkPolicy(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 1))
	const bs, W, n = 4, 6, 41
	p := model.AttnParams{NHead: 2, NKVHead: 1, HeadDim: 8, Scale: 0.35}
	pol := sinkPolicy{bs, W}
	c, err := New(Config{BlockSize: bs, NumBlocks: 12, PrefixCache: true,
		Groups: []GroupSpec{{Layers: []int{0}, NKVHead: 1, KDim: 8, VDim: 8, KFormat: F32, VFormat: F32, Policy: pol}}})
	if err != nil {
		t.Fatal(err)
	}
	var keys, vals, qs [][]float32
	toks := make([]int32, n)
	for i := 0; i < n; i++ {
		keys, vals, qs = append(keys, randRow(r, 8)), append(vals, randRow(r, 8)), append(qs, randRow(r, 16))
		toks[i] = int32(i)
	}
	for from := 0; from < n; {
		to := min(n, from+1+r.IntN(5))
		if !c.Allocate(7, nil, from, to) {
			t.Fatalf("allocate [%d, %d): pool of 12 exhausted", from, to)
		}
		if h := held(c, 7); h > c.MaxSeqBlocks(to-from) {
			t.Fatalf("holds %d blocks, bound %d", h, c.MaxSeqBlocks(to-from))
		}
		got := prefill(t, c, []int{0}, 7, from, to, keys, vals, qs, p, 8)
		for i := from; i < to; i++ {
			var pos []int
			for _, s := range pol.Visible(7, i, nil) {
				for j := s.From; j < s.To; j++ {
					pos = append(pos, j)
				}
			}
			closeTo(t, "sinks", got[i-from], refAttend(keys, vals, pos, qs[i], 2, 1, 8, 8, p.Scale), 1e-5)
		}
		c.Commit(7, toks, to, 0)
		mustCheck(t, c)
		from = to
	}
	tab := c.Table(7)
	if tab[0] == released || tab[1] != released || tab[len(tab)-1] == released {
		t.Fatalf("table %v: want block 0 kept, the middle released, the tail kept", tab)
	}
	if u := c.Usage(); u.Used != held(c, 7) || u.Used > 1+W/bs+2 {
		t.Fatalf("usage %+v with %d blocks held", u, held(c, 7))
	}
	c.Free(7)
	mustCheck(t, c)
	if c.Pool().NumFree() != 12 {
		t.Fatalf("%d of 12 blocks free after Free", c.Pool().NumFree())
	}
}

// massPolicy is full attention that adds up the attention weights it is
// shown, as H2O would per token.
type massPolicy struct {
	FullPolicy
	mu    sync.Mutex
	mass  map[int]float64 // position → weight received
	calls int
}

func (m *massPolicy) ObserveScores(_ int, _ int32, _, _ int, spans []Span, w []float32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls++
	k := 0
	for _, s := range spans {
		for pos := s.From; pos < s.To; pos++ {
			m.mass[pos] += float64(w[k])
			k++
		}
	}
}

// TestScoreObserver: a policy that wants the scores gets every query and
// head's softmax row, aligned with its positions.
func TestScoreObserver(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	pol := &massPolicy{mass: map[int]float64{}}
	p := model.AttnParams{NHead: 4, NKVHead: 2, HeadDim: 4, Scale: 0.5}
	c, err := New(Config{BlockSize: 4, NumBlocks: 8,
		Groups: []GroupSpec{{Layers: []int{0, 1}, NKVHead: 2, KDim: 4, VDim: 4, Policy: pol}}})
	if err != nil {
		t.Fatal(err)
	}
	const n = 10
	var keys, vals, qs [][]float32
	for i := 0; i < n; i++ {
		keys, vals, qs = append(keys, randRow(r, 8)), append(vals, randRow(r, 8)), append(qs, randRow(r, 16))
	}
	c.Allocate(0, nil, 0, n)
	prefill(t, c, []int{0, 1}, 0, 0, n, keys, vals, qs, p, 4)
	if pol.calls != 2*n*4 {
		t.Fatalf("%d observations, want %d (layers × queries × heads)", pol.calls, 2*n*4)
	}
	var total float64
	for _, m := range pol.mass {
		total += m
	}
	if math.Abs(total-2*n*4) > 1e-3 || pol.mass[0] <= pol.mass[n-1] {
		t.Fatalf("total mass %v (want %d); position 0 got %v, the last %v", total, 2*n*4, pol.mass[0], pol.mass[n-1])
	}
}

// TestLayerGroups: two groups in one cache, one with V rows narrower than
// K rows, one with no V at all (MLA's latent serves as K and V).
func TestLayerGroups(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 8))
	c, err := New(Config{BlockSize: 4, NumBlocks: 8, DType: F32, Groups: []GroupSpec{
		{Layers: []int{1}, NKVHead: 2, KDim: 8, VDim: 4},
		{Layers: []int{0}, NKVHead: 1, KDim: 12, VDim: 0},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.Config().BlockBytes(), int64(4*4*(2*8+2*4)+4*4*12); got != want {
		t.Fatalf("block bytes %d, want %d", got, want)
	}
	const n = 9
	c.Allocate(0, nil, 0, n)
	var k1, v1, q1, k0, q0 [][]float32
	for i := 0; i < n; i++ {
		k1, v1, q1 = append(k1, randRow(r, 16)), append(v1, randRow(r, 8)), append(q1, randRow(r, 32))
		k0, q0 = append(k0, randRow(r, 12)), append(q0, randRow(r, 24))
	}
	g1 := prefill(t, c, []int{1}, 0, 0, n, k1, v1, q1, model.AttnParams{NHead: 4, NKVHead: 2, HeadDim: 8, Scale: 0.3}, 4)
	g0 := prefill(t, c, []int{0}, 0, 0, n, k0, k0, q0, model.AttnParams{NHead: 2, NKVHead: 1, HeadDim: 12, Scale: 0.3}, 12)
	for i := 0; i < n; i++ {
		var pos []int
		for j := 0; j <= i; j++ {
			pos = append(pos, j)
		}
		closeTo(t, "K≠V", g1[i], refAttend(k1, v1, pos, q1[i], 4, 2, 8, 4, 0.3), 1e-5)
		closeTo(t, "latent", g0[i], refAttend(k0, k0, pos, q0[i], 2, 1, 12, 12, 0.3), 1e-5)
	}
	if _, err := New(Config{NumBlocks: 4, Groups: []GroupSpec{{Layers: []int{0, 2}, NKVHead: 1, KDim: 4}}}); err == nil {
		t.Fatal("a layer in no group must be an error")
	}
}

// topPages is an oracle Quest: for each query and KV head it reads only the
// k blocks whose keys score highest against the query (the block holding
// the query's own position always among them), choosing before any page
// is read, from keys it was shown.
type topPages struct {
	FullPolicy
	bs, k, kd int
	keys      [][]float32
	selected  atomic.Int64
}

func (p *topPages) Lossy() bool { return true }

func (p *topPages) Select(_ int, _ int32, pos, kh int, q []float32, spans, dst []Span) []Span {
	type cand struct {
		blk   int
		score float32
	}
	var cs []cand
	for _, s := range spans {
		for b := s.From / p.bs; b*p.bs < s.To; b++ {
			best := float32(math.Inf(-1))
			for t := max(s.From, b*p.bs); t < min(s.To, (b+1)*p.bs); t++ {
				k := p.keys[t][kh*p.kd : (kh+1)*p.kd]
				for j := 0; j*p.kd < len(q); j++ {
					var d float32
					for e := range k {
						d += q[j*p.kd+e] * k[e]
					}
					best = max(best, d)
				}
			}
			if b == pos/p.bs {
				best = float32(math.Inf(1))
			}
			if len(cs) == 0 || cs[len(cs)-1].blk != b {
				cs = append(cs, cand{b, best})
			}
		}
	}
	sort.SliceStable(cs, func(i, j int) bool { return cs[i].score > cs[j].score })
	keep := map[int]bool{}
	for _, c := range cs[:min(p.k, len(cs))] {
		keep[c.blk] = true
	}
	p.selected.Add(1)
	for _, s := range spans {
		for b := s.From / p.bs; b*p.bs < s.To; b++ {
			if keep[b] {
				lo, hi := max(s.From, b*p.bs), min(s.To, (b+1)*p.bs)
				if n := len(dst); n > 0 && dst[n-1].To == lo {
					dst[n-1].To = hi
				} else {
					dst = append(dst, Span{lo, hi})
				}
			}
		}
	}
	return dst
}

// TestPageSelector: a policy that picks pages from the query reads, per KV
// head, exactly the positions it picked: each head's output equals
// attention over those positions alone, and the choice differs by head.
func TestPageSelector(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 4))
	const bs, n, kd, group = 4, 37, 8, 2
	p := model.AttnParams{NHead: 2 * group, NKVHead: 2, HeadDim: kd, Scale: 0.4}
	var keys, vals, qs [][]float32
	for i := 0; i < n; i++ {
		keys, vals, qs = append(keys, randRow(r, 2*kd)), append(vals, randRow(r, 2*kd)), append(qs, randRow(r, 2*group*kd))
	}
	pol := &topPages{bs: bs, k: 3, kd: kd, keys: keys}
	c, err := New(Config{BlockSize: bs, NumBlocks: 16,
		Groups: []GroupSpec{{Layers: []int{0}, NKVHead: 2, KDim: kd, VDim: kd, KFormat: F32, VFormat: F32, Policy: pol}}})
	if err != nil {
		t.Fatal(err)
	}
	c.Allocate(3, nil, 0, n)
	got := prefill(t, c, []int{0}, 3, 0, n, keys, vals, qs, p, kd)
	if want := int64(n * p.NKVHead); pol.selected.Load() != want {
		t.Fatalf("Select called %d times, want %d (once per query and KV head)", pol.selected.Load(), want)
	}
	differ := false
	for i := 0; i < n; i++ {
		var picks [2][]int
		for kh := 0; kh < 2; kh++ {
			qh := qs[i][kh*group*kd : (kh+1)*group*kd]
			for _, s := range pol.Select(0, 3, i, kh, qh, []Span{{0, i + 1}}, nil) {
				for j := s.From; j < s.To; j++ {
					picks[kh] = append(picks[kh], j)
				}
			}
			hk, hv := make([][]float32, n), make([][]float32, n)
			for j := range hk {
				hk[j], hv[j] = keys[j][kh*kd:(kh+1)*kd], vals[j][kh*kd:(kh+1)*kd]
			}
			want := refAttend(hk, hv, picks[kh], qh, group, 1, kd, kd, p.Scale)
			closeTo(t, "selected", got[i][kh*group*kd:(kh+1)*group*kd], want, 1e-5)
		}
		differ = differ || fmt.Sprint(picks[0]) != fmt.Sprint(picks[1])
	}
	if !differ {
		t.Fatal("both KV heads read the same positions at every query: the test shows nothing per head")
	}
	c.Free(3)
	mustCheck(t, c)
}

// TestMapKeysRepositions: keys stored with RoPE at position p and rotated
// by d through MapKeys attend exactly as keys stored at p+d (the context
// shift StreamingLLM's llama.cpp mode needs), in f32 and through a
// quantized format's requantization.
func TestMapKeysRepositions(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 2))
	const bs, n, kd, d = 4, 13, 8, 5
	freqs := make([]float32, kd/2)
	for i := range freqs {
		freqs[i] = float32(math.Pow(10000, -2*float64(i)/kd))
	}
	p := model.AttnParams{NHead: 2, NKVHead: 1, HeadDim: kd, Scale: 0.4}
	for _, f := range []Format{F32, int8Format{}} {
		var raw, keys, shifted, vals, qs [][]float32
		for i := 0; i < n; i++ {
			k := randRow(r, kd)
			raw = append(raw, k)
			a, b := append([]float32(nil), k...), append([]float32(nil), k...)
			kernels.RoPERef(a, i, freqs, false)
			kernels.RoPERef(b, i+d, freqs, false)
			keys, shifted = append(keys, a), append(shifted, b)
			vals, qs = append(vals, randRow(r, kd)), append(qs, randRow(r, 2*kd))
		}
		c, err := New(Config{BlockSize: bs, NumBlocks: 8,
			Groups: []GroupSpec{{Layers: []int{0}, NKVHead: 1, KDim: kd, VDim: kd, KFormat: f, VFormat: f}}})
		if err != nil {
			t.Fatal(err)
		}
		c.Allocate(1, nil, 0, n)
		prefill(t, c, []int{0}, 1, 0, n, keys, vals, qs, p, kd)
		calls := 0
		err = c.MapKeys(1, 0, n, func(layer, pos int, k []float32) {
			calls++
			kernels.RoPERef(k, d, freqs, false)
		})
		if err != nil || calls != n {
			t.Fatalf("%v: MapKeys: %v after %d calls, want %d", f, err, calls, n)
		}
		// One more query, at the last position, over the moved keys.
		q := randRow(r, 2*kd)
		out := make([]float32, 2*kd)
		attendTok(c, 0, 1, n, q, out, p)
		all := make([]int, n)
		for i := range all {
			all[i] = i
		}
		tol := 1e-5
		if _, quantized := f.(int8Format); quantized {
			tol = 3e-2
		}
		closeTo(t, f.String(), out, refAttend(shifted, vals, all, q, 2, 1, kd, kd, p.Scale), tol)
		if err := c.MapKeys(1, 0, n+1, func(int, int, []float32) {}); err == nil {
			t.Errorf("%v: MapKeys past the sequence's tokens succeeded", f)
		}
	}
}
