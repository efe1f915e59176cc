package cluster

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"

	"pagoda/executor"
	"pagoda/kernels"
)

// WireDType is the form activations take between workers: the tensor-
// parallel collectives' payloads and a pipeline's hidden states. f16 and
// bf16 halve the bytes; the values are rounded once, when they leave a
// worker, and all arithmetic (the all-reduce's sum included) stays f32.
type WireDType uint8

const (
	WireF32 WireDType = iota
	WireF16
	WireBF16
)

// ParseWireDType reads "f32", "f16" or "bf16" ("" is f32).
func ParseWireDType(s string) (WireDType, error) {
	switch s {
	case "", "f32":
		return WireF32, nil
	case "f16":
		return WireF16, nil
	case "bf16":
		return WireBF16, nil
	}
	return 0, fmt.Errorf("wire dtype %q (want f32, f16 or bf16)", s)
}

func (d WireDType) String() string {
	switch d {
	case WireF32:
		return "f32"
	case WireF16:
		return "f16"
	case WireBF16:
		return "bf16"
	}
	return fmt.Sprintf("wire dtype %d", uint8(d))
}

// Size is the bytes one value takes on the wire.
func (d WireDType) Size() int {
	if d == WireF32 {
		return 4
	}
	return 2
}

// codec converts between f32 rows and their wire form; it keeps its
// scratch, so each user (a mesh, a stage) has its own.
type codec struct {
	d    WireDType
	half []uint16
}

// littleEndian: the host's memory order is the wire's, so rows go to and
// from the wire as bulk copies of their bytes instead of value by value
// (which cost twice what TCP itself does on loopback).
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// appendFloats appends x in the wire form.
func (c *codec) appendFloats(dst []byte, x []float32) []byte {
	switch c.d {
	case WireF32:
		if littleEndian && len(x) > 0 {
			return append(dst, unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), 4*len(x))...)
		}
		for _, v := range x {
			dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(v))
		}
		return dst
	case WireF16:
		c.half = growHalf(c.half, len(x))
		kernels.F32ToF16Row(c.half, x)
	default:
		c.half = growHalf(c.half, len(x))
		kernels.F32ToBF16Row(c.half, x)
	}
	if littleEndian && len(c.half) > 0 {
		return append(dst, unsafe.Slice((*byte)(unsafe.Pointer(&c.half[0])), 2*len(c.half))...)
	}
	for _, h := range c.half {
		dst = binary.LittleEndian.AppendUint16(dst, h)
	}
	return dst
}

// decode reads len(dst) values of the wire form from p.
func (c *codec) decode(dst []float32, p []byte) {
	if c.d == WireF32 {
		if littleEndian && len(dst) > 0 {
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 4*len(dst)), p[:4*len(dst)])
			return
		}
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(p[4*i:]))
		}
		return
	}
	c.half = growHalf(c.half, len(dst))
	if littleEndian && len(dst) > 0 {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&c.half[0])), 2*len(dst)), p[:2*len(dst)])
	} else {
		for i := range c.half {
			c.half[i] = binary.LittleEndian.Uint16(p[2*i:])
		}
	}
	if c.d == WireF16 {
		kernels.F16ToF32Row(dst, c.half)
	} else {
		kernels.BF16ToF32Row(dst, c.half)
	}
}

// round replaces x by what the wire would carry of it: a rank rounds its
// own contribution as the others receive it, so every rank sums the same
// numbers and holds the same bits.
func (c *codec) round(x []float32) {
	switch c.d {
	case WireF16:
		c.half = growHalf(c.half, len(x))
		kernels.F32ToF16Row(c.half, x)
		kernels.F16ToF32Row(x, c.half)
	case WireBF16:
		c.half = growHalf(c.half, len(x))
		kernels.F32ToBF16Row(c.half, x)
		kernels.BF16ToF32Row(x, c.half)
	}
}

func growHalf(s []uint16, n int) []uint16 {
	if cap(s) < n {
		return make([]uint16, n)
	}
	return s[:n]
}

// kindHidden marks a pipeline hand-off in a 16-bit wire form: 'h', u8
// dtype, u32 n, n 16-bit values. An f32 hand-off is an executor output
// frame, as before, so its bits are exact.
const kindHidden = 'h'

// appendHidden encodes a stage's hidden states for the next stage.
func (c *codec) appendHidden(dst []byte, hidden []float32) []byte {
	if c.d == WireF32 {
		return executor.AppendOutput(dst, &executor.StepOutput{Logits: hidden})
	}
	dst = append(dst, kindHidden, byte(c.d))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(hidden)))
	return c.appendFloats(dst, hidden)
}

// decodeHidden decodes what appendHidden (or executor.AppendError) wrote
// into out.Logits.
func (c *codec) decodeHidden(p []byte, out *executor.StepOutput) error {
	if len(p) == 0 || p[0] != kindHidden {
		if c.d != WireF32 && len(p) > 0 && p[0] != 'E' {
			return fmt.Errorf("hidden states in f32, this stage expects %s on the wire", c.d)
		}
		return executor.DecodeOutput(p, out)
	}
	if len(p) < 6 {
		return fmt.Errorf("hidden states truncated (%d bytes)", len(p))
	}
	if d := WireDType(p[1]); d != c.d {
		return fmt.Errorf("hidden states in %s, this stage expects %s on the wire", d, c.d)
	}
	n := int(binary.LittleEndian.Uint32(p[2:]))
	if n > maxFloats || len(p)-6 != n*c.d.Size() {
		return fmt.Errorf("hidden states of %d values in %d bytes", n, len(p)-6)
	}
	out.Logits = grow(out.Logits, n)
	c.decode(out.Logits, p[6:])
	return nil
}
