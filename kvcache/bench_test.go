package kvcache

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"pagoda/model"
)

// TinyLlama's attention shape: 32 query heads over 4 KV heads of 64.
var benchAttn = model.AttnParams{NHead: 32, NKVHead: 4, HeadDim: 64, Scale: 0.125}

// benchCache fills seqs sequences of ctx positions with random K/V.
func benchCache(b *testing.B, seqs, ctx int, f Format) *Cache {
	p := benchAttn
	bs := FormatBlockSize(f)
	c, err := New(Config{NLayer: 1, NKVHead: p.NKVHead, HeadDim: p.HeadDim, BlockSize: bs, NumBlocks: seqs * (ctx/bs + 1), KFormat: f, VFormat: f})
	if err != nil {
		b.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 1))
	k, v := make([]float32, p.NKVHead*p.HeadDim), make([]float32, p.NKVHead*p.HeadDim)
	for s := int32(0); s < int32(seqs); s++ {
		if !c.Allocate(s, nil, 0, ctx) {
			b.Fatal("allocate")
		}
		for pos := int32(0); pos < int32(ctx); pos++ {
			for i := range k {
				k[i], v[i] = float32(r.NormFloat64()), float32(r.NormFloat64())
			}
			storeTok(c, 0, s, pos, k, v)
		}
	}
	return c
}

func benchQ(n int) []float32 {
	r := rand.New(rand.NewPCG(2, 2))
	q := make([]float32, n*benchAttn.NHead*benchAttn.HeadDim)
	for i := range q {
		q[i] = float32(r.NormFloat64())
	}
	return q
}

// BenchmarkAttendDecode is one decode step of 8 sequences at context 512
// (and of 2 at 1k and 4k), one thread: the paged attention alone (Begin
// included), per KV format.
func BenchmarkAttendDecode(b *testing.B) {
	for _, sc := range []struct{ seqs, ctx int }{{8, 512}, {2, 1024}, {2, 4096}} {
		for _, f := range []Format{F16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, DefaultKIVI(4), DefaultKIVI(2)} {
			b.Run(fmt.Sprintf("%s/ctx%d", f, sc.ctx), func(b *testing.B) { benchDecode(b, f, sc.seqs, sc.ctx) })
		}
	}
}

func benchDecode(b *testing.B, f Format, seqs, ctx int) {
	c := benchCache(b, seqs, ctx, f)
	qd := benchAttn.NHead * benchAttn.HeadDim
	q, out := benchQ(seqs), make([]float32, seqs*qd)
	batch := &model.Batch{Tokens: make([]int32, seqs), Pos: make([]int32, seqs), Seq: make([]int32, seqs)}
	for s := range batch.Seq {
		batch.Seq[s], batch.Pos[s] = int32(s), int32(ctx-1)
	}
	b.ResetTimer()
	cpu0 := cpuTime()
	for it := 0; it < b.N; it++ {
		if err := c.Begin(batch); err != nil {
			b.Fatal(err)
		}
		for s := 0; s < seqs; s++ {
			c.Attend(0, s, s+1, q[s*qd:(s+1)*qd], out[s*qd:(s+1)*qd], benchAttn)
		}
	}
	b.ReportMetric(float64(b.N*seqs*ctx)/b.Elapsed().Seconds(), "pos/s")
	// On a shared machine the wall time counts other processes' slices;
	// the process's CPU time is what the kernels cost.
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
}

// BenchmarkAttendPrefill is the causal attention of one 512-token prefill
// chunk, one thread, in the model's pieces of 16 queries.
func BenchmarkAttendPrefill(b *testing.B) {
	const ctx, piece = 512, 16
	c := benchCache(b, 1, ctx, F16)
	qd := benchAttn.NHead * benchAttn.HeadDim
	q, out := benchQ(ctx), make([]float32, ctx*qd)
	batch := &model.Batch{Tokens: make([]int32, ctx), Pos: make([]int32, ctx), Seq: make([]int32, ctx)}
	for i := range batch.Pos {
		batch.Pos[i] = int32(i)
	}
	b.ResetTimer()
	for it := 0; it < b.N; it++ {
		if err := c.Begin(batch); err != nil {
			b.Fatal(err)
		}
		for lo := 0; lo < ctx; lo += piece {
			c.Attend(0, lo, lo+piece, q[lo*qd:(lo+piece)*qd], out[lo*qd:(lo+piece)*qd], benchAttn)
		}
	}
	b.ReportMetric(float64(b.N)*ctx*(ctx+1)/2/b.Elapsed().Seconds(), "pos/s")
}

// BenchmarkPrefixCycle is the prefix cache's bookkeeping alone (a
// one-float cache, so no K/V work): each op admits one request of 128
// prompt tokens from 16 prompts that share their first two blocks,
// looks it up, prefills it, decodes 32 tokens one Commit at a time and
// frees it, in a pool too small for every prompt, so hits and evictions
// both happen.
func BenchmarkPrefixCycle(b *testing.B) {
	benchPrefixCycle(b, Config{})
}

// BenchmarkPrefixCycleEvents is BenchmarkPrefixCycle recording KV events
// that nobody reads, flushed once per request (serve's default ring).
func BenchmarkPrefixCycleEvents(b *testing.B) {
	benchPrefixCycle(b, Config{Events: NewEventLog(DefaultEventBatches)})
}

func benchPrefixCycle(b *testing.B, base Config) {
	const bs, prompt, decode = 16, 128, 32
	cfg := base
	cfg.NLayer, cfg.NKVHead, cfg.HeadDim, cfg.BlockSize, cfg.NumBlocks, cfg.DType, cfg.PrefixCache = 1, 1, 1, bs, 48, F32, true
	c, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	prompts := make([][]int32, 16)
	for i := range prompts {
		p := make([]int32, prompt, prompt+decode)
		for j := range p {
			p[j] = int32(j)
			if j >= 2*bs {
				p[j] = int32(1000*i + j)
			}
		}
		prompts[i] = p
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		seq := int32(i)
		toks := prompts[i%len(prompts)][:prompt]
		hit := c.LookupSeq(seq, toks, 0)
		if !c.Allocate(seq, hit, len(hit)*bs, prompt) {
			b.Fatal("allocate")
		}
		c.Commit(seq, toks, prompt, 0)
		for j := 0; j < decode; j++ {
			toks = append(toks, int32(7*j+1))
			if !c.Allocate(seq, nil, len(toks)-1, len(toks)) {
				b.Fatal("allocate")
			}
			c.Commit(seq, toks, len(toks), 0)
		}
		c.Free(seq)
		if cfg.Events != nil {
			cfg.Events.Flush()
		}
	}
}

// BenchmarkAttendDepth is one decode query of one sequence deep in its
// context, one thread, with TinyLlama's shape: the kernel work a decode
// step does per layer at depth (scores, softmax, mix over every page).
func BenchmarkAttendDepth(b *testing.B) {
	for _, ctx := range []int{4096, 16384} {
		for _, f := range []Format{F16, Q8_0, Q4_0} {
			b.Run(fmt.Sprintf("%s/ctx%d", f, ctx), func(b *testing.B) { benchDecode(b, f, 1, ctx) })
		}
	}
}

// BenchmarkAttendPrefillDepth is the attention of the last 256 prompt
// positions of a ctx-token prompt, one thread, in the model's pieces of 16
// queries: the work that dominates a long prompt's prefill.
func BenchmarkAttendPrefillDepth(b *testing.B) {
	for _, ctx := range []int{4096, 16384} {
		for _, f := range []Format{F16, F32, Q8_0} {
			b.Run(fmt.Sprintf("%s/ctx%d", f, ctx), func(b *testing.B) { benchPrefillDepth(b, f, ctx, 256, 16) })
		}
	}
}

func benchPrefillDepth(b *testing.B, f Format, ctx, rows, piece int) {
	c := benchCache(b, 1, ctx, f)
	qd := benchAttn.NHead * benchAttn.HeadDim
	q, out := benchQ(rows), make([]float32, rows*qd)
	batch := &model.Batch{Tokens: make([]int32, rows), Pos: make([]int32, rows), Seq: make([]int32, rows)}
	for i := range batch.Pos {
		batch.Pos[i] = int32(ctx - rows + i)
	}
	b.ResetTimer()
	cpu0 := cpuTime()
	for it := 0; it < b.N; it++ {
		if err := c.Begin(batch); err != nil {
			b.Fatal(err)
		}
		for lo := 0; lo < rows; lo += piece {
			c.Attend(0, lo, lo+piece, q[lo*qd:(lo+piece)*qd], out[lo*qd:(lo+piece)*qd], benchAttn)
		}
	}
	flop := 4.0 * float64(benchAttn.NHead*benchAttn.HeadDim) * float64(rows) * float64(ctx-rows/2)
	ns := float64(cpuTime()-cpu0) / float64(b.N)
	b.ReportMetric(ns, "cpu-ns/op")
	b.ReportMetric(flop/ns, "GFLOP/s")
}

// BenchmarkAttendDepthLayers is one decode query at depth 16k through 8
// layers in turn (134 MB of f16 K/V, far beyond the caches), one thread:
// what a decode step reads at depth, from memory rather than from a
// cache that one repeated layer stays in.
func BenchmarkAttendDepthLayers(b *testing.B) {
	const layers, ctx = 8, 16384
	p := benchAttn
	for _, f := range []Format{F16, Q8_0} {
		b.Run(f.String(), func(b *testing.B) {
			c, err := New(Config{NLayer: layers, NKVHead: p.NKVHead, HeadDim: p.HeadDim, BlockSize: 16, NumBlocks: ctx/16 + 1, KFormat: f, VFormat: f})
			if err != nil {
				b.Fatal(err)
			}
			r := rand.New(rand.NewPCG(1, 1))
			k, v := make([]float32, p.NKVHead*p.HeadDim), make([]float32, p.NKVHead*p.HeadDim)
			if !c.Allocate(0, nil, 0, ctx) {
				b.Fatal("allocate")
			}
			for i := range k {
				k[i], v[i] = float32(r.NormFloat64()), float32(r.NormFloat64())
			}
			for pos := int32(0); pos < ctx; pos++ {
				oneRow(c, 0, pos)
				for l := 0; l < layers; l++ {
					k[int(pos)%len(k)] = float32(r.NormFloat64())
					c.Store(l, 0, k, v)
				}
			}
			qd := p.NHead * p.HeadDim
			q, out := benchQ(1), make([]float32, qd)
			batch := &model.Batch{Tokens: []int32{0}, Pos: []int32{ctx - 1}, Seq: []int32{0}}
			b.ResetTimer()
			cpu0 := cpuTime()
			for it := 0; it < b.N; it++ {
				if err := c.Begin(batch); err != nil {
					b.Fatal(err)
				}
				for l := 0; l < layers; l++ {
					c.Attend(l, 0, 1, q, out, p)
				}
			}
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N*layers), "cpu-ns/layer")
		})
	}
}
