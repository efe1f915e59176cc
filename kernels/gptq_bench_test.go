package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"pagoda/quant"
)

// BenchmarkMatMulGQ compares the GPTQ/AWQ types with the ggml types they
// sit beside, on TinyLlama's FFN up matrix (5632×2048): GQ4 (Q4_1's packed
// kernels with f32 S/M), GQ4 with an act-order permutation (plus the input
// gather), GQ8 with every zero 128 (Q8_0's kernels) and with other zeros
// (Q8_0's kernels plus the per-block zero correction). Weight GB/s are of the
// stored bytes (GQ4 0.625 B/weight, Q4_0 0.5625, Q4_1 0.625). Compare
// variants in interleaved runs (../bench/notes/gptq_bench.sh in the
// workspace): the machine is shared.
//
//	go test -run - -bench MatMulGQ ./kernels
func BenchmarkMatMulGQ(b *testing.B) {
	pool := NewPool(0)
	defer pool.Close()
	r := rand.New(rand.NewPCG(4, 4))
	const rows, cols = 5632, 2048
	type variant struct {
		name string
		m    *Matrix
	}
	var vs []variant
	for _, typ := range []quant.Type{quant.Q4_0, quant.Q4_1, quant.Q8_0} {
		rb, _ := quant.RowSize(typ, cols)
		data := make([]byte, rows*rb)
		row, _ := quant.Quantize(typ, randF32(r, cols))
		for i := 0; i < rows; i++ {
			copy(data[i*rb:], row)
		}
		m, _ := NewMatrix(typ, rows, cols, data)
		vs = append(vs, variant{typ.String(), m})
	}
	gq := func(name string, typ quant.Type, z128, perm bool) {
		src, _ := randGQ(b, r, typ, 16, cols, z128, perm)
		data := make([]byte, rows*src.RowBytes)
		for i := 0; i < rows; i++ {
			copy(data[i*src.RowBytes:], src.Row(i%16))
		}
		m, _ := NewMatrix(typ, rows, cols, data)
		m.Perm = src.Perm
		vs = append(vs, variant{name, m})
	}
	gq("GQ4", quant.GQ4, false, false)
	gq("GQ4-actorder", quant.GQ4, false, true)
	gq("GQ8-sym", quant.GQ8, true, false)
	gq("GQ8-asym", quant.GQ8, false, false)
	for _, v := range vs {
		Prepack(pool, v.m)
		for _, batch := range []int{1, 64} {
			x := randF32(r, batch*cols)
			out := make([]float32, batch*rows)
			b.Run(fmt.Sprintf("%s/%dx%d/b%d", v.name, rows, cols, batch), func(b *testing.B) {
				MatMul(pool, v.m, x, out, batch)
				cpu0 := processCPU()
				for b.Loop() {
					MatMul(pool, v.m, x, out, batch)
				}
				sec := b.Elapsed().Seconds() / float64(b.N)
				b.ReportMetric(float64(rows*v.m.RowBytes)/sec/1e9, "GB/s")
				b.ReportMetric(2*float64(rows)*float64(cols)*float64(batch)/sec/1e9, "GOP/s")
				// CPU time per pool thread: less of the other processes'
				// share of a busy machine than the wall clock.
				if cpu := (processCPU() - cpu0).Seconds() / float64(b.N) / float64(pool.Threads()); cpu > 0 {
					b.ReportMetric(cpu*1e6, "µs-cpu/op")
				}
			})
		}
	}
}
