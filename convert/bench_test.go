package convert

import (
	"fmt"
	"testing"

	"pagoda/quant"
)

// BenchmarkWriteTensor measures the row-parallel conversion of one
// 2048×2048 F32 matrix (a TinyLlama attn_q) per target type.
func BenchmarkWriteTensor(b *testing.B) {
	const n = 2048
	f := make([]float32, n*n)
	s := uint64(1)
	for i := range f {
		s ^= s << 13
		s ^= s >> 7
		s ^= s << 17
		f[i] = float32(int64(s%2001)-1000) / 1000 * 0.05
	}
	t := &srcTensor{name: "blk.0.attn_q.weight", typ: quant.F32, dims: []uint64{n, n},
		data: func() ([]byte, error) { return f32Bytes(f), nil }}
	for _, to := range []quant.Type{quant.F16, quant.Q8_0, quant.Q4_0, quant.Q4_K, quant.Q6_K, quant.Q2_K} {
		for _, th := range []int{1, 2} {
			b.Run(fmt.Sprintf("%s/threads=%d", to, th), func(b *testing.B) {
				b.SetBytes(int64(4 * n * n))
				for i := 0; i < b.N; i++ {
					if err := writeTensor(discard{}, t, to, th); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
