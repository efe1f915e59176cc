package kernels

import "math"

// Attention helpers over one row of keys or values stored as float32, f16 or
// bf16. Each exported function dispatches to a SIMD version where the CPU has
// one; the *Ref versions are the plain Go references.

// AxpyF32 adds a·x to out (out += a·x), over len(out) elements.
func AxpyF32(out []float32, a float32, x []float32) { best.axpyF32(out, a, x) }

// AxpyF32 is the package-level AxpyF32 with o's kernels.
func (o *Ops) AxpyF32(out []float32, a float32, x []float32) { o.axpyF32(out, a, x) }

// ScaleF32 multiplies x by a in place.
func ScaleF32(x []float32, a float32) { best.scaleF32(x, a) }

// ScaleF32 is the package-level ScaleF32 with o's kernels.
func (o *Ops) ScaleF32(x []float32, a float32) { o.scaleF32(x, a) }

// DotF16 is Σ q[i]·k[i] with k stored as IEEE half floats.
func DotF16(q []float32, k []uint16) float32 { return best.dotF16(q, k) }

// DotF16 is the package-level DotF16 with o's kernels.
func (o *Ops) DotF16(q []float32, k []uint16) float32 { return o.dotF16(q, k) }

// AxpyF16 adds a·v to out with v stored as IEEE half floats.
func AxpyF16(out []float32, a float32, v []uint16) { best.axpyF16(out, a, v) }

// AxpyF16 is the package-level AxpyF16 with o's kernels.
func (o *Ops) AxpyF16(out []float32, a float32, v []uint16) { o.axpyF16(out, a, v) }

// DotBF16 is Σ q[i]·k[i] with k stored as bfloat16.
func DotBF16(q []float32, k []uint16) float32 { return best.dotBF16(q, k) }

// DotBF16 is the package-level DotBF16 with o's kernels.
func (o *Ops) DotBF16(q []float32, k []uint16) float32 { return o.dotBF16(q, k) }

// AxpyBF16 adds a·v to out with v stored as bfloat16.
func AxpyBF16(out []float32, a float32, v []uint16) { best.axpyBF16(out, a, v) }

// AxpyBF16 is the package-level AxpyBF16 with o's kernels.
func (o *Ops) AxpyBF16(out []float32, a float32, v []uint16) { o.axpyBF16(out, a, v) }

// F32ToF16Row converts src to IEEE half floats (round to nearest even).
func F32ToF16Row(dst []uint16, src []float32) { best.f32ToF16Row(dst, src) }

// F32ToF16Row is the package-level F32ToF16Row with o's kernels.
func (o *Ops) F32ToF16Row(dst []uint16, src []float32) { o.f32ToF16Row(dst, src) }

// F32ToBF16Row converts src to bfloat16 (round to nearest even).
func F32ToBF16Row(dst []uint16, src []float32) { best.f32ToBF16Row(dst, src) }

// F32ToBF16Row is the package-level F32ToBF16Row with o's kernels.
func (o *Ops) F32ToBF16Row(dst []uint16, src []float32) { o.f32ToBF16Row(dst, src) }

// F16ToF32Row converts half floats to float32.
func F16ToF32Row(dst []float32, src []uint16) { best.f16ToF32Row(dst, src) }

// F16ToF32Row is the package-level F16ToF32Row with o's kernels.
func (o *Ops) F16ToF32Row(dst []float32, src []uint16) { o.f16ToF32Row(dst, src) }

// BF16ToF32Row converts bfloat16 to float32.
func BF16ToF32Row(dst []float32, src []uint16) { best.bf16ToF32Row(dst, src) }

// BF16ToF32Row is the package-level BF16ToF32Row with o's kernels.
func (o *Ops) BF16ToF32Row(dst []float32, src []uint16) { o.bf16ToF32Row(dst, src) }

// BF16ToF32RowRef is the reference bfloat16 → float32 conversion.
func BF16ToF32RowRef(dst []float32, src []uint16) {
	src = src[:len(dst)]
	for i, h := range src {
		dst[i] = math.Float32frombits(uint32(h) << 16)
	}
}

// DotF32Ref is the reference Σ a[i]·b[i].
func DotF32Ref(a, b []float32) float32 {
	var s float32
	b = b[:len(a)]
	for i, v := range a {
		s += v * b[i]
	}
	return s
}

// AxpyF32Ref is the reference out += a·x.
func AxpyF32Ref(out []float32, a float32, x []float32) {
	x = x[:len(out)]
	for i := range out {
		out[i] += a * x[i]
	}
}

// ScaleF32Ref is the reference x *= a.
func ScaleF32Ref(x []float32, a float32) {
	for i := range x {
		x[i] *= a
	}
}

// DotF16Ref is the reference Σ q[i]·f16(k[i]).
func DotF16Ref(q []float32, k []uint16) float32 {
	var s float32
	k = k[:len(q)]
	for i, v := range q {
		s += v * f16ToF32(k[i])
	}
	return s
}

// AxpyF16Ref is the reference out += a·f16(v).
func AxpyF16Ref(out []float32, a float32, v []uint16) {
	v = v[:len(out)]
	for i := range out {
		out[i] += a * f16ToF32(v[i])
	}
}

// DotBF16Ref is the reference Σ q[i]·bf16(k[i]).
func DotBF16Ref(q []float32, k []uint16) float32 {
	var s float32
	k = k[:len(q)]
	for i, v := range q {
		s += v * math.Float32frombits(uint32(k[i])<<16)
	}
	return s
}

// AxpyBF16Ref is the reference out += a·bf16(v).
func AxpyBF16Ref(out []float32, a float32, v []uint16) {
	v = v[:len(out)]
	for i := range out {
		out[i] += a * math.Float32frombits(uint32(v[i])<<16)
	}
}

// F32ToF16RowRef is the reference float32 → half conversion.
func F32ToF16RowRef(dst []uint16, src []float32) {
	src = src[:len(dst)]
	for i, v := range src {
		dst[i] = f32ToF16(v)
	}
}

// F16ToF32RowRef is the reference half → float32 conversion.
func F16ToF32RowRef(dst []float32, src []uint16) {
	src = src[:len(dst)]
	for i, h := range src {
		dst[i] = f16ToF32(h)
	}
}

// F32ToBF16RowRef is the reference float32 → bfloat16 conversion.
func F32ToBF16RowRef(dst []uint16, src []float32) {
	src = src[:len(dst)]
	for i, v := range src {
		dst[i] = f32ToBF16(v)
	}
}

// f32ToBF16 rounds to nearest even, keeping NaNs quiet NaNs (as ggml does).
func f32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 0x40
	}
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

// f16ToF32 is exact: every half is a float32.
func f16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	man := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp != 0:
		return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
	case man == 0:
		return math.Float32frombits(sign)
	}
	// Subnormal half: normalise.
	e := uint32(113)
	for man&0x400 == 0 {
		man <<= 1
		e--
	}
	return math.Float32frombits(sign | e<<23 | (man&0x3ff)<<13)
}

// f32ToF16 rounds to nearest even, saturating to ±Inf like VCVTPS2PH.
func f32ToF16(f float32) uint16 {
	u := math.Float32bits(f)
	sign := uint16(u>>16) & 0x8000
	a := u & 0x7fffffff
	switch {
	case a > 0x7f800000: // NaN: keep it quiet
		return sign | 0x7e00 | uint16(a>>13)&0x3ff
	case a >= 0x477ff000: // rounds to ≥ 65520: overflow
		return sign | 0x7c00
	case a >= 0x38800000: // normal half
		a += 0xfff + (a>>13)&1
		return sign | uint16((a-0x38000000)>>13)
	case a < 0x33000000: // below half the smallest subnormal
		return sign
	}
	// Subnormal half: shift the implicit-one mantissa into place with
	// round to nearest even.
	e := a >> 23
	m := a&0x7fffff | 0x800000
	shift := 126 - e
	r := m >> shift
	rem := m & (1<<shift - 1)
	half := uint32(1) << (shift - 1)
	if rem > half || (rem == half && r&1 == 1) {
		r++
	}
	return sign | uint16(r)
}
