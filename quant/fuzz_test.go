package quant

import (
	"encoding/binary"
	"math"
	"testing"
)

var fuzzTypes = []Type{F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_NL, IQ4_XS, MXFP4}

// FuzzDequantize feeds arbitrary bytes (as from a corrupt file) to every
// format: no panics, and short sources are errors.
func FuzzDequantize(f *testing.F) {
	f.Add(uint8(9), []byte("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"))
	f.Add(uint8(3), make([]byte, 40))
	f.Fuzz(func(t *testing.T, ti uint8, data []byte) {
		typ := fuzzTypes[int(ti)%len(fuzzTypes)]
		bs, ts := typ.BlockSize(), typ.TypeSize()
		n := len(data) / ts * bs
		y := make([]float32, n)
		if err := Dequantize(typ, data, y); err != nil {
			t.Fatal(err)
		}
		// One element too many must be an error, not a panic.
		if err := Dequantize(typ, data, make([]float32, n+bs)); err == nil {
			t.Fatal("short source accepted")
		}
	})
}

// FuzzQuantize quantizes arbitrary finite values: no panics, and values
// within the formats' range come back finite.
func FuzzQuantize(f *testing.F) {
	f.Add(uint8(11), []byte{1, 2, 3, 4, 5, 6, 7, 8})
	f.Fuzz(func(t *testing.T, ti uint8, data []byte) {
		typ := fuzzTypes[int(ti)%len(fuzzTypes)]
		bs := typ.BlockSize()
		x := make([]float32, len(data)/4/bs*bs)
		finite := true
		for i := range x {
			x[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
			v := float64(x[i])
			if math.IsNaN(v) || math.Abs(v) > 1e4 || (v != 0 && math.Abs(v) < 1e-30) {
				finite = false
			}
		}
		q, err := Quantize(typ, x)
		if !finite {
			return // errors for NaN/Inf, anything for huge values; but no panic
		}
		if err != nil {
			t.Fatal(err)
		}
		y := make([]float32, len(x))
		if err := Dequantize(typ, q, y); err != nil {
			t.Fatal(err)
		}
		for i, v := range y {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				t.Fatalf("%s: %v comes back as %v", typ, x[i], v)
			}
		}
	})
}
