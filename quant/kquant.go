package quant

import "math"

// The K-quant reference quantizers, transcribed from ggml-quants.c
// (quantize_row_q{2..6}_K_ref and their helpers). Every float32 product is
// wrapped in an explicit conversion so that no Go compiler setting fuses it
// into an FMA: ggml's choices of scale hinge on last-bit comparisons, and
// llama-quantize's output is the reference we match byte for byte.

const groupMaxEps = 1e-15

// nearestInt is ggml's nearest_int: round half to even via the 1.5·2²³
// magic number, valid for |f| ≤ 2²²-1 (larger values give what ggml gives).
func nearestInt(f float32) int32 {
	v := f + 12582912
	return int32(math.Float32bits(v)&0x007fffff) - 0x00400000
}

func sqrt32(f float32) float32 { return float32(math.Sqrt(float64(f))) }

func clampInt(l, lo, hi int32) int32 { return max(lo, min(hi, l)) }

// makeQKX2Quants is make_qkx2_quants: an asymmetric (scale, min) fit of x
// to levels 0..nmax, searching nstep+1 candidate scales.
func makeQKX2Quants(nmax int32, x, weights []float32, L, Laux []uint8, rmin, rdelta float32, nstep int, useMad bool) (scale, theMin float32) {
	n := len(x)
	mn, mx := x[0], x[0]
	sumW := weights[0]
	sumX := float32(sumW * x[0])
	for i := 1; i < n; i++ {
		if x[i] < mn {
			mn = x[i]
		}
		if x[i] > mx {
			mx = x[i]
		}
		w := weights[i]
		sumW += w
		sumX += float32(w * x[i])
	}
	if mn > 0 {
		mn = 0
	}
	if mx == mn {
		clear(L[:n])
		return 0, -mn
	}
	fnmax := float32(nmax)
	iscale := fnmax / (mx - mn)
	scale = 1 / iscale
	var bestError float32
	for i := 0; i < n; i++ {
		l := nearestInt(float32(iscale * (x[i] - mn)))
		L[i] = uint8(clampInt(l, 0, nmax))
		diff := float32(float32(scale*float32(L[i]))+mn) - x[i]
		if useMad {
			diff = abs32(diff)
		} else {
			diff = float32(diff * diff)
		}
		bestError += float32(weights[i] * diff)
	}
	if nstep < 1 {
		return scale, -mn
	}
	for is := 0; is <= nstep; is++ {
		iscale = float32(rmin+float32(rdelta*float32(is))+fnmax) / (mx - mn)
		var sumL, sumL2, sumXL float32
		for i := 0; i < n; i++ {
			l := clampInt(nearestInt(float32(iscale*(x[i]-mn))), 0, nmax)
			Laux[i] = uint8(l)
			w := weights[i]
			fl := float32(l)
			sumL += float32(w * fl)
			sumL2 += float32(float32(w*fl) * fl)
			sumXL += float32(float32(w*fl) * x[i])
		}
		D := float32(sumW*sumL2) - float32(sumL*sumL)
		if D > 0 {
			thisScale := (float32(sumW*sumXL) - float32(sumX*sumL)) / D
			thisMin := (float32(sumL2*sumX) - float32(sumL*sumXL)) / D
			if thisMin > 0 {
				thisMin = 0
				thisScale = sumXL / sumL2
			}
			var curError float32
			for i := 0; i < n; i++ {
				diff := float32(float32(thisScale*float32(Laux[i]))+thisMin) - x[i]
				if useMad {
					diff = abs32(diff)
				} else {
					diff = float32(diff * diff)
				}
				curError += float32(weights[i] * diff)
			}
			if curError < bestError {
				copy(L[:n], Laux[:n])
				bestError = curError
				scale = thisScale
				mn = thisMin
			}
		}
	}
	return scale, -mn
}

// makeQ3Quants is make_q3_quants with do_rmse: a symmetric fit to
// -nmax..nmax-1 refined by coordinate descent. L receives l+nmax.
func makeQ3Quants(nmax int32, x []float32, L []int8) float32 {
	n := len(x)
	amax, max := absMax(x)
	if amax < groupMaxEps {
		clear(L[:n])
		return 0
	}
	iscale := float32(-nmax) / max
	var sumlx, suml2 float32
	for i := 0; i < n; i++ {
		l := clampInt(nearestInt(float32(iscale*x[i])), -nmax, nmax-1)
		L[i] = int8(l)
		w := float32(x[i] * x[i])
		fl := float32(l)
		sumlx += float32(float32(w*x[i]) * fl)
		suml2 += float32(float32(w*fl) * fl)
	}
	for itry := 0; itry < 5; itry++ {
		nChanged := 0
		for i := 0; i < n; i++ {
			w := float32(x[i] * x[i])
			fL := float32(L[i])
			slx := sumlx - float32(float32(w*x[i])*fL)
			if slx > 0 {
				sl2 := suml2 - float32(float32(w*fL)*fL)
				newL := clampInt(nearestInt(float32(x[i]*sl2)/slx), -nmax, nmax-1)
				if newL != int32(L[i]) {
					fn := float32(newL)
					slx += float32(float32(w*x[i]) * fn)
					sl2 += float32(float32(w*fn) * fn)
					if sl2 > 0 && float32(float32(slx*slx)*suml2) > float32(float32(sumlx*sumlx)*sl2) {
						L[i] = int8(newL)
						sumlx = slx
						suml2 = sl2
						nChanged++
					}
				}
			}
		}
		if nChanged == 0 {
			break
		}
	}
	for i := 0; i < n; i++ {
		L[i] += int8(nmax)
	}
	if suml2 > 0 {
		return sumlx / suml2
	}
	return 0
}

// makeQXQuants is make_qx_quants with rmse_type 1 and no importance
// weights (w = x²), the form quantize_row_q6_K_ref uses. L receives l+nmax.
func makeQXQuants(nmax int32, x []float32, L []int8) float32 {
	n := len(x)
	amax, max := absMax(x)
	if amax < groupMaxEps {
		clear(L[:n])
		return 0
	}
	fnmax := float32(nmax)
	iscale := float32(-nmax) / max
	var sumlx, suml2 float32
	for i := 0; i < n; i++ {
		l := clampInt(nearestInt(float32(iscale*x[i])), -nmax, nmax-1)
		L[i] = int8(l + nmax)
		w := float32(x[i] * x[i])
		fl := float32(l)
		sumlx += float32(float32(w*x[i]) * fl)
		suml2 += float32(float32(w*fl) * fl)
	}
	var scale float32
	if suml2 != 0 {
		scale = sumlx / suml2
	}
	best := float32(scale * sumlx)
	for is := -9; is <= 9; is++ {
		if is == 0 {
			continue
		}
		iscale = -float32(fnmax+float32(0.1*float32(is))) / max
		sumlx, suml2 = 0, 0
		for i := 0; i < n; i++ {
			l := clampInt(nearestInt(float32(iscale*x[i])), -nmax, nmax-1)
			w := float32(x[i] * x[i])
			fl := float32(l)
			sumlx += float32(float32(w*x[i]) * fl)
			suml2 += float32(float32(w*fl) * fl)
		}
		if suml2 > 0 && float32(sumlx*sumlx) > float32(best*suml2) {
			for i := 0; i < n; i++ {
				l := clampInt(nearestInt(float32(iscale*x[i])), -nmax, nmax-1)
				L[i] = int8(nmax + l)
			}
			scale = sumlx / suml2
			best = float32(scale * sumlx)
		}
	}
	return scale
}

// packK2 packs 256 2-bit levels as Q2_K/Q3_K do: byte l of each 32-byte
// group holds elements l, l+32, l+64, l+96 of its 128-element half.
func packK2(L *[256]uint8, qs []byte) {
	for j := 0; j < 256; j += 128 {
		for l := 0; l < 32; l++ {
			qs[j/4+l] = L[j+l] | L[j+l+32]<<2 | L[j+l+64]<<4 | L[j+l+96]<<6
		}
	}
}

func quantQ2K(x []float32, y []byte) {
	var L [256]uint8
	var Laux [16]uint8
	var weights [16]float32
	var mins, scales [16]float32
	const q4scale = 15
	var maxScale, maxMin float32
	for j := 0; j < 16; j++ {
		xb := x[16*j : 16*j+16]
		for l, v := range xb {
			weights[l] = abs32(v)
		}
		scales[j], mins[j] = makeQKX2Quants(3, xb, weights[:], L[16*j:16*j+16], Laux[:], -0.5, 0.1, 15, true)
		maxScale = max(maxScale, scales[j])
		maxMin = max(maxMin, mins[j])
	}
	sc := y[0:16]
	if maxScale > 0 {
		iscale := q4scale / maxScale
		for j := range sc {
			sc[j] = byte(nearestInt(float32(iscale * scales[j])))
		}
		putF16(y, 80, maxScale/q4scale)
	} else {
		clear(sc)
		putF16(y, 80, 0)
	}
	if maxMin > 0 {
		iscale := q4scale / maxMin
		for j := range sc {
			sc[j] |= byte(nearestInt(float32(iscale*mins[j])) << 4)
		}
		putF16(y, 82, maxMin/q4scale)
	} else {
		putF16(y, 82, 0)
	}
	dAll, dMin := f16At(y, 80), f16At(y, 82)
	for j := 0; j < 16; j++ {
		d := float32(dAll * float32(sc[j]&0xf))
		if d == 0 {
			continue
		}
		dm := float32(dMin * float32(sc[j]>>4))
		for ii := 0; ii < 16; ii++ {
			l := nearestInt((x[16*j+ii] + dm) / d)
			L[16*j+ii] = uint8(clampInt(l, 0, 3))
		}
	}
	packK2(&L, y[16:80])
}

func quantQ3K(x []float32, y []byte) {
	var L [256]int8
	var scales [16]float32
	var maxScale, amax float32
	for j := 0; j < 16; j++ {
		scales[j] = makeQ3Quants(4, x[16*j:16*j+16], L[16*j:16*j+16])
		if s := abs32(scales[j]); s > amax {
			amax, maxScale = s, scales[j]
		}
	}
	ys := y[96:108]
	clear(ys)
	if maxScale != 0 {
		iscale := -32 / maxScale
		for j := 0; j < 16; j++ {
			l := int8(nearestInt(float32(iscale * scales[j])))
			l = int8(clampInt(int32(l), -32, 31)) + 32
			if j < 8 {
				ys[j] = byte(l) & 0xf
			} else {
				ys[j-8] |= (byte(l) & 0xf) << 4
			}
			l >>= 4
			ys[j%4+8] |= byte(l) << (2 * uint(j/4))
		}
		putF16(y, 108, 1/iscale)
	} else {
		putF16(y, 108, 0)
	}
	dAll := f16At(y, 108)
	var sc [16]int8
	q3kScales(ys, &sc)
	for j := 0; j < 16; j++ {
		d := float32(dAll * float32(int32(sc[j])-32))
		if d == 0 {
			continue
		}
		for ii := 0; ii < 16; ii++ {
			l := clampInt(nearestInt(x[16*j+ii]/d), -4, 3)
			L[16*j+ii] = int8(l + 4)
		}
	}
	hmask := y[0:32]
	clear(hmask)
	var U [256]uint8
	m, hm := 0, byte(1)
	for j := 0; j < 256; j++ {
		v := uint8(L[j])
		if v > 3 {
			hmask[m] |= hm
			v -= 4
		}
		U[j] = v
		if m++; m == 32 {
			m, hm = 0, hm<<1
		}
	}
	packK2(&U, y[32:96])
}

// kWeights fills the Q4_K/Q5_K reference weights of one 32-element
// sub-block: rms of the sub-block plus |x|.
func kWeights(xb []float32, w *[32]float32) {
	var sumX2 float32
	for _, v := range xb {
		sumX2 += float32(v * v)
	}
	avX := sqrt32(sumX2 / 32)
	for l, v := range xb {
		w[l] = avX + abs32(v)
	}
}

// packScaleMinK4 stores eight 6-bit scales and mins in the 12-byte Q4_K/Q5_K
// layout that scaleMinK4 reads back.
func packScaleMinK4(ls, lm *[8]uint8, s []byte) {
	for j := 0; j < 8; j++ {
		if j < 4 {
			s[j] = ls[j]
			s[j+4] = lm[j]
		} else {
			s[j+4] = ls[j]&0xf | (lm[j]&0xf)<<4
			s[j-4] |= (ls[j] >> 4) << 6
			s[j] |= (lm[j] >> 4) << 6
		}
	}
}

// quantK45 is the part quantize_row_q4_K_ref and quantize_row_q5_K_ref
// share: per-sub-block fits, 6-bit scale/min codes, then the final levels
// recomputed from the rounded scales. It fills L and the 16-byte header.
func quantK45(x []float32, y []byte, L *[256]uint8, nmax int32, rmin, rdelta float32, nstep int) {
	var Laux [32]uint8
	var weights [32]float32
	var mins, scales [8]float32
	var maxScale, maxMin float32
	for j := 0; j < 8; j++ {
		xb := x[32*j : 32*j+32]
		kWeights(xb, &weights)
		scales[j], mins[j] = makeQKX2Quants(nmax, xb, weights[:], L[32*j:32*j+32], Laux[:], rmin, rdelta, nstep, false)
		maxScale = max(maxScale, scales[j])
		maxMin = max(maxMin, mins[j])
	}
	var invScale, invMin float32
	if maxScale > 0 {
		invScale = 63 / maxScale
	}
	if maxMin > 0 {
		invMin = 63 / maxMin
	}
	var ls, lm [8]uint8
	for j := 0; j < 8; j++ {
		ls[j] = min(63, uint8(nearestInt(float32(invScale*scales[j]))))
		lm[j] = min(63, uint8(nearestInt(float32(invMin*mins[j]))))
	}
	packScaleMinK4(&ls, &lm, y[4:16])
	putF16(y, 0, maxScale/63)
	putF16(y, 2, maxMin/63)
	d0, dmin := f16At(y, 0), f16At(y, 2)
	for j := 0; j < 8; j++ {
		sc, m := scaleMinK4(j, y[4:16])
		d := float32(d0 * float32(sc))
		if d == 0 {
			continue
		}
		dm := float32(dmin * float32(m))
		for ii := 0; ii < 32; ii++ {
			l := nearestInt((x[32*j+ii] + dm) / d)
			L[32*j+ii] = uint8(clampInt(l, 0, nmax))
		}
	}
}

func quantQ4K(x []float32, y []byte) {
	var L [256]uint8
	quantK45(x, y, &L, 15, -1, 0.1, 20)
	q := y[16:144]
	for j := 0; j < 256; j += 64 {
		for l := 0; l < 32; l++ {
			q[l] = L[j+l] | L[j+l+32]<<4
		}
		q = q[32:]
	}
}

func quantQ5K(x []float32, y []byte) {
	var L [256]uint8
	quantK45(x, y, &L, 31, -0.5, 0.1, 15)
	qh := y[16:48]
	ql := y[48:176]
	clear(qh)
	m1, m2 := byte(1), byte(2)
	for n := 0; n < 256; n += 64 {
		for j := 0; j < 32; j++ {
			l1 := L[n+j]
			if l1 > 15 {
				l1 -= 16
				qh[j] |= m1
			}
			l2 := L[n+j+32]
			if l2 > 15 {
				l2 -= 16
				qh[j] |= m2
			}
			ql[j] = l1 | l2<<4
		}
		m1 <<= 2
		m2 <<= 2
		ql = ql[32:]
	}
}

func quantQ6K(x []float32, y []byte) {
	var L [256]int8
	var scales [16]float32
	var maxScale, maxAbsScale float32
	for ib := 0; ib < 16; ib++ {
		s := makeQXQuants(32, x[16*ib:16*ib+16], L[16*ib:16*ib+16])
		scales[ib] = s
		if a := abs32(s); a > maxAbsScale {
			maxAbsScale, maxScale = a, s
		}
	}
	if maxAbsScale < groupMaxEps {
		clear(y[:sizeQ6K])
		return
	}
	iscale := -128 / maxScale
	putF16(y, 208, 1/iscale)
	sc := y[192:208]
	for ib := range sc {
		sc[ib] = byte(int8(min(127, nearestInt(float32(iscale*scales[ib])))))
	}
	d0 := f16At(y, 208)
	for j := 0; j < 16; j++ {
		d := float32(d0 * float32(int8(sc[j])))
		if d == 0 {
			continue
		}
		for ii := 0; ii < 16; ii++ {
			l := clampInt(nearestInt(x[16*j+ii]/d), -32, 31)
			L[16*j+ii] = int8(l + 32)
		}
	}
	ql := y[0:128]
	qh := y[128:192]
	for j := 0; j < 256; j += 128 {
		for l := 0; l < 32; l++ {
			q1 := uint8(L[j+l]) & 0xf
			q2 := uint8(L[j+l+32]) & 0xf
			q3 := uint8(L[j+l+64]) & 0xf
			q4 := uint8(L[j+l+96]) & 0xf
			ql[l] = q1 | q3<<4
			ql[l+32] = q2 | q4<<4
			qh[l] = uint8(L[j+l])>>4 | (uint8(L[j+l+32])>>4)<<2 | (uint8(L[j+l+64])>>4)<<4 | (uint8(L[j+l+96])>>4)<<6
		}
		ql = ql[64:]
		qh = qh[32:]
	}
}
