package kvcache

import (
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

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

// timedKV measures the time a forward pass spends in Attend (a decode of
// one sequence attends from the calling goroutine, one layer at a time).
type timedKV struct {
	*Cache
	attn time.Duration
}

func (t *timedKV) Attend(layer, lo, hi int, q, out []float32, p model.AttnParams) {
	s := time.Now()
	t.Cache.Attend(layer, lo, hi, q, out, p)
	t.attn += time.Since(s)
}

// BenchmarkQuestModelDecode decodes on a real model file (PAGODA_BENCH_MODEL,
// e.g. `pagoda synth -preset tinyllama-1.1b -type Q4_0`) at depth 4096:
// the cache is filled with random K/V for 4096 positions (attention costs
// the same whatever they hold), then tokens are decoded one at a time,
// dense against Quest, reporting tok/s and the share of the step spent in
// attention.
func BenchmarkQuestModelDecode(b *testing.B) {
	path := os.Getenv("PAGODA_BENCH_MODEL")
	if path == "" {
		b.Skip("set PAGODA_BENCH_MODEL to a GGUF")
	}
	depth := 4096
	if s := os.Getenv("PAGODA_BENCH_DEPTH"); s != "" {
		depth, _ = strconv.Atoi(s)
	}
	m, err := model.Open(path, model.Options{Threads: runtime.GOMAXPROCS(0), ContextLen: depth + 1024})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	c := &m.Config
	for _, spec := range []string{"full", "quest:budget=256", "quest:budget=1024"} {
		b.Run(spec, func(b *testing.B) {
			pol, err := ParsePolicy(spec)
			if err != nil {
				b.Fatal(err)
			}
			cache, err := New(Config{NLayer: c.NLayer, NKVHead: c.NKVHead, HeadDim: c.HeadDim, NumBlocks: (depth+b.N+16)/16 + 2, Policy: pol})
			if err != nil {
				b.Fatal(err)
			}
			cache.Allocate(0, nil, 0, depth)
			batch := &model.Batch{Tokens: make([]int32, depth), Pos: make([]int32, depth), Seq: make([]int32, depth)}
			for i := range batch.Pos {
				batch.Pos[i] = int32(i)
			}
			if err := cache.Begin(batch); err != nil {
				b.Fatal(err)
			}
			r := rand.New(rand.NewPCG(1, 1))
			k, v := make([]float32, c.NKVHead*c.HeadDim), make([]float32, c.NKVHead*c.HeadDim)
			for l := 0; l < c.NLayer; l++ {
				for pos := 0; pos < depth; pos++ {
					for i := range k {
						k[i], v[i] = float32(r.NormFloat64()), float32(r.NormFloat64())
					}
					cache.Store(l, pos, k, v)
				}
			}
			cache.Commit(0, nil, depth, 0)
			kv := &timedKV{Cache: cache}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				pos := depth + i
				cache.Allocate(0, nil, pos, pos+1)
				if _, err := m.Forward(&model.Batch{Tokens: []int32{1}, Pos: []int32{int32(pos)}, Seq: []int32{0}}, kv); err != nil {
					b.Fatal(err)
				}
				cache.Commit(0, nil, pos+1, 0)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tok/s")
			b.ReportMetric(100*kv.attn.Seconds()/b.Elapsed().Seconds(), "%attn")
		})
	}
}
