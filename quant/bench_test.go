package quant

import (
	"math/rand/v2"
	"testing"
)

// benchTypes are benchmarked on one 4096-element row, the size of a
// typical hidden dimension; b.SetBytes counts float32 bytes (4 per element),
// so MB/s compare across types.
var benchTypes = []Type{F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_NL, IQ4_XS, MXFP4}

const benchN = 4096

func BenchmarkDequantize(b *testing.B) {
	x := randNormal(rand.New(rand.NewPCG(1, 1)), benchN, 1)
	y := make([]float32, benchN)
	for _, typ := range benchTypes {
		q, err := Quantize(typ, x)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(typ.String(), func(b *testing.B) {
			b.SetBytes(4 * benchN)
			for b.Loop() {
				if err := Dequantize(typ, q, y); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkQuantize(b *testing.B) {
	x := randNormal(rand.New(rand.NewPCG(2, 2)), benchN, 1)
	for _, typ := range benchTypes {
		n, _ := RowSize(typ, benchN)
		q := make([]byte, n)
		b.Run(typ.String(), func(b *testing.B) {
			b.SetBytes(4 * benchN)
			for b.Loop() {
				if err := QuantizeInto(typ, x, q); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkVecDot(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 3))
	w, x := randNormal(rng, benchN, 1), randNormal(rng, benchN, 1)
	for _, typ := range dotTypes {
		q, _ := Quantize(typ, w)
		at, _ := VecDotType(typ)
		n, _ := RowSize(at, benchN)
		a := make([]byte, n)
		QuantizeActivations(typ, x, a)
		b.Run(typ.String(), func(b *testing.B) {
			b.SetBytes(4 * benchN)
			for b.Loop() {
				VecDot(typ, benchN, q, a)
			}
		})
	}
}

func BenchmarkDotRef(b *testing.B) {
	rng := rand.New(rand.NewPCG(4, 4))
	w, x := randNormal(rng, benchN, 1), randNormal(rng, benchN, 1)
	for _, typ := range []Type{F32, F16, Q8_0, Q4_K, Q6_K} {
		q, _ := Quantize(typ, w)
		b.Run(typ.String(), func(b *testing.B) {
			b.SetBytes(4 * benchN)
			for b.Loop() {
				DotRef(typ, q, x)
			}
		})
	}
}
