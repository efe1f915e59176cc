package kernels

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

// randBlocks fills rows of nb random blocks of format bb, stride bytes
// apart: scales of either sign around 0.01–1, codes across their range.
func randBlocks(r *rand.Rand, n, nb, stride, bb int) []byte {
	k := make([]byte, max(0, (n-1)*stride+nb*bb))
	for i := range k {
		k[i] = byte(r.UintN(256))
	}
	for t := 0; t < n; t++ {
		for b := 0; b < nb; b++ {
			d := float32(r.Float64()*0.99+0.01) * float32(1-2*int(r.UintN(2)))
			binary.LittleEndian.PutUint16(k[t*stride+b*bb:], f32ToF16(d))
		}
	}
	return k
}

// blockAbs is Σ |q_i x_i| for row t, the scale of the rounding error.
func blockAbs(q []float32, k []byte, bb int) float64 {
	x := make([]float32, len(q))
	if bb == Q8_0Bytes {
		AxpyQ8_0Ref(x, 1, k)
	} else {
		AxpyQ4_0Ref(x, 1, k)
	}
	var s float64
	for i := range q {
		s += math.Abs(float64(q[i] * x[i]))
	}
	return s
}

// TestBlockAttn holds every instruction set's q8_0/q4_0 scoring and mixing
// against the references, on odd row counts, strides and block counts.
func TestBlockAttn(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 8))
	for _, isa := range ISAs() {
		o, _ := ForISA(isa)
		for _, bb := range []int{Q8_0Bytes, Q4_0Bytes} {
			got, ref := o.AttnQ8_0(), blockAttnRef(Q8_0Bytes)
			if bb == Q4_0Bytes {
				got, ref = o.AttnQ4_0(), blockAttnRef(Q4_0Bytes)
			}
			for _, n := range []int{0, 1, 3, 17, 64} {
				for _, nb := range []int{1, 2, 3, 4} {
					for _, pad := range []int{0, 7} {
						stride := nb*bb + pad
						k := randBlocks(r, n, nb, stride, bb)
						q := make([]float32, nb*32)
						for i := range q {
							q[i] = float32(r.NormFloat64())
						}
						s, sr := make([]float32, n), make([]float32, n)
						got.Scores(s, q, k, stride)
						ref.Scores(sr, q, k, stride)
						for i := range s {
							tol := 1e-5*blockAbs(q, k[i*stride:i*stride+nb*bb], bb) + 1e-6
							if d := math.Abs(float64(s[i] - sr[i])); d > tol || math.IsNaN(float64(s[i])) {
								t.Fatalf("%s bb %d n %d nb %d: score %d = %g, reference %g", isa, bb, n, nb, i, s[i], sr[i])
							}
						}
						w := make([]float32, n)
						for i := range w {
							w[i] = float32(r.Float64())
						}
						out, outr := make([]float32, nb*32), make([]float32, nb*32)
						for i := range out {
							out[i] = float32(r.NormFloat64())
							outr[i] = out[i]
						}
						got.Mix(out, w, k, stride)
						ref.Mix(outr, w, k, stride)
						for i := range out {
							if d := math.Abs(float64(out[i] - outr[i])); d > 1e-4*(1+math.Abs(float64(outr[i]))) {
								t.Fatalf("%s bb %d n %d nb %d: mix %d = %g, reference %g", isa, bb, n, nb, i, out[i], outr[i])
							}
						}
					}
				}
			}
		}
	}
}

// TestBlockAttnExact: on small integers the arithmetic is exact, so the
// SIMD kernels must give the reference's numbers to the bit.
func TestBlockAttnExact(t *testing.T) {
	// q8_0 row: scale 1, codes −64..63 ; q = small integers.
	k := make([]byte, 2*Q8_0Bytes)
	for b := 0; b < 2; b++ {
		binary.LittleEndian.PutUint16(k[b*Q8_0Bytes:], f32ToF16(float32(b+1)))
		for j := 0; j < 32; j++ {
			k[b*Q8_0Bytes+2+j] = byte(int8(j*5 - 64))
		}
	}
	q := make([]float32, 64)
	var want float32
	for i := range q {
		q[i] = float32(i%7 - 3)
		want += q[i] * float32((i/32)+1) * float32(int8((i%32)*5-64))
	}
	for _, isa := range ISAs() {
		o, _ := ForISA(isa)
		s := make([]float32, 1)
		o.AttnQ8_0().Scores(s, q, k, len(k))
		if s[0] != want {
			t.Errorf("%s: q8_0 score %g, want %g", isa, s[0], want)
		}
	}
}

func TestBlockAttnBadLayout(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("a row past the end did not panic")
		}
	}()
	o := Best()
	o.AttnQ8_0().Scores(make([]float32, 2), make([]float32, 32), make([]byte, Q8_0Bytes+10), Q8_0Bytes)
}

// TestPlaneAttn holds every instruction set's KIVI plane kernels against
// the references: 2- and 4-bit codes, rows of whole and partial 16-byte
// chunks, odd row counts and strides.
func TestPlaneAttn(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	for _, isa := range ISAs() {
		o, _ := ForISA(isa)
		for _, bits := range []int{2, 4} {
			got, ref := o.AttnPlanes(bits), planeAttnRef(bits)
			for _, chans := range []int{8, 32, 64, 128, 192, 24} {
				if chans*bits%8 != 0 {
					continue
				}
				for _, n := range []int{0, 1, 5, 33} {
					rb := chans * bits / 8
					stride := rb + 3
					codes := make([]byte, max(0, (n-1)*stride+rb))
					for i := range codes {
						codes[i] = byte(r.UintN(256))
					}
					planes := make([]float32, chans)
					for i := range planes {
						planes[i] = float32(r.NormFloat64())
					}
					s, sr := make([]float32, n), make([]float32, n)
					got.Scores(s, planes, codes, stride)
					ref.Scores(sr, planes, codes, stride)
					for i := range s {
						if d := math.Abs(float64(s[i] - sr[i])); d > 1e-4*(1+math.Abs(float64(sr[i]))) {
							t.Fatalf("%s %d-bit %d chans: score %d = %g, reference %g", isa, bits, chans, i, s[i], sr[i])
						}
					}
					w := make([]float32, n)
					for i := range w {
						w[i] = float32(r.Float64())
					}
					out, outr := append([]float32(nil), planes...), append([]float32(nil), planes...)
					got.Mix(out, w, codes, stride)
					ref.Mix(outr, w, codes, stride)
					for i := range out {
						if d := math.Abs(float64(out[i] - outr[i])); d > 1e-4*(1+math.Abs(float64(outr[i]))) {
							t.Fatalf("%s %d-bit %d chans: mix %d = %g, reference %g", isa, bits, chans, i, out[i], outr[i])
						}
					}
				}
			}
		}
	}
}
