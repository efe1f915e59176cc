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

// BenchmarkOps covers the vector helpers at model sizes: GB/s of the
// operands read.
//
//	go test -run - -bench Ops ./kernels
func BenchmarkOps(b *testing.B) {
	r := rand.New(rand.NewPCG(2, 2))
	x := randF32(r, 5632)
	y := randF32(r, 5632)
	out := make([]float32, 5632)
	h := make([]uint16, 5632)
	F32ToF16Row(h, y)
	run := func(name string, bytes int, f func()) {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				f()
			}
			b.ReportMetric(float64(bytes)/(b.Elapsed().Seconds()/float64(b.N))/1e9, "GB/s")
		})
	}
	run("DotF32/2048", 2*4*2048, func() { DotF32(x[:2048], y[:2048]) })
	run("DotF16/64", 64*6, func() { DotF16(x[:64], h[:64]) })
	run("DotF16/2048", 2048*6, func() { DotF16(x[:2048], h[:2048]) })
	run("AxpyF16/2048", 2048*10, func() { AxpyF16(out[:2048], 0.5, h[:2048]) })
	run("RMSNorm/2048", 3*4*2048, func() { RMSNorm(out[:2048], x[:2048], y[:2048], 1e-5) })
	run("Softmax/512", 4*512, func() { copy(out, x[:512]); Softmax(out[:512]) })
	run("SiLUMul/5632", 3*4*5632, func() { SiLUMul(out, x, y) })
	run("RoPE/64", 4*64, func() { RoPE(out[:64], 7, y[:32], false) })
	run("F32ToF16Row/2048", 6*2048, func() { F32ToF16Row(h[:2048], x[:2048]) })
	// One head over 512 cached positions, K/V rows of 4 KV heads × 64.
	kv := make([]uint16, 512*256)
	kvf := randF32(r, 512*256)
	F32ToF16Row(kv, kvf)
	sc := make([]float32, 512)
	run("AttnScoresF16/512x64", 512*64*2, func() { AttnScoresF16(sc, x[:64], kv, 256) })
	run("AttnMixF16/512x64", 512*64*2, func() { AttnMixF16(out[:64], sc, kv, 256) })
	run("AttnScoresF32/512x64", 512*64*4, func() { AttnScoresF32(sc, x[:64], kvf, 256) })
	run("DotF16-loop/512x64", 512*64*2, func() {
		for t := range sc {
			sc[t] = DotF16(x[:64], kv[t*256:t*256+64])
		}
	})
}

// BenchmarkPrepack times building the packed layout of the TinyLlama output
// matrix (32000×2048), the largest one a model loads.
func BenchmarkPrepack(b *testing.B) {
	pool := NewPool(0)
	defer pool.Close()
	r := rand.New(rand.NewPCG(3, 3))
	for _, typ := range []quant.Type{quant.Q8_0, quant.Q4_K, quant.Q6_K} {
		rows, cols := 32000, 2048
		rb, _ := quant.RowSize(typ, cols)
		data := make([]byte, rows*rb)
		row, _ := quant.Quantize(typ, randF32(r, cols))
		for i := 0; i < rows; i++ {
			copy(data[i*rb:], row)
		}
		b.Run(typ.String(), func(b *testing.B) {
			for b.Loop() {
				m, _ := NewMatrix(typ, rows, cols, data)
				Prepack(pool, m)
			}
			b.ReportMetric(float64(rows*rb)/(b.Elapsed().Seconds()/float64(b.N))/1e9, "GB/s")
		})
	}
}
