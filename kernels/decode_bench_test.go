package kernels

import (
	"math/rand/v2"
	"testing"

	"pagoda/quant"
)

// BenchmarkDecodeLayers times one batch-1 pass over TinyLlama-shaped (22
// layers) and Qwen2.5-0.5B-shaped (24 narrow layers, whose short products
// show per-product costs most) Q4_0 layers in model order (Q/K/V and gate/up through MatMulN), so that
// per-product costs (prefetch ramp-up at each thread's range start, threads
// waiting at the end of each product, TLB misses over ~500 MB of weights)
// show up as they do in decode, which a single product hides. GB/s is
// weight bytes streamed per second.
//
//	go test -run - -bench DecodeLayers -count 6 ./kernels
func BenchmarkDecodeLayers(b *testing.B) {
	if testing.Short() {
		b.Skip("builds ~500 MB of weights")
	}
	for _, s := range []struct {
		name                string
		layers, dim, kv, ff int
	}{{"tinyllama", 22, 2048, 256, 5632}, {"qwen", 24, 896, 128, 4864}} {
		b.Run(s.name, func(b *testing.B) { decodeLayers(b, s.layers, s.dim, s.kv, s.ff) })
	}
}

func decodeLayers(b *testing.B, layers, dim, kv, ff int) {
	pool := NewPool(0)
	defer pool.Close()
	r := rand.New(rand.NewPCG(1, 1))
	rowCache := map[int][]byte{}
	mat := func(rows, cols int) *Matrix {
		row, ok := rowCache[cols]
		if !ok {
			row, _ = quant.Quantize(quant.Q4_0, randF32(r, cols))
			rowCache[cols] = row
		}
		data := make([]byte, rows*len(row))
		for i := 0; i < rows; i++ {
			copy(data[i*len(row):], row)
		}
		m, err := NewMatrix(quant.Q4_0, rows, cols, data)
		if err != nil {
			b.Fatal(err)
		}
		Prepack(pool, m)
		m.Data = nil // only the packed copy is read; halve the footprint
		return m
	}
	type layer struct{ q, k, v, o, gate, up, down *Matrix }
	ls := make([]layer, layers)
	var bytes int64
	for i := range ls {
		l := layer{mat(dim, dim), mat(kv, dim), mat(kv, dim), mat(dim, dim), mat(ff, dim), mat(ff, dim), mat(dim, ff)}
		for _, m := range []*Matrix{l.q, l.k, l.v, l.o, l.gate, l.up, l.down} {
			bytes += int64(m.Rows * m.RowBytes)
		}
		ls[i] = l
	}
	x, h := randF32(r, dim), randF32(r, ff)
	q, k, v, o := make([]float32, dim), make([]float32, kv), make([]float32, kv), make([]float32, dim)
	g, u, d := make([]float32, ff), make([]float32, ff), make([]float32, dim)
	ws3, outs3 := make([]*Matrix, 3), [][]float32{q, k, v}
	ws2, outs2 := make([]*Matrix, 2), [][]float32{g, u}
	pass := func() {
		for i := range ls {
			l := &ls[i]
			ws3[0], ws3[1], ws3[2] = l.q, l.k, l.v
			MatMulN(pool, ws3, x, outs3, 1)
			MatMul(pool, l.o, x, o, 1)
			ws2[0], ws2[1] = l.gate, l.up
			MatMulN(pool, ws2, x, outs2, 1)
			MatMul(pool, l.down, h, d, 1)
		}
	}
	pass()
	b.SetBytes(bytes)
	b.ResetTimer()
	cpu0 := processCPU()
	for b.Loop() {
		pass()
	}
	// CPU time per pool thread discounts time the OS gave to other
	// processes on a shared machine.
	if cpu := (processCPU() - cpu0).Seconds() / float64(b.N) / float64(pool.Threads()); cpu > 0 {
		b.ReportMetric(float64(bytes)/cpu/1e9, "GB/s-cpu")
	}
}
