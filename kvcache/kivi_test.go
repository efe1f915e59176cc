package kvcache

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"pagoda/model"
	"pagoda/quant"
)

// kiviRef is the straightforward KIVI of one sequence: every row kept in
// f32, and the cache's contents at length n rebuilt from scratch — the
// groups of G tokens wholly older than the last R quantized (min-max, f16
// scale and minimum, from the f16 rows), the rest rounded to f16.
func kiviRef(f KIVI, rows [][]float32, n, heads, dim int, axis Axis, cg int) [][]float32 {
	half := func(x float32) float32 { return quant.F16ToF32(quant.F32ToF16(x)) }
	L := float32(int(1)<<f.Bits - 1)
	out := make([][]float32, n)
	for t := 0; t < n; t++ {
		out[t] = make([]float32, len(rows[t]))
		for c, v := range rows[t] {
			out[t][c] = half(v)
		}
	}
	deq := func(xs []*float32) {
		mn, mx := float32(math.Inf(1)), float32(math.Inf(-1))
		for _, x := range xs {
			mn, mx = min(mn, *x), max(mx, *x)
		}
		sc, m0 := half((mx-mn)/L), half(mn)
		for _, x := range xs {
			var q float32
			if sc > 0 {
				q = min(max(float32(math.Round(float64((*x-m0)/sc))), 0), L)
			}
			*x = m0 + sc*q
		}
	}
	nq := max(0, n-f.R) / f.G
	for g := 0; g < nq; g++ {
		if axis == PerChannel {
			for c := 0; c < heads*dim; c++ {
				var xs []*float32
				for t := g * f.G; t < (g+1)*f.G; t++ {
					xs = append(xs, &out[t][c])
				}
				deq(xs)
			}
			continue
		}
		for t := g * f.G; t < (g+1)*f.G; t++ {
			for c0 := 0; c0 < heads*dim; c0 += cg {
				var xs []*float32
				for c := c0; c < c0+cg; c++ {
					xs = append(xs, &out[t][c])
				}
				deq(xs)
			}
		}
	}
	return out
}

type kiviCase struct {
	spec        string
	heads, dim  int
	group       int // GQA
	vg          int // value channel group the spec implies
	kAxis, vAxs Axis
}

var kiviCases = []kiviCase{
	{"kivi2:g=4,r=8", 3, 12, 2, 12, PerChannel, PerToken},
	{"kivi4:g=4,r=0,vg=4", 3, 12, 2, 4, PerChannel, PerToken},
	{"kivi2:g=8,r=8,k=token,v=channel", 2, 16, 3, 16, PerToken, PerChannel},
	{"kivi4:g=4,r=4,k=token,v=channel,vg=8", 1, 16, 1, 8, PerToken, PerChannel},
	// Head dims whose code rows are whole 16-byte chunks: the SIMD kernels.
	{"kivi2:g=4,r=4", 2, 64, 2, 64, PerChannel, PerToken},
	{"kivi4:g=4,r=0,v=channel", 1, 64, 4, 64, PerChannel, PerChannel},
}

func newKIVICache(t *testing.T, kc kiviCase, blocks int, prefix bool, window int) (*Cache, KIVI) {
	t.Helper()
	f, err := ParseFormat(kc.spec)
	if err != nil {
		t.Fatal(err)
	}
	k := f.(KIVI)
	c, err := New(Config{NLayer: 1, NKVHead: kc.heads, HeadDim: kc.dim, BlockSize: k.G, NumBlocks: blocks, KFormat: f, VFormat: f, PrefixCache: prefix, Window: window})
	if err != nil {
		t.Fatal(err)
	}
	return c, k
}

// kiviStream stores rows one position at a time into seq from..to and
// checks every step's attention against the reference over the rows
// stored so far (positions lo..n-1 when a window cuts them).
func kiviStream(t *testing.T, c *Cache, f KIVI, kc kiviCase, seq int32, from, to int, keys, vals, qs [][]float32, window int) [][]float32 {
	t.Helper()
	p := model.AttnParams{NHead: kc.heads * kc.group, NKVHead: kc.heads, HeadDim: kc.dim, Scale: 0.3, Window: window}
	var outs [][]float32
	for pos := from; pos < to; pos++ {
		if !c.Allocate(seq, nil, pos, pos+1) {
			t.Fatalf("allocate %d", pos)
		}
		got := prefill(t, c, []int{0}, seq, pos, pos+1, keys, vals, qs, p, kc.dim)[0]
		c.Commit(seq, make([]int32, pos+1), pos+1, 0)
		n := pos + 1
		dk := kiviRef(f, keys, n, kc.heads, kc.dim, kc.kAxis, kc.dim)
		dv := kiviRef(f, vals, n, kc.heads, kc.dim, kc.vAxs, kc.vg)
		var positions []int
		for j := 0; j < n; j++ {
			if window == 0 || j > pos-window {
				positions = append(positions, j)
			}
		}
		closeTo(t, fmt.Sprintf("%s seq %d pos %d", kc.spec, seq, pos), got, refAttend(dk, dv, positions, qs[pos], p.NHead, kc.heads, kc.dim, kc.dim, p.Scale), 2e-5)
		outs = append(outs, got)
	}
	return outs
}

func kiviRows(r *rand.Rand, n, width int) (keys, vals [][]float32) {
	for i := 0; i < n; i++ {
		k := randRow(r, width)
		for c := range k {
			k[c] = k[c]*float32(1+c%3) + float32(c%5) // channels of different spread and offset
		}
		keys, vals = append(keys, k), append(vals, randRow(r, width))
	}
	return keys, vals
}

// TestKIVIReference: decoding token by token, attention over KIVI pages
// (quantized groups read in place, the f16 residual, the pages in between)
// matches float64 attention over the reference's reconstruction, for
// 2 and 4 bits, both axes for K and V, odd heads and GQA groups.
func TestKIVIReference(t *testing.T) {
	for _, kc := range kiviCases {
		r := rand.New(rand.NewPCG(11, 12))
		const n = 29
		c, f := newKIVICache(t, kc, 12, false, 0)
		keys, vals := kiviRows(r, n, kc.heads*kc.dim)
		qs := make([][]float32, n)
		for i := range qs {
			qs[i] = randRow(r, kc.heads*kc.group*kc.dim)
		}
		kiviStream(t, c, f.ForKeys().(KIVI), kc, 1, 0, n, keys, vals, qs, 0)
		// Get reads back what attention used.
		dk := kiviRef(f, keys, n, kc.heads, kc.dim, kc.kAxis, kc.dim)
		row := make([]float32, kc.heads*kc.dim)
		for pos := 0; pos < n; pos++ {
			c.layers[0].k.Get(int(c.Table(1)[pos/f.G]), pos%f.G, row)
			closeTo(t, kc.spec+" Get", row, dk[pos], 1e-6)
		}
		// The residual window's slabs are the only storage beside the pool.
		resid := (n - max(0, n-f.R)/f.G*f.G + f.G - 1) / f.G
		if got, want := c.ExtraBytes(), int64(2*resid*f.G*kc.heads*kc.dim*2); got != want {
			t.Errorf("%s: %d bytes beside the pool, want %d (%d residual pages)", kc.spec, got, want, resid)
		}
	}
}

// TestKIVIForkPrefixPreempt: copy-on-write children, prefix-cache hits and
// recomputation after a preemption each see exactly their own sequence's
// reference, and recomputation reproduces the first run bit for bit.
func TestKIVIForkPrefixPreempt(t *testing.T) {
	kc := kiviCases[0]
	r := rand.New(rand.NewPCG(5, 6))
	c, f := newKIVICache(t, kc, 40, true, 0)
	fk := f.ForKeys().(KIVI)
	const n1, n = 18, 34
	keys, vals := kiviRows(r, n, kc.heads*kc.dim)
	qs := make([][]float32, n)
	for i := range qs {
		qs[i] = randRow(r, kc.heads*kc.group*kc.dim)
	}
	kiviStream(t, c, fk, kc, 1, 0, n1, keys, vals, qs, 0)
	if err := c.Fork(1, 2); err != nil {
		t.Fatal(err)
	}
	keys2, vals2 := kiviRows(r, n, kc.heads*kc.dim)
	copy(keys2, keys[:n1])
	copy(vals2, vals[:n1])
	// Parent and child decode in lockstep, as the engine runs n > 1: a
	// shared page is quantized when the group leaves both windows.
	var first [][]float32
	for pos := n1; pos < n; pos++ {
		first = append(first, kiviStream(t, c, fk, kc, 1, pos, pos+1, keys, vals, qs, 0)...)
		kiviStream(t, c, fk, kc, 2, pos, pos+1, keys2, vals2, qs, 0)
	}
	// Sequence 3 hits sequence 1's full blocks and continues with its rows.
	c.Commit(1, make([]int32, n), n, 0)
	hit := c.Lookup(make([]int32, n), 0)
	if len(hit) == 0 {
		t.Fatal("no prefix hit")
	}
	from := len(hit) * f.G
	if !c.Allocate(3, hit, from, from) {
		t.Fatal("allocate hit")
	}
	keys3, vals3 := kiviRows(r, n+8, kc.heads*kc.dim)
	copy(keys3, keys)
	copy(vals3, vals)
	qs3 := append(append([][]float32(nil), qs...), qs[:8]...)
	kiviStream(t, c, fk, kc, 3, from, n+8, keys3, vals3, qs3, 0)
	// Preempt sequence 1 and recompute it: the same numbers.
	c.Free(1)
	c.Free(3)
	kiviStream(t, c, fk, kc, 4, 0, n1, keys, vals, qs, 0)
	again := kiviStream(t, c, fk, kc, 4, n1, n, keys, vals, qs, 0)
	for i := range first {
		for j := range first[i] {
			if math.Float32bits(first[i][j]) != math.Float32bits(again[i][j]) {
				t.Fatalf("recomputed position %d differs: %v vs %v", n1+i, again[i][j], first[i][j])
			}
		}
	}
	if err := c.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestKIVIWindow: with a sliding window blocks are released and reused by
// the same sequence; attention still matches the reference.
func TestKIVIWindow(t *testing.T) {
	kc := kiviCases[1]
	r := rand.New(rand.NewPCG(9, 9))
	const n, window = 40, 9
	c, f := newKIVICache(t, kc, 5, false, window)
	keys, vals := kiviRows(r, n, kc.heads*kc.dim)
	qs := make([][]float32, n)
	for i := range qs {
		qs[i] = randRow(r, kc.heads*kc.group*kc.dim)
	}
	kiviStream(t, c, f.ForKeys().(KIVI), kc, 1, 0, n, keys, vals, qs, window)
}

// TestKIVIBytes: a token's bytes count codes and scales; per-channel keys
// cost 4 bytes a channel per group, per-token values 4 bytes a group.
func TestKIVIBytes(t *testing.T) {
	cfg := Config{NLayer: 2, NKVHead: 4, HeadDim: 64, BlockSize: 32, NumBlocks: 1, KFormat: DefaultKIVI(2), VFormat: DefaultKIVI(2)}
	// K: 256 channels × 2 bits × 32 tokens + 256×4 scale bytes; V: codes
	// the same + 32 tokens × 4 heads × 4 bytes.
	want := int64(2 * (256*32/4 + 256*4 + 256*32/4 + 32*4*4))
	if got := cfg.BlockBytes(); got != want {
		t.Errorf("kivi2 block %d bytes, want %d", got, want)
	}
	if got := DefaultKIVI(4).ResidualBytes(4, 64); got != (128+31)*256*2 {
		t.Errorf("residual %d bytes", got)
	}
}

func TestKIVIErrors(t *testing.T) {
	for spec, want := range map[string]string{
		"kivi3":         "unknown KIVI",
		"kivi2:r=40":    "not a multiple of the group",
		"kivi2:x=1":     "unknown option",
		"kivi2:k=diag":  "want channel or token",
		"kivi4:g=0":     "whole number",
		"kivi2:vg=3":    "vg=3 does not divide",
		"kivi2:g=8,r=8": "block size must be 8, not 16",
	} {
		f, err := ParseFormat(spec)
		if err == nil {
			_, err = New(Config{NLayer: 1, NKVHead: 2, HeadDim: 16, NumBlocks: 4, KFormat: f, VFormat: f})
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error saying %q", spec, err, want)
		}
	}
	if f, err := ParseFormat("KIVI2:r=0,k=token"); err != nil || f.String() != "kivi2:r=0,k=token" {
		t.Errorf("round trip: %v %v", f, err)
	}
}

// TestSizeOf: bytes a token per format on Llama-2-7B's shape, and the
// 4096-token sequences a 16 GiB budget holds.
func TestSizeOf(t *testing.T) {
	s, _ := LookupShape("llama-2-7b")
	f16 := SizeOf(s, F16, F16, 0)
	if f16.BytesPerToken != 512*1024 || f16.ResidualPerSeq != 0 {
		t.Fatalf("f16: %+v", f16)
	}
	for name, ratio := range map[string]float64{"f32": 2, "q8_0": 8.5 / 16, "q4_0": 4.5 / 16, "q5_1": 6.0 / 16, "iq4_nl": 4.5 / 16,
		// kivi2: 2-bit codes; keys 32 bits of scales a channel per 32 tokens,
		// values 32 bits a token per head of 128: 5.25 bits against 32.
		"kivi2": (2 + 32.0/32 + 2 + 32.0/128) / 32} {
		f, err := ParseFormat(name)
		if err != nil {
			t.Fatal(err)
		}
		fs := SizeOf(s, f, f, 0)
		if fs.Err != nil || math.Abs(fs.BytesPerToken-f16.BytesPerToken*ratio) > 1e-6 {
			t.Errorf("%s: %g bytes a token (%v), want %g", name, fs.BytesPerToken, fs.Err, f16.BytesPerToken*ratio)
		}
	}
	k2 := SizeOf(s, DefaultKIVI(2), DefaultKIVI(2), 0)
	if want := int64(32 * 2 * (128 + 31) * 32 * 128 * 2); k2.ResidualPerSeq != want {
		t.Errorf("kivi2 residual %d, want %d", k2.ResidualPerSeq, want)
	}
	n16, _ := f16.SeqsThatFit(16<<30, 4096)
	n2, _ := k2.SeqsThatFit(16<<30, 4096)
	if n16 != 8 || n2 < 4*n16 {
		t.Errorf("4096-token sequences in 16 GiB: f16 %d, kivi2 %d", n16, n2)
	}
	st, _ := LookupShape("stories260k")
	if fs := SizeOf(st, Q8_0, Q8_0, 0); fs.Err == nil {
		t.Error("q8_0 on head dim 8 sized without error")
	}
}
