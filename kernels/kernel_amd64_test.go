//go:build amd64 && !purego

package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"pagoda/quant"
)

// BenchmarkGemmKernel times the micro-kernels alone on one thread with
// cache-resident operands (one 16-row group × 2048 columns against one
// activation tile): the compute ceiling the matmul can approach.
func BenchmarkGemmKernel(b *testing.B) {
	if _, err := ForISA("avx512"); err != nil {
		b.Skip("no AVX-512 VNNI")
	}
	r := rand.New(rand.NewPCG(1, 2))
	const cols = 2048
	for _, typ := range []quant.Type{quant.Q8_0, quant.Q4_0, quant.Q4_K, quant.Q5_K, quant.Q6_K, quant.Q5_0} {
		m, _ := randMatrix(b, r, typ, 16, cols)
		pk := m.packedFor(false)
		fns := map[packKind]*[9]gemmKernel{packQ8C: &gemmQ8CFns, packQ4C: &gemmQ4CFns, packSM16: &gemmSM16_Fns, packQ4SM: &gemmQ4SMFns, packQ8S16: &gemmQ8S16_Fns, packQ4K: &gemmQ4KFns, packQ6K: &gemmQ6KFns, packQ5C: &gemmQ5CFns, packQ5K: &gemmQ5KFns}[pk.kind]
		for _, n := range []int{1, 4, 8} {
			var a actBuf
			quantizeActs(nil, pk, randF32(r, n*cols), n, cols, &a, true)
			var tmp [128]float32
			b.Run(fmt.Sprintf("%s/n%d", typ, n), func(b *testing.B) {
				cpu0 := processCPU()
				for b.Loop() {
					fns[n](&pk.data[0], &a.q[0], &a.st[0], &tmp[0], pk.kernelArg(), 64)
				}
				sec := b.Elapsed().Seconds() / float64(b.N)
				b.ReportMetric(2*16*cols*float64(n)/sec/1e9, "GOP/s")
				if cpu := (processCPU() - cpu0).Seconds() / float64(b.N); cpu > 0 {
					b.ReportMetric(2*16*cols*float64(n)/cpu/1e9, "GOP/s-cpu")
				}
			})
		}
	}
}

func BenchmarkQuantizeActs(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, pk := range []*packed{{kind: packQ8C, act: actQ8_0, block: 32, k: 128}, {kind: packSM16, act: actQ8_K, block: 16}} {
		act := pk.act
		x := randF32(r, 2048)
		var a actBuf
		b.Run(fmt.Sprint(act), func(b *testing.B) {
			for b.Loop() {
				quantizeActs(nil, pk, x, 1, 2048, &a, Best().asmQuant)
			}
			b.ReportMetric(2048/(b.Elapsed().Seconds()/float64(b.N))/1e9, "Gelem/s")
		})
	}
}
