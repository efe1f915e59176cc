package quant

import "math"

// f16Table holds F16ToF32 of every half: a 256 KiB lookup is several times
// faster than the branches, and F16 weights are widened in hot loops.
var f16Table = func() *[1 << 16]float32 {
	var t [1 << 16]float32
	for i := range t {
		t[i] = f16ToF32Slow(uint16(i))
	}
	return &t
}()

// F16ToF32 widens an IEEE binary16 value; every half value, subnormals,
// infinities and NaNs included, has an exact float32 image.
func F16ToF32(h uint16) float32 { return f16Table[h] }

func f16ToF32Slow(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch exp {
	case 0:
		if mant == 0 {
			return math.Float32frombits(sign)
		}
		// Subnormal half: mant·2⁻²⁴ is exact in float32.
		f := float32(mant) * (1.0 / 16777216.0)
		return math.Float32frombits(sign | math.Float32bits(f))
	case 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	}
	return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
}

// F32ToF16 narrows to IEEE binary16 with round-to-nearest-even, producing
// half subnormals, ±Inf on overflow and the canonical quiet NaN 0x7e00 (with
// the sign kept), as ggml_compute_fp32_to_fp16 does.
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	mant := b & 0x7fffff
	switch {
	case exp == 0xff:
		if mant != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	case exp > 142: // ≥ 2¹⁶: past the largest half even before rounding
		return sign | 0x7c00
	case exp >= 113: // a normal half; a rounding carry may run into Inf, which is right
		h := uint32(exp-112)<<10 | mant>>13
		rem := mant & 0x1fff
		if rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
			h++
		}
		return sign | uint16(h)
	case exp < 102: // below 2⁻²⁵: rounds to zero (2⁻²⁵ itself ties to even zero)
		return sign
	}
	// A half subnormal: units of 2⁻²⁴.
	m := mant | 0x800000
	shift := uint(126 - exp)
	h := m >> shift
	rem := m & (1<<shift - 1)
	half := uint32(1) << (shift - 1)
	if rem > half || (rem == half && h&1 == 1) {
		h++
	}
	return sign | uint16(h)
}

// BF16ToF32 widens a bfloat16 value (the top half of a float32).
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F32ToBF16 narrows to bfloat16 with round-to-nearest-even and quiets NaNs,
// bit for bit like ggml_compute_fp32_to_bf16 (subnormals are kept).
func F32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 64
	}
	return uint16((u + (0x7fff + (u>>16)&1)) >> 16)
}
