package kvcache

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"pagoda/model"
)

// TestAttendHeadsSplit: attending the KV heads in separate calls gives the
// same output, bit for bit, as one Attend over all of them, for a decode
// query and a prefill chunk, at several depths, formats and GQA shapes.
func TestAttendHeadsSplit(t *testing.T) {
	shapes := []model.AttnParams{
		{NHead: 32, NKVHead: 4, HeadDim: 64, Scale: 0.125},
		{NHead: 14, NKVHead: 2, HeadDim: 64, Scale: 0.125},
		{NHead: 4, NKVHead: 4, HeadDim: 32, Scale: 0.17},
	}
	depths := []int{1, 37, 300}
	if !testing.Short() {
		depths = append(depths, 2100)
	}
	for _, p := range shapes {
		for _, f := range []Format{F32, F16, Q8_0, Q4_0} {
			for _, d := range depths {
				t.Run(fmt.Sprintf("%dx%d/%s/%d", p.NHead, p.NKVHead, f, d), func(t *testing.T) { checkHeadSplit(t, p, f, d) })
			}
		}
	}
}

func checkHeadSplit(t *testing.T, p model.AttnParams, f Format, ctx int) {
	bs := FormatBlockSize(f)
	c, err := New(Config{NLayer: 1, NKVHead: p.NKVHead, HeadDim: p.HeadDim, BlockSize: bs, NumBlocks: ctx/bs + 2, KFormat: f, VFormat: f})
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(uint64(ctx), 3))
	kvd := p.NKVHead * p.HeadDim
	if !c.Allocate(0, nil, 0, ctx) {
		t.Fatal("allocate")
	}
	k, v := make([]float32, kvd), make([]float32, kvd)
	for pos := int32(0); pos < int32(ctx); pos++ {
		for i := range k {
			k[i], v[i] = float32(r.NormFloat64()), float32(r.NormFloat64())
		}
		storeTok(c, 0, 0, pos, k, v)
	}
	n := min(ctx, 5) // the last n positions attend, as one chunk
	qd := p.NHead * p.HeadDim
	q := make([]float32, n*qd)
	for i := range q {
		q[i] = float32(r.NormFloat64())
	}
	b := &model.Batch{Tokens: make([]int32, n), Pos: make([]int32, n), Seq: make([]int32, n)}
	for i := range b.Pos {
		b.Pos[i] = int32(ctx - n + i)
	}
	if err := c.Begin(b); err != nil {
		t.Fatal(err)
	}
	if !c.HeadParallel(0, 0) {
		t.Fatal("the default policy should allow head-parallel attention")
	}
	for _, rows := range [][2]int{{n - 1, n}, {0, n}} {
		want := slices.Repeat([]float32{7}, (rows[1]-rows[0])*qd)
		c.Attend(0, rows[0], rows[1], q[rows[0]*qd:rows[1]*qd], want, p)
		got := slices.Repeat([]float32{-7}, len(want))
		for kh := p.NKVHead - 1; kh >= 0; kh-- {
			c.AttendHeads(0, rows[0], rows[1], kh, kh+1, q[rows[0]*qd:rows[1]*qd], got, p)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("rows %v: heads one by one differ from Attend", rows)
		}
	}
}

// TestHeadParallelPolicies: a policy that observes scores or selects pages
// keeps per-sequence state the heads of a layer would update at once, so
// the cache refuses the head split under it.
func TestHeadParallelPolicies(t *testing.T) {
	c, err := New(Config{NLayer: 1, NKVHead: 2, HeadDim: 32, BlockSize: 16, NumBlocks: 8, DType: F32, Policy: NewH2O(0.25, 0.25)})
	if err != nil {
		t.Fatal(err)
	}
	if !c.Allocate(0, nil, 0, 1) {
		t.Fatal("allocate")
	}
	if err := c.Begin(&model.Batch{Tokens: []int32{1}, Pos: []int32{0}, Seq: []int32{0}}); err != nil {
		t.Fatal(err)
	}
	if c.HeadParallel(0, 0) {
		t.Fatal("H2O observes scores: HeadParallel should be false")
	}
}
