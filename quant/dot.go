package quant

import (
	"encoding/binary"
	"fmt"
	"math"
)

// DotRef is the reference dot product of one stored row of type t with x:
// the row is dequantized block by block and the products summed in float64.
// row must hold at least RowSize(t, len(x)) bytes; a size mismatch is a
// programming error and panics. It does not allocate.
func DotRef(t Type, row []byte, x []float32) float32 {
	if err := checkRow("dot", t, len(x), len(row)); err != nil {
		panic(err)
	}
	var sum float64
	switch t {
	case F32:
		for i, v := range x {
			sum += float64(math.Float32frombits(binary.LittleEndian.Uint32(row[4*i:]))) * float64(v)
		}
	case F16:
		for i, v := range x {
			sum += float64(F16ToF32(binary.LittleEndian.Uint16(row[2*i:]))) * float64(v)
		}
	case BF16:
		for i, v := range x {
			sum += float64(BF16ToF32(binary.LittleEndian.Uint16(row[2*i:]))) * float64(v)
		}
	default:
		var buf [QKK]float32
		bs, ts := t.BlockSize(), t.TypeSize()
		for i := 0; i < len(x); i += bs {
			y := buf[:bs]
			dequantBlock(t, row[i/bs*ts:][:ts], y)
			for j, v := range x[i : i+bs] {
				sum += float64(y[j]) * float64(v)
			}
		}
	}
	return float32(sum)
}

// VecDotType is the activation type ggml pairs with weight type t in its
// quantized dot products (type_traits_cpu vec_dot_type): Q8_0 for
// Q4_0/Q5_0/Q8_0/IQ4_NL/MXFP4, Q8_1 for Q4_1/Q5_1, Q8_K for the K formats
// and IQ4_XS. Other types
// have none (ok false).
func VecDotType(t Type) (Type, bool) {
	switch t {
	case Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4:
		return Q8_0, true
	case Q4_1, Q5_1:
		return Q8_1, true
	case Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS:
		return Q8_K, true
	}
	return 0, false
}

// QuantizeQ8_0 quantizes activations to Q8_0 (quantize_row_q8_0_ref, the
// same bytes as Quantize(Q8_0, src)). len(src) must be a multiple of 32 and
// dst must hold RowSize(Q8_0, len(src)) bytes; otherwise it panics.
func QuantizeQ8_0(src []float32, dst []byte) {
	mustRow(Q8_0, len(src), len(dst))
	for i := 0; i < len(src); i += QK {
		quantQ8_0(src[i:i+QK], dst[i/QK*sizeQ8_0:])
	}
}

// QuantizeQ8_1 quantizes activations to Q8_1 (quantize_row_q8_1_ref): Q8_0
// plus s = d·Σq, which lets Q4_1/Q5_1 fold in their block minimum.
func QuantizeQ8_1(src []float32, dst []byte) {
	mustRow(Q8_1, len(src), len(dst))
	for i := 0; i < len(src); i += QK {
		quantQ8_1(src[i:i+QK], dst[i/QK*sizeQ8_1:])
	}
}

// QuantizeQ8_K quantizes activations to Q8_K (quantize_row_q8_K_ref): a
// float32 scale, 256 int8 levels in -127..127 and the sixteen 16-element sums
// (bsums) the K-quant dot products use for their minimums.
func QuantizeQ8_K(src []float32, dst []byte) {
	mustRow(Q8_K, len(src), len(dst))
	for i := 0; i < len(src); i += QKK {
		quantQ8K(src[i:i+QKK], dst[i/QKK*sizeQ8K:])
	}
}

// QuantizeActivations quantizes src to the activation type VecDotType(t)
// of weight type t, into dst (RowSize of that type). It panics on sizes
// that do not fit, or when t has no quantized dot product.
func QuantizeActivations(t Type, src []float32, dst []byte) {
	at, ok := VecDotType(t)
	if !ok {
		panic(fmt.Sprintf("quant: type %s has no quantized dot product", t))
	}
	switch at {
	case Q8_0:
		QuantizeQ8_0(src, dst)
	case Q8_1:
		QuantizeQ8_1(src, dst)
	default:
		QuantizeQ8_K(src, dst)
	}
}

// VecDot dispatches to the VecDot<T> function of weight type t; a holds the
// activations quantized to VecDotType(t). It panics for other types.
func VecDot(t Type, n int, w, a []byte) float32 {
	switch t {
	case Q4_0:
		return VecDotQ4_0Q8_0(n, w, a)
	case Q4_1:
		return VecDotQ4_1Q8_1(n, w, a)
	case Q5_0:
		return VecDotQ5_0Q8_0(n, w, a)
	case Q5_1:
		return VecDotQ5_1Q8_1(n, w, a)
	case Q8_0:
		return VecDotQ8_0Q8_0(n, w, a)
	case Q2_K:
		return VecDotQ2_KQ8_K(n, w, a)
	case Q3_K:
		return VecDotQ3_KQ8_K(n, w, a)
	case Q4_K:
		return VecDotQ4_KQ8_K(n, w, a)
	case Q5_K:
		return VecDotQ5_KQ8_K(n, w, a)
	case Q6_K:
		return VecDotQ6_KQ8_K(n, w, a)
	case IQ4_NL:
		return VecDotIQ4_NLQ8_0(n, w, a)
	case IQ4_XS:
		return VecDotIQ4_XSQ8_K(n, w, a)
	case MXFP4:
		return VecDotMXFP4Q8_0(n, w, a)
	}
	panic(fmt.Sprintf("quant: type %s has no quantized dot product", t))
}

func mustRow(t Type, n, have int) {
	need, err := RowSize(t, n)
	if err != nil {
		panic(fmt.Sprintf("quant: %v", err))
	}
	if have < need {
		panic(fmt.Sprintf("quant: %s: %d elements need %d bytes, have %d", t, n, need, have))
	}
}

const sizeQ8_1 = 36 // d f16, s f16, qs[32] int8

func quantQ8_1(x []float32, y []byte) {
	var amax float32
	for _, v := range x[:32] {
		amax = max(amax, abs32(v))
	}
	d := amax / 127
	id := inv(d)
	putF16(y, 0, d)
	qs := y[4:36]
	var sum int32
	for j := range qs {
		q := int8(roundf(float32(x[j] * id)))
		qs[j] = byte(q)
		sum += int32(q)
	}
	putF16(y, 2, float32(float32(sum)*d))
}

func dequantQ8_1(b []byte, y []float32) {
	d := f16At(b, 0)
	qs := b[4:36]
	y = y[:32]
	for j := range y {
		y[j] = float32(int8(qs[j])) * d
	}
}

// The VecDot functions below are ggml's *_generic dot products
// (ggml-cpu/quants.c), operation for operation, including the order of the
// float32 accumulations: integer sums per block, then one float32
// multiply-add per block (or per lane of eight for the K formats). n is the
// number of elements; w holds n/blocksize weight blocks and a the matching
// activation blocks. They are the reference SIMD kernels must reproduce.

// VecDotQ8_0Q8_0 is ggml_vec_dot_q8_0_q8_0.
func VecDotQ8_0Q8_0(n int, w, a []byte) float32 {
	var sumf float32
	for ib := 0; ib < n/QK; ib++ {
		x := w[ib*sizeQ8_0:][:sizeQ8_0]
		y := a[ib*sizeQ8_0:][:sizeQ8_0]
		var sumi int32
		for j := 0; j < 32; j++ {
			sumi += int32(int8(x[2+j])) * int32(int8(y[2+j]))
		}
		sumf += float32(float32(sumi) * float32(f16At(x, 0)*f16At(y, 0)))
	}
	return sumf
}

// VecDotQ4_0Q8_0 is ggml_vec_dot_q4_0_q8_0.
func VecDotQ4_0Q8_0(n int, w, a []byte) float32 {
	var sumf float32
	for ib := 0; ib < n/QK; ib++ {
		x := w[ib*sizeQ4_0:][:sizeQ4_0]
		y := a[ib*sizeQ8_0:][:sizeQ8_0]
		var sumi0, sumi1 int32
		for j := 0; j < 16; j++ {
			v0 := int32(x[2+j]&0xf) - 8
			v1 := int32(x[2+j]>>4) - 8
			sumi0 += v0 * int32(int8(y[2+j]))
			sumi1 += v1 * int32(int8(y[2+j+16]))
		}
		sumf += float32(float32(float32(sumi0+sumi1)*f16At(x, 0)) * f16At(y, 0))
	}
	return sumf
}

// VecDotQ4_1Q8_1 is ggml_vec_dot_q4_1_q8_1.
func VecDotQ4_1Q8_1(n int, w, a []byte) float32 {
	var sumf float32
	for ib := 0; ib < n/QK; ib++ {
		x := w[ib*sizeQ4_1:][:sizeQ4_1]
		y := a[ib*sizeQ8_1:][:sizeQ8_1]
		var sumi0, sumi1 int32
		for j := 0; j < 16; j++ {
			sumi0 += int32(x[4+j]&0xf) * int32(int8(y[4+j]))
			sumi1 += int32(x[4+j]>>4) * int32(int8(y[4+j+16]))
		}
		dd := float32(f16At(x, 0) * f16At(y, 0))
		sumf += float32(float32(dd*float32(sumi0+sumi1)) + float32(f16At(x, 2)*f16At(y, 2)))
	}
	return sumf
}

// VecDotQ5_0Q8_0 is ggml_vec_dot_q5_0_q8_0.
func VecDotQ5_0Q8_0(n int, w, a []byte) float32 {
	var sumf float32
	for ib := 0; ib < n/QK; ib++ {
		x := w[ib*sizeQ5_0:][:sizeQ5_0]
		y := a[ib*sizeQ8_0:][:sizeQ8_0]
		qh := binary.LittleEndian.Uint32(x[2:])
		qs := x[6:22]
		var sumi0, sumi1 int32
		for j := 0; j < 16; j++ {
			h0 := byte(qh>>j<<4) & 0x10
			h1 := byte(qh>>(j+12)) & 0x10
			x0 := int32(qs[j]&0xf|h0) - 16
			x1 := int32(qs[j]>>4|h1) - 16
			sumi0 += x0 * int32(int8(y[2+j]))
			sumi1 += x1 * int32(int8(y[2+j+16]))
		}
		sumf += float32(float32(f16At(x, 0)*f16At(y, 0)) * float32(sumi0+sumi1))
	}
	return sumf
}

// VecDotQ5_1Q8_1 is ggml_vec_dot_q5_1_q8_1.
func VecDotQ5_1Q8_1(n int, w, a []byte) float32 {
	var sumf float32
	for ib := 0; ib < n/QK; ib++ {
		x := w[ib*sizeQ5_1:][:sizeQ5_1]
		y := a[ib*sizeQ8_1:][:sizeQ8_1]
		qh := binary.LittleEndian.Uint32(x[4:])
		qs := x[8:24]
		var sumi0, sumi1 int32
		for j := 0; j < 16; j++ {
			h0 := byte(qh>>j<<4) & 0x10
			h1 := byte(qh>>(j+12)) & 0x10
			sumi0 += int32(qs[j]&0xf|h0) * int32(int8(y[4+j]))
			sumi1 += int32(qs[j]>>4|h1) * int32(int8(y[4+j+16]))
		}
		dd := float32(f16At(x, 0) * f16At(y, 0))
		sumf += float32(float32(dd*float32(sumi0+sumi1)) + float32(f16At(x, 2)*f16At(y, 2)))
	}
	return sumf
}

// q8K splits a Q8_K block into its scale and levels.
func q8K(b []byte) (d float32, qs []byte) {
	return math.Float32frombits(binary.LittleEndian.Uint32(b)), b[4:260]
}

// q8KBsum is the j-th 16-element sum of a Q8_K block.
func q8KBsum(b []byte, j int) int32 { return int32(int16(binary.LittleEndian.Uint16(b[260+2*j:]))) }

// VecDotQ2_KQ8_K is ggml_vec_dot_q2_K_q8_K.
func VecDotQ2_KQ8_K(n int, w, a []byte) float32 {
	var sumf float32
	for i := 0; i < n/QKK; i++ {
		x := w[i*sizeQ2K:][:sizeQ2K]
		ya := a[i*sizeQ8K:][:sizeQ8K]
		yd, q8 := q8K(ya)
		sc := x[0:16]
		q2 := x[16:80]
		var summs int32
		for j := 0; j < 16; j++ {
			summs += q8KBsum(ya, j) * int32(sc[j]>>4)
		}
		dall := float32(yd * f16At(x, 80))
		dmin := float32(yd * f16At(x, 82))
		var isum int32
		is := 0
		for k := 0; k < 2; k++ {
			shift := uint(0)
			for j := 0; j < 4; j++ {
				d := int32(sc[is] & 0xf)
				is++
				var isuml int32
				for l := 0; l < 16; l++ {
					isuml += int32(int8(q8[l])) * int32((q2[l]>>shift)&3)
				}
				isum += d * isuml
				d = int32(sc[is] & 0xf)
				is++
				isuml = 0
				for l := 16; l < 32; l++ {
					isuml += int32(int8(q8[l])) * int32((q2[l]>>shift)&3)
				}
				isum += d * isuml
				shift += 2
				q8 = q8[32:]
			}
			q2 = q2[32:]
		}
		sumf += float32(dall*float32(isum)) - float32(dmin*float32(summs))
	}
	return sumf
}

// VecDotQ3_KQ8_K is ggml_vec_dot_q3_K_q8_K.
func VecDotQ3_KQ8_K(n int, w, a []byte) float32 {
	var sums [8]float32
	var aux8 [QKK]int8
	for i := 0; i < n/QKK; i++ {
		x := w[i*sizeQ3K:][:sizeQ3K]
		yd, q8 := q8K(a[i*sizeQ8K:][:sizeQ8K])
		hm := x[0:32]
		q3 := x[32:96]
		m := byte(1)
		for j := 0; j < QKK; j += 128 {
			for s := uint(0); s < 8; s += 2 {
				out := aux8[j+int(s)*16:][:32]
				for l := range out {
					v := int8((q3[l] >> s) & 3)
					if hm[l]&m == 0 {
						v -= 4
					}
					out[l] = v
				}
				m <<= 1
			}
			q3 = q3[32:]
		}
		var sc [16]int8
		q3kScales(x[96:108], &sc)
		var aux32 [8]int32
		for j := 0; j < 16; j++ {
			scale := int32(sc[j]) - 32
			for half := 0; half < 2; half++ {
				base := 16*j + 8*half
				for l := 0; l < 8; l++ {
					aux32[l] += scale * int32(int16(int32(int8(q8[base+l]))*int32(aux8[base+l])))
				}
			}
		}
		d := float32(f16At(x, 108) * yd)
		for l := range sums {
			sums[l] += float32(d * float32(aux32[l]))
		}
	}
	var sumf float32
	for _, s := range sums {
		sumf += s
	}
	return sumf
}

// scalesMinsK4 unpacks all eight 6-bit scales and mins of a Q4_K/Q5_K block.
func scalesMinsK4(s []byte) (sc, mn [8]int32) {
	for j := 0; j < 8; j++ {
		a, b := scaleMinK4(j, s)
		sc[j], mn[j] = int32(a), int32(b)
	}
	return
}

// dotK8 is the shared tail of ggml's Q4_K/Q5_K/Q6_K × Q8_K dot products:
// eight int32 lanes, lane l collecting the elements ≡ l mod 8, each group of
// per elements weighted by its scale.
func dotK8(aux8 *[QKK]int8, q8 []byte, scale []int32, per int, aux32 *[8]int32) {
	for g := 0; g < QKK/per; g++ {
		s := scale[g]
		for k := 0; k < per; k += 8 {
			base := g*per + k
			for l := 0; l < 8; l++ {
				aux32[l] += s * int32(int16(int32(int8(q8[base+l]))*int32(aux8[base+l])))
			}
		}
	}
}

// VecDotQ4_KQ8_K is ggml_vec_dot_q4_K_q8_K.
func VecDotQ4_KQ8_K(n int, w, a []byte) float32 {
	var sums [8]float32
	var aux8 [QKK]int8
	var sumf float32
	for i := 0; i < n/QKK; i++ {
		x := w[i*sizeQ4K:][:sizeQ4K]
		ya := a[i*sizeQ8K:][:sizeQ8K]
		yd, q8 := q8K(ya)
		q4 := x[16:144]
		for j := 0; j < QKK; j += 64 {
			for l := 0; l < 32; l++ {
				aux8[j+l] = int8(q4[l] & 0xf)
				aux8[j+32+l] = int8(q4[l] >> 4)
			}
			q4 = q4[32:]
		}
		sc, mn := scalesMinsK4(x[4:16])
		var sumi int32
		for j := 0; j < 16; j++ {
			sumi += q8KBsum(ya, j) * mn[j/2]
		}
		var aux32 [8]int32
		dotK8(&aux8, q8, sc[:], 32, &aux32)
		d := float32(f16At(x, 0) * yd)
		for l := range sums {
			sums[l] += float32(d * float32(aux32[l]))
		}
		dmin := float32(f16At(x, 2) * yd)
		sumf -= float32(dmin * float32(sumi))
	}
	for _, s := range sums {
		sumf += s
	}
	return sumf
}

// VecDotQ5_KQ8_K is ggml_vec_dot_q5_K_q8_K.
func VecDotQ5_KQ8_K(n int, w, a []byte) float32 {
	var sums [8]float32
	var aux8 [QKK]int8
	var sumf float32
	for i := 0; i < n/QKK; i++ {
		x := w[i*sizeQ5K:][:sizeQ5K]
		ya := a[i*sizeQ8K:][:sizeQ8K]
		yd, q8 := q8K(ya)
		hm := x[16:48]
		q4 := x[48:176]
		m := byte(1)
		for j := 0; j < QKK; j += 64 {
			for l := 0; l < 32; l++ {
				lo, hi := int8(q4[l]&0xf), int8(q4[l]>>4)
				if hm[l]&m != 0 {
					lo += 16
				}
				if hm[l]&(m<<1) != 0 {
					hi += 16
				}
				aux8[j+l], aux8[j+32+l] = lo, hi
			}
			m <<= 2
			q4 = q4[32:]
		}
		sc, mn := scalesMinsK4(x[4:16])
		var sumi int32
		for j := 0; j < 16; j++ {
			sumi += q8KBsum(ya, j) * mn[j/2]
		}
		var aux32 [8]int32
		dotK8(&aux8, q8, sc[:], 32, &aux32)
		d := float32(f16At(x, 0) * yd)
		for l := range sums {
			sums[l] += float32(d * float32(aux32[l]))
		}
		dmin := float32(f16At(x, 2) * yd)
		sumf -= float32(dmin * float32(sumi))
	}
	for _, s := range sums {
		sumf += s
	}
	return sumf
}

// VecDotQ6_KQ8_K is ggml_vec_dot_q6_K_q8_K.
func VecDotQ6_KQ8_K(n int, w, a []byte) float32 {
	var sums [8]float32
	var aux8 [QKK]int8
	for i := 0; i < n/QKK; i++ {
		x := w[i*sizeQ6K:][:sizeQ6K]
		yd, q8 := q8K(a[i*sizeQ8K:][:sizeQ8K])
		ql := x[0:128]
		qh := x[128:192]
		scales := x[192:208]
		for j := 0; j < QKK; j += 128 {
			for l := 0; l < 32; l++ {
				aux8[j+l] = int8(ql[l]&0xf|((qh[l]>>0)&3)<<4) - 32
				aux8[j+l+32] = int8(ql[l+32]&0xf|((qh[l]>>2)&3)<<4) - 32
				aux8[j+l+64] = int8(ql[l]>>4|((qh[l]>>4)&3)<<4) - 32
				aux8[j+l+96] = int8(ql[l+32]>>4|((qh[l]>>6)&3)<<4) - 32
			}
			ql = ql[64:]
			qh = qh[32:]
		}
		var aux32 [8]int32
		var sc [16]int32
		for g := range sc {
			sc[g] = int32(int8(scales[g]))
		}
		dotK8(&aux8, q8, sc[:], 16, &aux32)
		d := float32(f16At(x, 208) * yd)
		for l := range sums {
			sums[l] += float32(d * float32(aux32[l]))
		}
	}
	var sumf float32
	for _, s := range sums {
		sumf += s
	}
	return sumf
}

// QuantizeQ8_0X86 quantizes activations to Q8_0 the way llama.cpp's x86
// build does (quantize_row_q8_0 for AVX/AVX2/AVX-512, the path behind its
// CPU logits): it multiplies by 127/max rather than by 1/d, and rounds half
// to even rather than away from zero, so a few levels differ from
// QuantizeQ8_0 (the reference). Use it to follow llama.cpp's numbers.
func QuantizeQ8_0X86(src []float32, dst []byte) {
	mustRow(Q8_0, len(src), len(dst))
	for i := 0; i < len(src); i += QK {
		quantQ8X86(src[i:i+QK], dst[i/QK*sizeQ8_0:][:sizeQ8_0], false)
	}
}

// QuantizeQ8_1X86 is QuantizeQ8_0X86 for Q8_1 (llama.cpp's x86
// quantize_row_q8_1).
func QuantizeQ8_1X86(src []float32, dst []byte) {
	mustRow(Q8_1, len(src), len(dst))
	for i := 0; i < len(src); i += QK {
		quantQ8X86(src[i:i+QK], dst[i/QK*sizeQ8_1:][:sizeQ8_1], true)
	}
}

func quantQ8X86(x []float32, y []byte, withSum bool) {
	var amax float32
	for _, v := range x[:32] {
		amax = max(amax, abs32(v))
	}
	d := amax / 127
	putF16(y, 0, d)
	var id float32
	if amax != 0 {
		id = 127 / amax
	}
	qs := y[2:34]
	if withSum {
		qs = y[4:36]
	}
	var sum int32
	for j := range qs {
		q := clampInt(nearestInt(float32(x[j]*id)), -128, 127) // packs saturate
		qs[j] = byte(int8(q))
		sum += q
	}
	if withSum {
		putF16(y, 2, float32(d*float32(sum)))
	}
}
