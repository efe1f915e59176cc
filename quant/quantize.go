package quant

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Quantize encodes src as type t with llama.cpp's reference quantizers
// (quantize_row_*_ref, no importance matrix), which is what llama-quantize
// runs without --imatrix; for IQ4_NL and IQ4_XS it is quantize_iq4_nl/xs
// without weights, again what llama-quantize runs. len(src) must be a whole
// number of blocks.
func Quantize(t Type, src []float32) ([]byte, error) {
	if !t.Supported() {
		return nil, fmt.Errorf("quant: type %s not supported", t)
	}
	n, err := RowSize(t, len(src))
	if err != nil {
		return nil, fmt.Errorf("quant: quantize: %w", err)
	}
	dst := make([]byte, n)
	if err := QuantizeInto(t, src, dst); err != nil {
		return nil, err
	}
	return dst, nil
}

// QuantizeInto is Quantize writing into dst, which must hold at least
// RowSize(t, len(src)) bytes. Block types reject NaN and ±Inf inputs: ggml's
// quantizers have no defined result for them.
func QuantizeInto(t Type, src []float32, dst []byte) error {
	if err := checkRow("quantize", t, len(src), len(dst)); err != nil {
		return err
	}
	switch t {
	case F32:
		for i, v := range src {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
		}
		return nil
	case F16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], F32ToF16(v))
		}
		return nil
	case BF16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], F32ToBF16(v))
		}
		return nil
	}
	for i, v := range src {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return fmt.Errorf("quant: quantize %s: element %d is %v", t, i, v)
		}
	}
	bs, ts := t.BlockSize(), t.TypeSize()
	var fn func(x []float32, y []byte)
	switch t {
	case Q4_0:
		fn = quantQ4_0
	case Q4_1:
		fn = quantQ4_1
	case Q5_0:
		fn = quantQ5_0
	case Q5_1:
		fn = quantQ5_1
	case Q8_0:
		fn = quantQ8_0
	case Q8_1:
		fn = quantQ8_1
	case Q2_K:
		fn = quantQ2K
	case Q3_K:
		fn = quantQ3K
	case Q4_K:
		fn = quantQ4K
	case Q5_K:
		fn = quantQ5K
	case Q6_K:
		fn = quantQ6K
	case Q8_K:
		fn = quantQ8K
	case IQ4_NL:
		fn = quantIQ4NL
	case IQ4_XS:
		fn = quantIQ4XS
	case MXFP4:
		fn = quantMXFP4
	default:
		return fmt.Errorf("quant: type %s not supported", t)
	}
	for i := 0; i < len(src); i += bs {
		fn(src[i:i+bs], dst[i/bs*ts:][:ts])
	}
	return nil
}

func putF16(b []byte, off int, f float32) { binary.LittleEndian.PutUint16(b[off:], F32ToF16(f)) }

// inv is ggml's `d ? 1.0f/d : 0.0f`.
func inv(d float32) float32 {
	if d == 0 {
		return 0
	}
	return 1 / d
}

// absMax returns the largest |v| and the signed value that has it (the first
// one on ties), as the q4_0/q5_0 loops find them.
func absMax(x []float32) (amax, max float32) {
	for _, v := range x {
		if a := abs32(v); amax < a {
			amax, max = a, v
		}
	}
	return
}

func abs32(v float32) float32 { return math.Float32frombits(math.Float32bits(v) &^ (1 << 31)) }

func minMax(x []float32) (min, max float32) {
	min, max = math.MaxFloat32, -math.MaxFloat32
	for _, v := range x {
		if v < min {
			min = v
		}
		if v > max {
			max = v
		}
	}
	return
}

// roundf is C's roundf (half away from zero) to an integer, for
// |v| < 2²³; v - trunc(v) is exact there, so the comparison is too.
func roundf(v float32) int32 {
	i := int32(v)
	f := v - float32(i)
	if f >= 0.5 {
		i++
	} else if f <= -0.5 {
		i--
	}
	return i
}

// truncInt is C's float→int conversion (toward zero) for in-range values.
func truncInt(f float32) int32 { return int32(f) }

func quantQ4_0(x []float32, y []byte) {
	_, max := absMax(x[:32])
	d := max / -8
	id := inv(d)
	putF16(y, 0, d)
	qs := y[2:18]
	for j := 0; j < 16; j++ {
		x0 := float32(x[j] * id)
		x1 := float32(x[j+16] * id)
		xi0 := min(15, truncInt(x0+8.5))
		xi1 := min(15, truncInt(x1+8.5))
		qs[j] = byte(xi0) | byte(xi1)<<4
	}
}

func quantQ4_1(x []float32, y []byte) {
	mn, mx := minMax(x[:32])
	d := (mx - mn) / 15
	id := inv(d)
	putF16(y, 0, d)
	putF16(y, 2, mn)
	qs := y[4:20]
	for j := 0; j < 16; j++ {
		x0 := float32((x[j] - mn) * id)
		x1 := float32((x[j+16] - mn) * id)
		xi0 := min(15, truncInt(x0+0.5))
		xi1 := min(15, truncInt(x1+0.5))
		qs[j] = byte(xi0) | byte(xi1)<<4
	}
}

func quantQ5_0(x []float32, y []byte) {
	_, max := absMax(x[:32])
	d := max / -16
	id := inv(d)
	putF16(y, 0, d)
	qs := y[6:22]
	var qh uint32
	for j := 0; j < 16; j++ {
		x0 := float32(x[j] * id)
		x1 := float32(x[j+16] * id)
		xi0 := byte(min(31, truncInt(x0+16.5)))
		xi1 := byte(min(31, truncInt(x1+16.5)))
		qs[j] = xi0&0xf | (xi1&0xf)<<4
		qh |= uint32(xi0&0x10) >> 4 << j
		qh |= uint32(xi1&0x10) >> 4 << (j + 16)
	}
	binary.LittleEndian.PutUint32(y[2:], qh)
}

func quantQ5_1(x []float32, y []byte) {
	mn, mx := minMax(x[:32])
	d := (mx - mn) / 31
	id := inv(d)
	putF16(y, 0, d)
	putF16(y, 2, mn)
	qs := y[8:24]
	var qh uint32
	for j := 0; j < 16; j++ {
		x0 := float32((x[j] - mn) * id)
		x1 := float32((x[j+16] - mn) * id)
		xi0 := byte(truncInt(x0 + 0.5))
		xi1 := byte(truncInt(x1 + 0.5))
		qs[j] = xi0&0xf | (xi1&0xf)<<4
		qh |= uint32(xi0&0x10) >> 4 << j
		qh |= uint32(xi1&0x10) >> 4 << (j + 16)
	}
	binary.LittleEndian.PutUint32(y[4:], qh)
}

func quantQ8_0(x []float32, y []byte) {
	var amax float32
	for _, v := range x[:32] {
		amax = max(amax, abs32(v))
	}
	d := amax / 127
	id := inv(d)
	putF16(y, 0, d)
	qs := y[2:34]
	for j := range qs {
		qs[j] = byte(roundf(float32(x[j] * id)))
	}
}

func quantQ8K(x []float32, y []byte) {
	amax, max := absMax(x[:256])
	qs := y[4:260]
	if amax == 0 {
		clear(y[:sizeQ8K])
		return
	}
	iscale := -127 / max
	for j := range qs {
		qs[j] = byte(int8(min(127, nearestInt(float32(iscale*x[j])))))
	}
	for j := 0; j < 16; j++ {
		var sum int32
		for _, q := range qs[16*j : 16*j+16] {
			sum += int32(int8(q))
		}
		binary.LittleEndian.PutUint16(y[260+2*j:], uint16(int16(sum)))
	}
	binary.LittleEndian.PutUint32(y, math.Float32bits(1/iscale))
}
