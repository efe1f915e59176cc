package kvcache

import (
	"math"
	"math/rand/v2"
	"testing"

	"pagoda/model"
)

// fillSeq stores n random K/V rows of seq into c through the step path.
func fillSeq(t *testing.T, c *Cache, seq int32, n int, rng *rand.Rand) {
	t.Helper()
	if !c.Allocate(seq, nil, 0, n) {
		t.Fatal("no room")
	}
	b := &model.Batch{Tokens: make([]int32, n), Pos: make([]int32, n), Seq: make([]int32, n)}
	for i := range n {
		b.Pos[i], b.Seq[i] = int32(i), seq
	}
	if err := c.Begin(b); err != nil {
		t.Fatal(err)
	}
	row := make([]float32, c.cfg.NKVHead*c.cfg.HeadDim)
	for l := range c.cfg.NLayer {
		for i := range n {
			for j := range row {
				row[j] = float32(rng.NormFloat64())
			}
			c.Store(l, i, row, row)
		}
	}
}

// attendLast is the attention of one random query at the last position
// of seq, every layer, concatenated.
func attendLast(t *testing.T, c *Cache, seq int32, n int, q []float32) []float32 {
	t.Helper()
	b := &model.Batch{Tokens: []int32{0}, Pos: []int32{int32(n - 1)}, Seq: []int32{seq}}
	if err := c.Begin(b); err != nil {
		t.Fatal(err)
	}
	p := model.AttnParams{NHead: 2 * c.cfg.NKVHead, NKVHead: c.cfg.NKVHead, HeadDim: c.cfg.HeadDim, Scale: 0.3}
	var all []float32
	for l := range c.cfg.NLayer {
		out := make([]float32, p.NHead*p.HeadDim)
		c.Attend(l, 0, 1, q, out, p)
		all = append(all, out...)
	}
	return all
}

// TestExportImport moves a sequence's blocks from one storage to another
// whose block table differs, and attention there reads the same bits.
func TestExportImport(t *testing.T) {
	for _, f := range []Format{F32, F16, BF16, Q8_0, Q4_0} {
		t.Run(f.String(), func(t *testing.T) {
			cfg := Config{NLayer: 2, NKVHead: 2, HeadDim: 32, BlockSize: 8, NumBlocks: 16, DType: F32, KFormat: f, VFormat: f}
			src, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			dst, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			const n = 21
			fillSeq(t, src, 4, n, rng)
			// The destination's pool is in another state: its table for
			// the sequence names other pages.
			if !dst.Allocate(9, nil, 0, 17) || !dst.Allocate(4, nil, 0, n) {
				t.Fatal("no room")
			}
			dst.Free(9)
			if src.Table(4)[0] == dst.Table(4)[0] {
				t.Fatalf("both tables start at page %d: the test shows nothing", src.Table(4)[0])
			}
			data, err := src.ExportPages(nil, src.Table(4))
			if err != nil {
				t.Fatal(err)
			}
			if err := dst.ImportPages(dst.Table(4)[:1], data); err == nil {
				t.Fatal("an import into fewer pages than exported succeeded")
			}
			if err := dst.ImportPages(dst.Table(4), data); err != nil {
				t.Fatal(err)
			}
			q := make([]float32, 4*32)
			for i := range q {
				q[i] = float32(rng.NormFloat64())
			}
			want, got := attendLast(t, src, 4, n, q), attendLast(t, dst, 4, n, q)
			for i := range want {
				if math.Float32bits(want[i]) != math.Float32bits(got[i]) {
					t.Fatalf("output %d: %v after import, %v before", i, got[i], want[i])
				}
			}
			again, err := dst.ExportPages(nil, dst.Table(4))
			if err != nil || string(again) != string(data) {
				t.Fatalf("re-export differs (%v)", err)
			}
			mustCheck(t, src)
			mustCheck(t, dst)
		})
	}
}
