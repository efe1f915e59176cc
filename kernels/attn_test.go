package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// f16Nearest is an independent float64 model of round-to-nearest-even
// conversion: pick the closer of the two neighbouring halves.
func f16Nearest(f float32) uint16 {
	if f != f {
		return 0x7e00
	}
	best := uint16(0)
	bestErr := math.Inf(1)
	x := float64(f)
	for h := 0; h < 0x7c01; h++ {
		v := float64(f16ToF32(uint16(h)))
		if math.Signbit(x) {
			v = -v
		}
		e := math.Abs(v - x)
		if h == 0x7c00 {
			// Overflow threshold: 65520 rounds up to Inf.
			if math.Abs(x) >= 65520 {
				e = 0
			} else {
				e = math.Inf(1)
			}
		}
		if e < bestErr || (e == bestErr && h&1 == 0) {
			best, bestErr = uint16(h), e
		}
	}
	if math.Signbit(x) {
		best |= 0x8000
	}
	return best
}

func TestF16Conversions(t *testing.T) {
	// Every finite half survives the round trip.
	for h := 0; h < 1<<16; h++ {
		if h&0x7c00 == 0x7c00 && h&0x3ff != 0 {
			continue
		}
		if got := f32ToF16(f16ToF32(uint16(h))); got != uint16(h) {
			t.Fatalf("round trip %#04x -> %g -> %#04x", h, f16ToF32(uint16(h)), got)
		}
	}
	if f16ToF32(0x3c00) != 1 || f16ToF32(0xc000) != -2 || f16ToF32(0x0001) != 5.960464477539063e-08 || f16ToF32(0x7bff) != 65504 {
		t.Fatal("known half values wrong")
	}
	r := rand.New(rand.NewPCG(1, 2))
	vals := []float32{65519.99, 65520, 1e-8, 2.9802322e-08, 2.9802326e-08, -3e-5, 0.1, 1.0009765625 / 2,
		float32(math.Inf(1)), float32(math.Inf(-1)), 1e30, -1e30, 6.1035156e-05, 6.1e-05}
	for i := 0; i < 300; i++ {
		vals = append(vals, float32(r.NormFloat64()*math.Pow(2, float64(r.IntN(40)-28))))
	}
	for _, v := range vals {
		if got, want := f32ToF16(v), f16Nearest(v); got != want {
			t.Errorf("f32ToF16(%g) = %#04x, want %#04x", v, got, want)
		}
	}
	// The dispatched row conversion (VCVTPS2PH where present) agrees,
	// subnormals, overflow and odd lengths included.
	forEachISA(t, func(t *testing.T, o *Ops) {
		row := make([]uint16, len(vals))
		o.F32ToF16Row(row, vals)
		for i, v := range vals {
			if row[i] != f32ToF16(v) {
				t.Errorf("F32ToF16Row(%g) = %#04x, want %#04x", v, row[i], f32ToF16(v))
			}
		}
	})
	if f32ToBF16(1.00390625) != 0x3f80 || f32ToBF16(1.01171875) != 0x3f82 || f32ToBF16(float32(math.NaN()))&0x7fc0 != 0x7fc0 {
		t.Fatal("bf16 rounding wrong")
	}
}

func randF32(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

func closeRel(a, b float32, tol float64) bool {
	d := math.Abs(float64(a) - float64(b))
	return d <= tol*(1+math.Abs(float64(b)))
}

// TestAttnHelpers checks the dispatched helpers (SIMD where present) against
// float64 sums, over odd lengths and unaligned starts.
func TestAttnHelpers(t *testing.T) { forEachISA(t, testAttnHelpers) }

func testAttnHelpers(t *testing.T, o *Ops) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{0, 1, 3, 7, 15, 16, 17, 31, 33, 63, 64, 65, 127, 128, 129, 255, 1000} {
		for _, off := range []int{0, 1, 3} {
			q := randF32(r, n+off)[off:]
			kf := randF32(r, n+off)[off:]
			k16 := make([]uint16, n+off)[off:]
			kb := make([]uint16, n+off)[off:]
			o.F32ToF16Row(k16, kf)
			o.F32ToBF16Row(kb, kf)
			for i := range kf {
				if k16[i] != f32ToF16(kf[i]) || kb[i] != f32ToBF16(kf[i]) {
					t.Fatalf("n=%d: row conversion differs at %d", n, i)
				}
			}
			var w32, w16, wb float64
			for i := range q {
				w32 += float64(q[i]) * float64(kf[i])
				w16 += float64(q[i]) * float64(f16ToF32(k16[i]))
				wb += float64(q[i]) * float64(math.Float32frombits(uint32(kb[i])<<16))
			}
			tol := 1e-5 * math.Sqrt(float64(n+1))
			if got := o.DotF32(q, kf); !closeRel(got, float32(w32), tol) {
				t.Errorf("DotF32 n=%d: %g want %g", n, got, w32)
			}
			if got := o.DotF16(q, k16); !closeRel(got, float32(w16), tol) {
				t.Errorf("DotF16 n=%d: %g want %g", n, got, w16)
			}
			if got := o.DotBF16(q, kb); !closeRel(got, float32(wb), tol) {
				t.Errorf("DotBF16 n=%d: %g want %g", n, got, wb)
			}
			back := make([]float32, n)
			o.F16ToF32Row(back, k16)
			for i := range back {
				if back[i] != f16ToF32(k16[i]) {
					t.Fatalf("F16ToF32Row n=%d differs at %d", n, i)
				}
			}
			o.BF16ToF32Row(back, kb)
			for i := range back {
				if back[i] != math.Float32frombits(uint32(kb[i])<<16) {
					t.Fatalf("BF16ToF32Row n=%d differs at %d", n, i)
				}
			}
			a := float32(r.NormFloat64())
			base := randF32(r, n)
			for kind := 0; kind < 3; kind++ {
				out := append([]float32(nil), base...)
				var want []float32
				switch kind {
				case 0:
					o.AxpyF32(out, a, kf)
					want = kf
				case 1:
					o.AxpyF16(out, a, k16)
					want = make([]float32, n)
					F16ToF32RowRef(want, k16)
				case 2:
					o.AxpyBF16(out, a, kb)
					want = make([]float32, n)
					for i := range want {
						want[i] = math.Float32frombits(uint32(kb[i]) << 16)
					}
				}
				for i := range out {
					w := float64(base[i]) + float64(a)*float64(want[i])
					if !closeRel(out[i], float32(w), 1e-6) {
						t.Fatalf("axpy kind %d n=%d i=%d: %g want %g", kind, n, i, out[i], w)
					}
				}
			}
			out := append([]float32(nil), base...)
			o.ScaleF32(out, a)
			for i := range out {
				if out[i] != base[i]*a {
					t.Fatalf("ScaleF32 n=%d i=%d", n, i)
				}
			}
		}
	}
}
