package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestAttnRows holds the many-row score and mix kernels to float64 sums over
// every head size shape (odd too), strides with gaps, and 0..37 rows.
func TestAttnRows(t *testing.T) { forEachISA(t, testAttnRows) }

func testAttnRows(t *testing.T, o *Ops) {
	r := rand.New(rand.NewPCG(17, 18))
	for _, d := range []int{1, 7, 16, 17, 32, 48, 64, 80, 128, 131} {
		for _, n := range []int{0, 1, 2, 3, 17, 37} {
			stride := d + r.IntN(3)*8
			size := 0
			if n > 0 {
				size = (n-1)*stride + d
			}
			q := randF32(r, d)
			kf := randF32(r, size)
			kh := make([]uint16, size)
			kb := make([]uint16, size)
			F32ToF16RowRef(kh, kf)
			F32ToBF16RowRef(kb, kf)
			w := randF32(r, n)
			base := randF32(r, d)
			for kind := 0; kind < 3; kind++ {
				val := func(i int) float64 {
					switch kind {
					case 1:
						return float64(f16ToF32(kh[i]))
					case 2:
						return float64(math.Float32frombits(uint32(kb[i]) << 16))
					}
					return float64(kf[i])
				}
				s := make([]float32, n)
				out := append([]float32(nil), base...)
				switch kind {
				case 0:
					o.AttnScoresF32(s, q, kf, stride)
					o.AttnMixF32(out, w, kf, stride)
				case 1:
					o.AttnScoresF16(s, q, kh, stride)
					o.AttnMixF16(out, w, kh, stride)
				case 2:
					o.AttnScoresBF16(s, q, kb, stride)
					o.AttnMixBF16(out, w, kb, stride)
				}
				for tt := 0; tt < n; tt++ {
					var want, mag float64
					for i := 0; i < d; i++ {
						p := float64(q[i]) * val(tt*stride+i)
						want += p
						mag += math.Abs(p)
					}
					if math.Abs(float64(s[tt])-want) > 1e-6*mag+1e-7 {
						t.Fatalf("kind %d d=%d n=%d: score[%d] = %g, want %g", kind, d, n, tt, s[tt], want)
					}
				}
				for i := 0; i < d; i++ {
					want, mag := float64(base[i]), math.Abs(float64(base[i]))
					for tt := 0; tt < n; tt++ {
						p := float64(w[tt]) * val(tt*stride+i)
						want += p
						mag += math.Abs(p)
					}
					if math.Abs(float64(out[i])-want) > 1e-6*mag+1e-7 {
						t.Fatalf("kind %d d=%d n=%d: out[%d] = %g, want %g", kind, d, n, i, out[i], want)
					}
				}
			}
		}
	}
	defer func() {
		if recover() == nil {
			t.Fatal("rows past the slice did not panic")
		}
	}()
	o.AttnScoresF32(make([]float32, 3), make([]float32, 64), make([]float32, 64*3-1), 64)
}
