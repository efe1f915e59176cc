package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestOps holds RMSNorm, Softmax and SiLUMul (SIMD where present) to float64
// evaluations: relative error ≤ 2e-6 (the vector exp is a degree-7
// polynomial, ~1 ulp); Softmax 1e-5 (a float32 sum over n terms).
func TestOps(t *testing.T) { forEachISA(t, testOps) }

func testOps(t *testing.T, o *Ops) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, n := range []int{1, 2, 15, 16, 17, 33, 64, 100, 2048} {
		x := randF32(r, n+1)[1:] // unaligned
		for i := range x {
			x[i] *= 8
		}
		w := randF32(r, n)
		for _, wt := range [][]float32{nil, w} {
			out := make([]float32, n)
			o.RMSNorm(out, x, wt, 1e-5)
			var ss float64
			for _, v := range x {
				ss += float64(v) * float64(v)
			}
			sc := 1 / math.Sqrt(ss/float64(n)+1e-5)
			for i := range out {
				want := float64(x[i]) * sc
				if wt != nil {
					want *= float64(wt[i])
				}
				if !closeRel(out[i], float32(want), 2e-6) {
					t.Fatalf("RMSNorm n=%d i=%d: %g want %g", n, i, out[i], want)
				}
			}
		}
		s := append([]float32(nil), x...)
		if n > 3 {
			s[1] = float32(math.Inf(-1)) // masked position
			s[2] = -200                  // underflows
		}
		o.Softmax(s)
		m := math.Inf(-1)
		for i, v := range x {
			if n > 3 && (i == 1 || i == 2) {
				continue
			}
			m = max(m, float64(v))
		}
		var sum float64
		e := make([]float64, n)
		for i, v := range x {
			if n > 3 && i == 1 {
				continue
			}
			if n > 3 && i == 2 {
				v = -200
			}
			e[i] = math.Exp(float64(v) - m)
			sum += e[i]
		}
		for i := range s {
			if math.Abs(float64(s[i])-e[i]/sum) > 1e-5*e[i]/sum+1e-30 {
				t.Fatalf("Softmax n=%d i=%d: %g want %g", n, i, s[i], e[i]/sum)
			}
		}
		u := randF32(r, n)
		g := append([]float32(nil), x...)
		if n > 3 {
			g[0], g[1] = 100, -100 // exp overflow/underflow sides
		}
		out := make([]float32, n)
		o.SiLUMul(out, g, u)
		for i := range out {
			want := float64(g[i]) / (1 + math.Exp(-float64(g[i]))) * float64(u[i])
			if !closeRel(out[i], float32(want), 2e-6) {
				t.Fatalf("SiLUMul n=%d i=%d g=%g: %g want %g", n, i, g[i], out[i], want)
			}
		}
		o.SiLUMul(g, g, u) // aliasing
		for i := range out {
			if g[i] != out[i] {
				t.Fatalf("SiLUMul aliased n=%d i=%d differs", n, i)
			}
		}
	}
}

// TestRoPE: the cached-table RoPE is bit-identical to the reference, across
// position changes, both pairings, and a frequency table that changes in
// place.
func TestRoPE(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	freqs := make([]float32, 32)
	for i := range freqs {
		freqs[i] = float32(math.Pow(10000, -2*float64(i)/64))
	}
	other := append([]float32(nil), freqs...)
	other[5] *= 0.25
	for _, pos := range []int{0, 1, 1, 7, 4095, 7, 100000} {
		for _, neox := range []bool{false, true} {
			for _, f := range [][]float32{freqs, other, freqs[:16]} {
				x := randF32(r, 64)
				want := append([]float32(nil), x...)
				RoPE(x, pos, f, neox)
				RoPERef(want, pos, f, neox)
				for i := range x {
					if x[i] != want[i] {
						t.Fatalf("pos %d neox %v n %d: x[%d] = %g, want %g", pos, neox, len(f), i, x[i], want[i])
					}
				}
			}
		}
	}
	// Same slice, values changed in place (first/last element change).
	f := append([]float32(nil), freqs...)
	x := randF32(r, 64)
	RoPE(append([]float32(nil), x...), 3, f, false)
	f[31] *= 2
	want := append([]float32(nil), x...)
	RoPE(x, 3, f, false)
	RoPERef(want, 3, f, false)
	for i := range x {
		if x[i] != want[i] {
			t.Fatalf("in-place change: x[%d] = %g, want %g", i, x[i], want[i])
		}
	}
}
