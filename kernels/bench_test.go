package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"pagoda/quant"
)

// TinyLlama-1.1B matrix shapes (rows × cols): attention, FFN up/gate, FFN
// down, output.
var benchShapes = [][2]int{{2048, 2048}, {5632, 2048}, {2048, 5632}, {32000, 2048}}

// BenchmarkMatMul reports weight GB/s (decode, batch 1: the bandwidth-bound
// case) and GOP/s (2 ops per multiply-add; prefill, batch 512).
//
//	go test -run - -bench MatMul -benchtime 2s ./kernels
func BenchmarkMatMul(b *testing.B) {
	pool := NewPool(0)
	defer pool.Close()
	r := rand.New(rand.NewPCG(1, 1))
	for _, typ := range []quant.Type{quant.Q8_0, quant.Q4_0, quant.Q4_K, quant.Q6_K, quant.F16, quant.BF16, quant.F32} {
		for _, sh := range benchShapes {
			rows, cols := sh[0], sh[1]
			rb, _ := quant.RowSize(typ, cols)
			data := make([]byte, rows*rb)
			// Quantizing a real random row and repeating it keeps set-up
			// fast; the kernels' speed does not depend on the values.
			row, _ := quant.Quantize(typ, randF32(r, cols))
			for i := 0; i < rows; i++ {
				copy(data[i*rb:], row)
			}
			m, _ := NewMatrix(typ, rows, cols, data)
			Prepack(pool, m)
			for _, batch := range []int{1, 512} {
				if batch > 1 && rows == 32000 {
					continue
				}
				x := randF32(r, batch*cols)
				out := make([]float32, batch*rows)
				b.Run(fmt.Sprintf("%s/%dx%d/b%d", typ, rows, cols, batch), func(b *testing.B) {
					MatMul(pool, m, x, out, batch)
					cpu0 := processCPU()
					for b.Loop() {
						MatMul(pool, m, x, out, batch)
					}
					sec := b.Elapsed().Seconds() / float64(b.N)
					b.ReportMetric(float64(rows*rb)/sec/1e9, "GB/s")
					b.ReportMetric(2*float64(rows)*float64(cols)*float64(batch)/sec/1e9, "GOP/s")
					// On a shared machine the wall clock counts time the OS
					// gave to other processes; CPU time per pool thread
					// (spin-waits included) shows what the code does
					// when it runs.
					if cpu := (processCPU() - cpu0).Seconds() / float64(b.N) / float64(pool.Threads()); cpu > 0 {
						b.ReportMetric(float64(rows*rb)/cpu/1e9, "GB/s-cpu")
						b.ReportMetric(2*float64(rows)*float64(cols)*float64(batch)/cpu/1e9, "GOP/s-cpu")
					}
				})
			}
		}
	}
}
