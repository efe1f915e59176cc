package kernels

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkBlockAttn: one KV head's scores and mix over 512 rows of head
// dim 64, rows 4 heads apart (TinyLlama's shape), per instruction set and
// block format; rows/s.
func BenchmarkBlockAttn(b *testing.B) {
	const n, dim, heads = 512, 64, 4
	fmts := []struct {
		name string
		bb   int
		attn func(o *Ops) BlockAttn
	}{
		{"q8_0", Q8_0Bytes, (*Ops).AttnQ8_0},
		{"q4_0", Q4_0Bytes, (*Ops).AttnQ4_0},
		{"q4_1", Q4_1Bytes, (*Ops).AttnQ4_1},
		{"q5_0", Q5_0Bytes, (*Ops).AttnQ5_0},
		{"q5_1", Q5_1Bytes, (*Ops).AttnQ5_1},
		{"iq4_nl", IQ4_NLBytes, (*Ops).AttnIQ4_NL},
	}
	r := rand.New(rand.NewPCG(1, 2))
	for _, isa := range ISAs() {
		o, _ := ForISA(isa)
		for _, f := range fmts {
			stride := heads * dim / 32 * f.bb
			k := randBlocks(r, n, dim/32, stride, f.bb)
			q, s := make([]float32, dim), make([]float32, n)
			for i := range q {
				q[i] = float32(r.NormFloat64())
			}
			w, out := make([]float32, n), make([]float32, dim)
			for i := range w {
				w[i] = 1 / float32(n)
			}
			a := f.attn(o)
			b.Run(isa+"/"+f.name+"/scores", func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					a.Scores(s, q, k, stride)
				}
				b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "rows/s")
			})
			b.Run(isa+"/"+f.name+"/mix", func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					a.Mix(out, w, k, stride)
				}
				b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "rows/s")
			})
		}
	}
}

// BenchmarkPlaneAttn: scores and mix over 512 rows of 64 channels of
// KIVI codes, per instruction set and code width; rows/s.
func BenchmarkPlaneAttn(b *testing.B) {
	const n, chans = 512, 64
	r := rand.New(rand.NewPCG(3, 4))
	for _, isa := range ISAs() {
		o, _ := ForISA(isa)
		for _, bits := range []int{4, 2} {
			rb := chans * bits / 8
			stride := 4 * rb
			codes := make([]byte, (n-1)*stride+rb)
			for i := range codes {
				codes[i] = byte(r.UintN(256))
			}
			planes, s := make([]float32, chans), make([]float32, n)
			for i := range planes {
				planes[i] = float32(r.NormFloat64())
			}
			w, out := make([]float32, n), make([]float32, chans)
			for i := range w {
				w[i] = 1 / float32(n)
			}
			a := o.AttnPlanes(bits)
			name := isa + "/" + map[int]string{2: "kivi2", 4: "kivi4"}[bits]
			b.Run(name+"/scores", func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					a.Scores(s, planes, codes, stride)
				}
				b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "rows/s")
			})
			b.Run(name+"/mix", func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					a.Mix(out, w, codes, stride)
				}
				b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "rows/s")
			})
		}
	}
}
