package quant

import (
	"encoding/binary"
	"math"
)

// The non-linear 4-bit formats: IQ4_NL and IQ4_XS map each nibble through a
// fixed 16-entry codebook, MXFP4 (OCP microscaling FP4, as in gpt-oss) through
// the doubled E2M1 values under a power-of-two E8M0 scale.

const (
	sizeIQ4NL = 18  // d f16, qs[16]
	sizeIQ4XS = 136 // d f16, scales_h u16, scales_l[4], qs[128]
	sizeMXFP4 = 17  // e u8, qs[16]
)

// kvaluesIQ4NL is ggml's kvalues_iq4nl codebook.
var kvaluesIQ4NL = [16]int8{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}

// kvaluesMXFP4 is ggml's kvalues_mxfp4: the E2M1 values times two (the
// scale is halved to match, see e8m0Half).
var kvaluesMXFP4 = [16]int8{0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}

// e8m0Half is GGML_E8M0_TO_FP32_HALF: 2^(e-128).
func e8m0Half(e uint8) float32 {
	if e < 2 {
		return math.Float32frombits(0x00200000 << e)
	}
	return math.Float32frombits(uint32(e-1) << 23)
}

func dequantIQ4NL(b []byte, y []float32) {
	d := f16At(b, 0)
	qs := b[2:18]
	y = y[:32]
	for j := 0; j < 16; j++ {
		y[j] = d * float32(kvaluesIQ4NL[qs[j]&0xf])
		y[j+16] = d * float32(kvaluesIQ4NL[qs[j]>>4])
	}
}

// iq4xsScale is the 6-bit scale (offset by 32) of 32-element group ib.
func iq4xsScale(b []byte, ib int) int32 {
	sh := binary.LittleEndian.Uint16(b[2:])
	lo := (b[4+ib/2] >> (4 * uint(ib%2))) & 0xf
	hi := byte(sh>>(2*uint(ib))) & 3
	return int32(lo | hi<<4)
}

func dequantIQ4XS(b []byte, y []float32) {
	d := f16At(b, 0)
	qs := b[8:136]
	y = y[:256]
	for ib := 0; ib < 8; ib++ {
		dl := d * float32(iq4xsScale(b, ib)-32)
		q := qs[16*ib : 16*ib+16]
		out := y[32*ib : 32*ib+32]
		for j := 0; j < 16; j++ {
			out[j] = dl * float32(kvaluesIQ4NL[q[j]&0xf])
			out[j+16] = dl * float32(kvaluesIQ4NL[q[j]>>4])
		}
	}
}

func dequantMXFP4(b []byte, y []float32) {
	d := e8m0Half(b[0])
	qs := b[1:17]
	y = y[:32]
	for j := 0; j < 16; j++ {
		y[j] = float32(kvaluesMXFP4[qs[j]&0xf]) * d
		y[j+16] = float32(kvaluesMXFP4[qs[j]>>4]) * d
	}
}

// bestIndexInt8 is ggml's best_index_int8: the index of the codebook entry
// nearest x (val sorted ascending), the upper one on ties. ggml bisects for
// the first entry above x; counting the entries at or below x finds the
// same one without the unpredictable branches.
func bestIndexInt8(val *[16]int8, x float32) int {
	// !(x > …) also catches NaN, which a tiny block's 1/d·x can produce
	// (found by FuzzQuantize; testdata/fuzz keeps the input).
	if !(x > float32(val[0])) {
		return 0
	}
	if x >= float32(val[15]) {
		return 15
	}
	mu := 0
	for _, v := range val[:15] {
		if float32(v) <= x {
			mu++
		}
	}
	if x-float32(val[mu-1]) < float32(val[mu])-x {
		return mu - 1
	}
	return mu
}

// quantIQ4 is quantize_row_iq4_nl_impl with ntry = 7 and no importance
// weights (w = x²), as quantize_iq4_nl and quantize_iq4_xs call it, which
// is what llama-quantize runs. super is 32 (IQ4_NL) or 256 (IQ4_XS); L
// receives codebook indices and scales the per-32 fits.
func quantIQ4(x []float32, L []uint8, scales []float32) (maxScale float32) {
	const ntry = 7
	var amaxScale float32
	for ib := range scales {
		xb := x[32*ib : 32*ib+32]
		Lb := L[32*ib : 32*ib+32]
		var weight [32]float32
		for j, v := range xb {
			weight[j] = float32(v * v)
		}
		amax, max := absMax(xb)
		if amax < groupMaxEps {
			scales[ib] = 0
			clear(Lb)
			continue
		}
		d := -max / float32(kvaluesIQ4NL[0])
		id := 1 / d
		var sumqx, sumq2 float32
		for j, v := range xb {
			l := bestIndexInt8(&kvaluesIQ4NL, float32(id*v))
			Lb[j] = uint8(l)
			q := float32(kvaluesIQ4NL[l])
			sumqx += float32(float32(weight[j]*q) * v)
			sumq2 += float32(float32(weight[j]*q) * q)
		}
		d = 0
		if sumq2 > 0 {
			d = sumqx / sumq2
		}
		best := float32(d * sumqx)
		for itry := -ntry; itry <= ntry; itry++ {
			id = float32(itry+int(kvaluesIQ4NL[0])) / max
			sumqx, sumq2 = 0, 0
			for j, v := range xb {
				q := float32(kvaluesIQ4NL[bestIndexInt8(&kvaluesIQ4NL, float32(id*v))])
				sumqx += float32(float32(weight[j]*q) * v)
				sumq2 += float32(float32(weight[j]*q) * q)
			}
			if sumq2 > 0 && float32(sumqx*sumqx) > float32(best*sumq2) {
				d = sumqx / sumq2
				best = float32(d * sumqx)
			}
		}
		scales[ib] = d
		if a := abs32(d); a > amaxScale {
			amaxScale, maxScale = a, d
		}
	}
	return maxScale
}

func packIQ4(L []uint8, qs []byte) {
	for i := 0; i < len(L)/32; i++ {
		for j := 0; j < 16; j++ {
			qs[16*i+j] = L[32*i+j] | L[32*i+16+j]<<4
		}
	}
}

func quantIQ4NL(x []float32, y []byte) {
	var L [32]uint8
	var scales [1]float32
	quantIQ4(x[:32], L[:], scales[:])
	putF16(y, 0, scales[0])
	id := inv(scales[0])
	for j, v := range x[:32] {
		L[j] = uint8(bestIndexInt8(&kvaluesIQ4NL, float32(id*v)))
	}
	packIQ4(L[:], y[2:18])
}

func quantIQ4XS(x []float32, y []byte) {
	var L [256]uint8
	var scales [8]float32
	maxScale := quantIQ4(x[:256], L[:], scales[:])
	d := -maxScale / 32
	putF16(y, 0, d)
	id := inv(d)
	var sh uint16
	sl := y[4:8]
	for ib := 0; ib < 8; ib++ {
		l := clampInt(nearestInt(float32(id*scales[ib])), -32, 31)
		dl := float32(d * float32(l))
		idl := inv(dl)
		for j, v := range x[32*ib : 32*ib+32] {
			L[32*ib+j] = uint8(bestIndexInt8(&kvaluesIQ4NL, float32(idl*v)))
		}
		l += 32
		if ib%2 == 0 {
			sl[ib/2] = byte(l & 0xf)
		} else {
			sl[ib/2] |= byte(l&0xf) << 4
		}
		sh |= uint16(l>>4) << (2 * uint(ib))
	}
	binary.LittleEndian.PutUint16(y[2:], sh)
	packIQ4(L[:], y[8:136])
}

// bestIndexMXFP4 is best_index_mxfp4: the first codebook entry whose value
// times e is nearest x.
func bestIndexMXFP4(x, e float32) uint8 {
	best := 0
	bestErr := abs32(float32(float32(kvaluesMXFP4[0])*e) - x)
	for i := 1; i < 16; i++ {
		if err := abs32(float32(float32(kvaluesMXFP4[i])*e) - x); err < bestErr {
			best, bestErr = i, err
		}
	}
	return uint8(best)
}

func quantMXFP4(x []float32, y []byte) {
	var amax float32
	for _, v := range x[:32] {
		amax = max(amax, abs32(v))
	}
	var e uint8
	if amax > 0 {
		// floorf(log2f(amax)) - 2 + 127; log2f is taken as the float32
		// rounding of the exact logarithm.
		lg := float32(math.Log2(float64(amax)))
		e = uint8(int32(float32(math.Floor(float64(lg))) - 2 + 127))
	}
	d := e8m0Half(e)
	y[0] = e
	qs := y[1:17]
	for j := 0; j < 16; j++ {
		qs[j] = bestIndexMXFP4(x[j], d) | bestIndexMXFP4(x[j+16], d)<<4
	}
}

// VecDotIQ4_NLQ8_0 is ggml_vec_dot_iq4_nl_q8_0.
func VecDotIQ4_NLQ8_0(n int, w, a []byte) float32 {
	var sumf float32
	for ib := 0; ib < n/QK; ib++ {
		x := w[ib*sizeIQ4NL:][:sizeIQ4NL]
		y := a[ib*sizeQ8_0:][:sizeQ8_0]
		d := float32(f16At(y, 0) * f16At(x, 0))
		var s1, s2 int32
		for j := 0; j < 16; j++ {
			s1 += int32(int8(y[2+j])) * int32(kvaluesIQ4NL[x[2+j]&0xf])
			s2 += int32(int8(y[2+j+16])) * int32(kvaluesIQ4NL[x[2+j]>>4])
		}
		sumf += float32(d * float32(s1+s2))
	}
	return sumf
}

// VecDotMXFP4Q8_0 is ggml_vec_dot_mxfp4_q8_0.
func VecDotMXFP4Q8_0(n int, w, a []byte) float32 {
	var sumf float32
	for ib := 0; ib < n/QK; ib++ {
		x := w[ib*sizeMXFP4:][:sizeMXFP4]
		y := a[ib*sizeQ8_0:][:sizeQ8_0]
		d := float32(f16At(y, 0) * e8m0Half(x[0]))
		var s1, s2 int32
		for j := 0; j < 16; j++ {
			s1 += int32(int8(y[2+j])) * int32(kvaluesMXFP4[x[1+j]&0xf])
			s2 += int32(int8(y[2+j+16])) * int32(kvaluesMXFP4[x[1+j]>>4])
		}
		sumf += float32(d * float32(s1+s2))
	}
	return sumf
}

// VecDotIQ4_XSQ8_K is ggml_vec_dot_iq4_xs_q8_K.
func VecDotIQ4_XSQ8_K(n int, w, a []byte) float32 {
	var sumf float32
	for ibl := 0; ibl < n/QKK; ibl++ {
		x := w[ibl*sizeIQ4XS:][:sizeIQ4XS]
		yd, q8 := q8K(a[ibl*sizeQ8K:][:sizeQ8K])
		d4d8 := float32(f16At(x, 0) * yd)
		qs := x[8:136]
		for ib := 0; ib < 8; ib++ {
			dl := float32(d4d8 * float32(iq4xsScale(x, ib)-32))
			var s1, s2 int32
			for j := 0; j < 16; j++ {
				s1 += int32(int8(q8[j])) * int32(kvaluesIQ4NL[qs[j]&0xf])
				s2 += int32(int8(q8[j+16])) * int32(kvaluesIQ4NL[qs[j]>>4])
			}
			sumf += float32(dl * float32(s1+s2))
			qs = qs[16:]
			q8 = q8[32:]
		}
	}
	return sumf
}
