package kvcache

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"pagoda/model"
)

// BenchmarkQuestDecode is one decode query's attention in one layer of
// TinyLlama's shape (32 heads over 4 KV heads of 64, f16 pages) at long
// context, dense against Quest at two budgets, one thread, Begin
// included: what Quest saves is the pages it does not read.
func BenchmarkQuestDecode(b *testing.B) {
	for _, ctx := range []int{4096, 8192} {
		for _, budget := range []int{0, 512, 1024} {
			name := fmt.Sprintf("ctx%d/dense", ctx)
			var pol Policy
			if budget > 0 {
				name, pol = fmt.Sprintf("ctx%d/quest%d", ctx, budget), NewQuest(budget, 0)
			}
			b.Run(name, func(b *testing.B) { benchQuest(b, ctx, pol) })
		}
	}
}

func benchQuest(b *testing.B, ctx int, pol Policy) {
	p := benchAttn
	c, err := New(Config{NLayer: 1, NKVHead: p.NKVHead, HeadDim: p.HeadDim, NumBlocks: ctx/DefaultBlockSize + 1, Policy: pol})
	if err != nil {
		b.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 1))
	kvd := p.NKVHead * p.HeadDim
	if !c.Allocate(0, nil, 0, ctx) {
		b.Fatal("allocate")
	}
	batch := &model.Batch{Tokens: make([]int32, ctx), Pos: make([]int32, ctx), Seq: make([]int32, ctx)}
	for i := range batch.Pos {
		batch.Pos[i] = int32(i)
	}
	if err := c.Begin(batch); err != nil {
		b.Fatal(err)
	}
	k, v := make([]float32, kvd), make([]float32, kvd)
	for pos := 0; pos < ctx; pos++ {
		for i := range k {
			k[i], v[i] = float32(r.NormFloat64()), float32(r.NormFloat64())
		}
		c.Store(0, pos, k, v)
	}
	c.Commit(0, nil, ctx-1, 0) // the bounds of every full block before the last token
	qd := p.NHead * p.HeadDim
	q, out := benchQ(1), make([]float32, qd)
	one := &model.Batch{Tokens: []int32{0}, Pos: []int32{int32(ctx - 1)}, Seq: []int32{0}}
	b.ResetTimer()
	for it := 0; it < b.N; it++ {
		if err := c.Begin(one); err != nil {
			b.Fatal(err)
		}
		c.Attend(0, 0, 1, q[:qd], out, p)
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/query")
}
