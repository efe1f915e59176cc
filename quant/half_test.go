package quant

import (
	"math"
	"math/rand/v2"
	"testing"
)

// f16Value computes a half's value independently of F16ToF32, in float64.
func f16Value(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp, mant := int(h>>10)&0x1f, float64(h&0x3ff)
	switch exp {
	case 0:
		return sign * math.Ldexp(mant, -24)
	case 0x1f:
		if mant != 0 {
			return math.NaN()
		}
		return sign * math.Inf(1)
	}
	return sign * math.Ldexp(1024+mant, exp-25)
}

func TestF16ToF32AllValues(t *testing.T) {
	for i := 0; i < 1<<16; i++ {
		h := uint16(i)
		got, want := float64(F16ToF32(h)), f16Value(h)
		if math.Float32bits(F16ToF32(h)) != math.Float32bits(f16ToF32Slow(h)) {
			t.Fatalf("%#04x: table and computed widening differ", h)
		}
		if math.IsNaN(want) {
			if !math.IsNaN(got) {
				t.Fatalf("%#04x: got %v, want NaN", h, got)
			}
			if back := F32ToF16(float32(got)); back != h&0x8000|0x7e00 {
				t.Fatalf("%#04x: NaN narrows to %#04x, want the quiet NaN %#04x", h, back, h&0x8000|0x7e00)
			}
			continue
		}
		if got != want || math.Signbit(got) != math.Signbit(want) {
			t.Fatalf("%#04x: got %v, want %v", h, got, want)
		}
		if back := F32ToF16(float32(got)); back != h {
			t.Fatalf("%#04x: round trip gives %#04x", h, back)
		}
	}
}

// checkNearest asserts that h is the round-to-nearest-even half of f.
func checkNearest(t *testing.T, f float32, h uint16) {
	t.Helper()
	x := float64(f)
	if math.Abs(x) >= 65520 { // halfway between 65504 and 2¹⁶ and beyond: Inf
		want := uint16(0x7c00)
		if x < 0 {
			want |= 0x8000
		}
		if h != want {
			t.Fatalf("F32ToF16(%g) = %#04x, want %#04x", f, h, want)
		}
		return
	}
	if h&0x7fff >= 0x7c00 {
		t.Fatalf("F32ToF16(%g) = %#04x: not finite", f, h)
	}
	v := f16Value(h)
	if (v < 0) != (x < 0) && v != 0 {
		t.Fatalf("F32ToF16(%g) = %#04x: wrong sign", f, h)
	}
	err := math.Abs(v - x)
	for _, nb := range []uint16{h + 1, h - 1} {
		if nb&0x7fff >= 0x7c00 || (nb^h)&0x8000 != 0 {
			continue
		}
		e := math.Abs(f16Value(nb) - x)
		if e < err || (e == err && h&1 == 1) {
			t.Fatalf("F32ToF16(%g) = %#04x (%g), but %#04x (%g) is nearer or the even tie", f, h, v, nb, f16Value(nb))
		}
	}
	// Zero has two neighbours of opposite sign; check the smallest subnormal.
	if h&0x7fff == 0 && math.Abs(x) > math.Ldexp(1, -25) {
		t.Fatalf("F32ToF16(%g) = zero, but 2⁻²⁴ is nearer", f)
	}
}

func TestF32ToF16Rounding(t *testing.T) {
	cases := map[float32]uint16{
		0: 0, float32(math.Copysign(0, -1)): 0x8000, 1: 0x3c00, -2: 0xc000,
		65504: 0x7bff, 65519.99: 0x7bff, 65520: 0x7c00, 1e10: 0x7c00, -1e10: 0xfc00,
		float32(math.Inf(1)): 0x7c00, float32(math.Inf(-1)): 0xfc00,
		float32(math.Ldexp(1, -24)):         0x0001,
		float32(math.Ldexp(1, -25)):         0x0000, // tie to even zero
		float32(math.Ldexp(1.0000001, -25)): 0x0001,
		float32(math.Ldexp(1.5, -24)):       0x0002, // tie 1.5 → 2
		float32(math.Ldexp(2.5, -24)):       0x0002, // tie 2.5 → 2
		float32(math.Ldexp(1023.5, -24)):    0x0400, // subnormal rounds up into the smallest normal
		float32(math.Ldexp(1, -14)):         0x0400,
		1 + 1.0/2048:                        0x3c00, // tie to even
		1 + 3.0/2048:                        0x3c02,
		float32(math.Ldexp(1, -130)):        0, // float32 subnormal
	}
	for f, want := range cases {
		if got := F32ToF16(f); got != want {
			t.Errorf("F32ToF16(%g) = %#04x, want %#04x", f, got, want)
		}
	}
	if h := F32ToF16(float32(math.NaN())); h&0x7c00 != 0x7c00 || h&0x3ff == 0 {
		t.Errorf("F32ToF16(NaN) = %#04x, not a NaN", h)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 300000; i++ {
		// Random bit patterns over the exponents that matter to halves.
		exp := uint32(95 + rng.IntN(55))
		b := rng.Uint32()&0x807fffff | exp<<23
		f := math.Float32frombits(b)
		checkNearest(t, f, F32ToF16(f))
	}
	// Every tie point between consecutive halves.
	for i := 0; i < 0x7bff; i++ {
		lo, hi := f16Value(uint16(i)), f16Value(uint16(i+1))
		mid := float32((lo + hi) / 2)
		checkNearest(t, mid, F32ToF16(mid))
		checkNearest(t, -mid, F32ToF16(-mid))
	}
}

func TestBF16(t *testing.T) {
	for i := 0; i < 1<<16; i++ {
		h := uint16(i)
		f := BF16ToF32(h)
		if math.Float32bits(f) != uint32(h)<<16 {
			t.Fatalf("BF16ToF32(%#04x) = %v", h, f)
		}
		if !math.IsNaN(float64(f)) && F32ToBF16(f) != h {
			t.Fatalf("BF16 round trip of %#04x gives %#04x", h, F32ToBF16(f))
		}
	}
	cases := map[float32]uint16{
		1: 0x3f80, 1 + 1.0/256: 0x3f80, 1 + 3.0/256: 0x3f82, 1 + 1.0/256 + 1.0/65536: 0x3f81,
		3.4e38:                       0x7f80, // rounds past the largest bfloat16
		float32(math.Inf(-1)):        0xff80,
		float32(math.Ldexp(1, -130)): 0x0008, // subnormals are kept (bits 0x00080000), not flushed
	}
	for f, want := range cases {
		if got := F32ToBF16(f); got != want {
			t.Errorf("F32ToBF16(%g) = %#04x, want %#04x", f, got, want)
		}
	}
	nan := math.Float32frombits(0x7f800001) // signalling NaN with a low payload
	if got := F32ToBF16(nan); got != 0x7fc0 {
		t.Errorf("F32ToBF16(sNaN) = %#04x, want quiet 0x7fc0", got)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 200000; i++ {
		f := math.Float32frombits(rng.Uint32())
		if math.IsNaN(float64(f)) {
			continue
		}
		h := F32ToBF16(f)
		x := float64(f)
		v := float64(BF16ToF32(h))
		if math.IsInf(v, 0) {
			if math.Abs(x) < float64(math.Float32frombits(0x7f7f8000)) { // midpoint of max bf16 and 2¹²⁸
				t.Fatalf("F32ToBF16(%g) overflowed", f)
			}
			continue
		}
		for _, nb := range []uint16{h + 1, h - 1} {
			w := float64(BF16ToF32(nb))
			if math.IsNaN(w) || math.IsInf(w, 0) || (nb^h)&0x8000 != 0 {
				continue
			}
			if e, e0 := math.Abs(w-x), math.Abs(v-x); e < e0 || (e == e0 && h&1 == 1) {
				t.Fatalf("F32ToBF16(%g) = %#04x, but %#04x is nearer or the even tie", f, h, nb)
			}
		}
	}
}
