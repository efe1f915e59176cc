package quant

import (
	"encoding/binary"
	"fmt"
	"math"
)

// QK is the block size of the legacy formats (Q4_0 … Q8_0); QKK the
// super-block size of the K formats.
const (
	QK  = 32
	QKK = 256
)

// Block sizes in bytes (ggml-common.h); types.go holds the same numbers for
// lookup by type id.
const (
	sizeQ4_0 = 18  // d f16, qs[16]
	sizeQ4_1 = 20  // d f16, m f16, qs[16]
	sizeQ5_0 = 22  // d f16, qh[4], qs[16]
	sizeQ5_1 = 24  // d f16, m f16, qh[4], qs[16]
	sizeQ8_0 = 34  // d f16, qs[32] int8
	sizeQ2K  = 84  // scales[16], qs[64], d f16, dmin f16
	sizeQ3K  = 110 // hmask[32], qs[64], scales[12], d f16
	sizeQ4K  = 144 // d f16, dmin f16, scales[12], qs[128]
	sizeQ5K  = 176 // d f16, dmin f16, scales[12], qh[32], qs[128]
	sizeQ6K  = 210 // ql[128], qh[64], scales[16] int8, d f16
	sizeQ8K  = 292 // d f32, qs[256] int8, bsums[16] int16
)

func f16At(b []byte, off int) float32 { return F16ToF32(binary.LittleEndian.Uint16(b[off:])) }

// checkRow validates a (type, element count, byte count) triple coming from
// a caller or a file.
func checkRow(op string, t Type, n, have int) error {
	if !t.Supported() {
		return fmt.Errorf("quant: type %s not supported", t)
	}
	need, err := RowSize(t, n)
	if err != nil {
		return fmt.Errorf("quant: %s: %w", op, err)
	}
	if have < need {
		return fmt.Errorf("quant: %s %s: %d elements need %d bytes, have %d", op, t, n, need, have)
	}
	return nil
}

// Dequantize expands len(dst) elements of type t from src into dst.
// src must hold at least RowSize(t, len(dst)) bytes. The arithmetic is
// ggml's to_float, so results are bit-identical to ggml's.
func Dequantize(t Type, src []byte, dst []float32) error {
	if err := checkRow("dequantize", t, len(dst), len(src)); err != nil {
		return err
	}
	switch t {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case F16:
		src = src[:2*len(dst)]
		for i := range dst {
			dst[i] = F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case BF16:
		src = src[:2*len(dst)]
		for i := range dst {
			dst[i] = BF16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	default:
		bs, ts := t.BlockSize(), t.TypeSize()
		fn := blockDequant(t)
		for i := 0; i < len(dst); i += bs {
			fn(src[i/bs*ts:][:ts], dst[i:i+bs])
		}
	}
	return nil
}

// blockDequant returns the one-block expander of a block type.
func blockDequant(t Type) func(b []byte, y []float32) {
	switch t {
	case Q4_0:
		return dequantQ4_0
	case Q4_1:
		return dequantQ4_1
	case Q5_0:
		return dequantQ5_0
	case Q5_1:
		return dequantQ5_1
	case Q8_0:
		return dequantQ8_0
	case Q8_1:
		return dequantQ8_1
	case Q2_K:
		return dequantQ2K
	case Q3_K:
		return dequantQ3K
	case Q4_K:
		return dequantQ4K
	case Q5_K:
		return dequantQ5K
	case Q6_K:
		return dequantQ6K
	case Q8_K:
		return dequantQ8K
	case IQ4_NL:
		return dequantIQ4NL
	case IQ4_XS:
		return dequantIQ4XS
	case MXFP4:
		return dequantMXFP4
	case GQ4:
		return dequantGQ4
	case GQ8:
		return dequantGQ8
	}
	return nil
}

// dequantBlock expands one block with direct calls, so that a caller's
// stack buffer does not escape through a function value.
func dequantBlock(t Type, b []byte, y []float32) {
	switch t {
	case Q4_0:
		dequantQ4_0(b, y)
	case Q4_1:
		dequantQ4_1(b, y)
	case Q5_0:
		dequantQ5_0(b, y)
	case Q5_1:
		dequantQ5_1(b, y)
	case Q8_0:
		dequantQ8_0(b, y)
	case Q8_1:
		dequantQ8_1(b, y)
	case Q2_K:
		dequantQ2K(b, y)
	case Q3_K:
		dequantQ3K(b, y)
	case Q4_K:
		dequantQ4K(b, y)
	case Q5_K:
		dequantQ5K(b, y)
	case Q6_K:
		dequantQ6K(b, y)
	case Q8_K:
		dequantQ8K(b, y)
	case IQ4_NL:
		dequantIQ4NL(b, y)
	case IQ4_XS:
		dequantIQ4XS(b, y)
	case MXFP4:
		dequantMXFP4(b, y)
	case GQ4:
		dequantGQ4(b, y)
	case GQ8:
		dequantGQ8(b, y)
	}
}

// The per-block expanders below follow ggml's dequantize_row_* expression by
// expression; explicit float32 conversions keep Go from fusing a multiply and
// an add into one FMA, which would change the last bit.

func dequantQ4_0(b []byte, y []float32) {
	d := f16At(b, 0)
	qs := b[2:18]
	y = y[:32]
	for j := 0; j < 16; j++ {
		y[j] = float32(int32(qs[j]&0xf)-8) * d
		y[j+16] = float32(int32(qs[j]>>4)-8) * d
	}
}

func dequantQ4_1(b []byte, y []float32) {
	d, m := f16At(b, 0), f16At(b, 2)
	qs := b[4:20]
	y = y[:32]
	for j := 0; j < 16; j++ {
		y[j] = float32(float32(qs[j]&0xf)*d) + m
		y[j+16] = float32(float32(qs[j]>>4)*d) + m
	}
}

func dequantQ5_0(b []byte, y []float32) {
	d := f16At(b, 0)
	qh := binary.LittleEndian.Uint32(b[2:])
	qs := b[6:22]
	y = y[:32]
	for j := 0; j < 16; j++ {
		h0 := byte(qh>>j<<4) & 0x10
		h1 := byte(qh>>(j+12)) & 0x10
		y[j] = float32(int32(qs[j]&0xf|h0)-16) * d
		y[j+16] = float32(int32(qs[j]>>4|h1)-16) * d
	}
}

func dequantQ5_1(b []byte, y []float32) {
	d, m := f16At(b, 0), f16At(b, 2)
	qh := binary.LittleEndian.Uint32(b[4:])
	qs := b[8:24]
	y = y[:32]
	for j := 0; j < 16; j++ {
		h0 := byte(qh>>j<<4) & 0x10
		h1 := byte(qh>>(j+12)) & 0x10
		y[j] = float32(float32(qs[j]&0xf|h0)*d) + m
		y[j+16] = float32(float32(qs[j]>>4|h1)*d) + m
	}
}

func dequantQ8_0(b []byte, y []float32) {
	d := f16At(b, 0)
	qs := b[2:34]
	y = y[:32]
	for j := range y {
		y[j] = float32(int8(qs[j])) * d
	}
}

func dequantQ2K(b []byte, y []float32) {
	scales := b[0:16]
	q := b[16:80]
	d, dmin := f16At(b, 80), f16At(b, 82)
	y = y[:256]
	is := 0
	for n := 0; n < 256; n += 128 {
		shift := uint(0)
		for j := 0; j < 4; j++ {
			for half := 0; half < 2; half++ {
				sc := scales[is]
				is++
				dl := d * float32(sc&0xf)
				ml := dmin * float32(sc>>4)
				qq := q[16*half : 16*half+16]
				out := y[n+32*j+16*half:][:16]
				for l := range out {
					out[l] = float32(dl*float32((qq[l]>>shift)&3)) - ml
				}
			}
			shift += 2
		}
		q = q[32:]
	}
}

// q3kScales unpacks the twelve bytes of 6-bit Q3_K scales into 16 signed
// values (still offset by 32), as ggml's kmask shuffle does.
func q3kScales(s []byte, out *[16]int8) {
	for j := 0; j < 16; j++ {
		var lo byte
		if j < 8 {
			lo = s[j] & 0xf
		} else {
			lo = s[j-8] >> 4
		}
		hi := (s[8+j%4] >> (2 * uint(j/4))) & 3
		out[j] = int8(lo | hi<<4)
	}
}

func dequantQ3K(b []byte, y []float32) {
	hm := b[0:32]
	q := b[32:96]
	var sc [16]int8
	q3kScales(b[96:108], &sc)
	dAll := f16At(b, 108)
	y = y[:256]
	is := 0
	m := byte(1)
	for n := 0; n < 256; n += 128 {
		shift := uint(0)
		for j := 0; j < 4; j++ {
			for half := 0; half < 2; half++ {
				dl := dAll * float32(int32(sc[is])-32)
				is++
				qq := q[16*half : 16*half+16]
				hh := hm[16*half : 16*half+16]
				out := y[n+32*j+16*half:][:16]
				for l := range out {
					v := int32((qq[l] >> shift) & 3)
					if hh[l]&m == 0 {
						v -= 4
					}
					out[l] = dl * float32(v)
				}
			}
			shift += 2
			m <<= 1
		}
		q = q[32:]
	}
}

// scaleMinK4 unpacks the j-th 6-bit scale and min of Q4_K/Q5_K
// (get_scale_min_k4).
func scaleMinK4(j int, q []byte) (sc, m byte) {
	if j < 4 {
		return q[j] & 63, q[j+4] & 63
	}
	return q[j+4]&0xf | (q[j-4]>>6)<<4, q[j+4]>>4 | (q[j]>>6)<<4
}

func dequantQ4K(b []byte, y []float32) {
	d, dmin := f16At(b, 0), f16At(b, 2)
	scales := b[4:16]
	q := b[16:144]
	y = y[:256]
	for j, is := 0, 0; j < 256; j, is = j+64, is+2 {
		sc, m := scaleMinK4(is, scales)
		d1, m1 := d*float32(sc), dmin*float32(m)
		sc, m = scaleMinK4(is+1, scales)
		d2, m2 := d*float32(sc), dmin*float32(m)
		qq := q[:32]
		lo, hi := y[j:j+32], y[j+32:j+64]
		for l := range qq {
			lo[l] = float32(d1*float32(qq[l]&0xf)) - m1
			hi[l] = float32(d2*float32(qq[l]>>4)) - m2
		}
		q = q[32:]
	}
}

func dequantQ5K(b []byte, y []float32) {
	d, dmin := f16At(b, 0), f16At(b, 2)
	scales := b[4:16]
	qh := b[16:48]
	ql := b[48:176]
	y = y[:256]
	u1, u2 := byte(1), byte(2)
	for j, is := 0, 0; j < 256; j, is = j+64, is+2 {
		sc, m := scaleMinK4(is, scales)
		d1, m1 := d*float32(sc), dmin*float32(m)
		sc, m = scaleMinK4(is+1, scales)
		d2, m2 := d*float32(sc), dmin*float32(m)
		qq := ql[:32]
		lo, hi := y[j:j+32], y[j+32:j+64]
		for l := range qq {
			v1 := qq[l] & 0xf
			if qh[l]&u1 != 0 {
				v1 += 16
			}
			v2 := qq[l] >> 4
			if qh[l]&u2 != 0 {
				v2 += 16
			}
			lo[l] = float32(d1*float32(v1)) - m1
			hi[l] = float32(d2*float32(v2)) - m2
		}
		ql = ql[32:]
		u1 <<= 2
		u2 <<= 2
	}
}

func dequantQ6K(b []byte, y []float32) {
	ql := b[0:128]
	qh := b[128:192]
	sc := b[192:208]
	d := f16At(b, 208)
	y = y[:256]
	for n := 0; n < 256; n += 128 {
		out := y[n : n+128]
		for l := 0; l < 32; l++ {
			is := l / 16
			q1 := int32(ql[l]&0xf|((qh[l]>>0)&3)<<4) - 32
			q2 := int32(ql[l+32]&0xf|((qh[l]>>2)&3)<<4) - 32
			q3 := int32(ql[l]>>4|((qh[l]>>4)&3)<<4) - 32
			q4 := int32(ql[l+32]>>4|((qh[l]>>6)&3)<<4) - 32
			out[l] = float32(d*float32(int8(sc[is]))) * float32(q1)
			out[l+32] = float32(d*float32(int8(sc[is+2]))) * float32(q2)
			out[l+64] = float32(d*float32(int8(sc[is+4]))) * float32(q3)
			out[l+96] = float32(d*float32(int8(sc[is+6]))) * float32(q4)
		}
		ql = ql[64:]
		qh = qh[32:]
		sc = sc[8:]
	}
}

func dequantQ8K(b []byte, y []float32) {
	d := math.Float32frombits(binary.LittleEndian.Uint32(b))
	qs := b[4:260]
	y = y[:256]
	for j := range y {
		y[j] = d * float32(int8(qs[j]))
	}
}
