package quant

import (
	"bytes"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// allTypes are the types Quantize and Dequantize support, with the relative
// RMS error a round trip of normal data may show. Q6_K's bound is looser
// than in the golden test: at scale 1e-3 its f16 super-scale is subnormal.
var allTypes = []struct {
	t      Type
	relRMS float64
}{
	{F32, 0}, {F16, 3e-4}, {BF16, 2.5e-3},
	{Q8_0, 7e-3}, {Q8_1, 7e-3}, {Q8_K, 0.012},
	{Q4_0, 0.1}, {Q4_1, 0.09}, {Q5_0, 0.05}, {Q5_1, 0.045},
	{Q2_K, 0.33}, {Q3_K, 0.17}, {Q4_K, 0.08}, {Q5_K, 0.04}, {Q6_K, 0.03},
	{IQ4_NL, 0.085}, {IQ4_XS, 0.095}, {MXFP4, 0.13},
}

func randNormal(rng *rand.Rand, n int, scale float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64() * scale)
	}
	return x
}

func relRMS(x, y []float32) float64 {
	var se, sx float64
	for i := range x {
		d := float64(y[i]) - float64(x[i])
		se += d * d
		sx += float64(x[i]) * float64(x[i])
	}
	if sx == 0 {
		return math.Sqrt(se)
	}
	return math.Sqrt(se / sx)
}

func roundTrip(t *testing.T, typ Type, x []float32) []float32 {
	t.Helper()
	q, err := Quantize(typ, x)
	if err != nil {
		t.Fatalf("Quantize(%s, %d): %v", typ, len(x), err)
	}
	if want, _ := RowSize(typ, len(x)); len(q) != want {
		t.Fatalf("Quantize(%s, %d): %d bytes, want %d", typ, len(x), len(q), want)
	}
	y := make([]float32, len(x))
	if err := Dequantize(typ, q, y); err != nil {
		t.Fatalf("Dequantize(%s): %v", typ, err)
	}
	for i, v := range y {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatalf("%s: element %d of %d dequantizes to %v (input %v)", typ, i, len(x), v, x[i])
		}
	}
	return y
}

func TestRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, tc := range allTypes {
		t.Run(tc.t.String(), func(t *testing.T) {
			bs := tc.t.BlockSize()
			if bs == 1 {
				bs = 32
			}
			// Odd numbers of blocks, and a scale far from 1 each way.
			for _, nb := range []int{1, 3, 7} {
				for _, scale := range []float64{1, 1e-3, 300} {
					x := randNormal(rng, nb*bs, scale)
					y := roundTrip(t, tc.t, x)
					if r := relRMS(x, y); r > tc.relRMS {
						t.Errorf("%d blocks, scale %g: relative RMS error %.4g > %.4g", nb, scale, r, tc.relRMS)
					}
				}
			}
			// Zeros come back as zeros.
			x := make([]float32, 2*bs)
			for i, v := range roundTrip(t, tc.t, x) {
				if v != 0 {
					t.Fatalf("zeros: element %d is %v", i, v)
				}
			}
			// A block of zeros next to a block of data, a constant block,
			// one spike among zeros, tiny and large magnitudes.
			x = randNormal(rng, 3*bs, 1)
			clear(x[:bs])
			for i := bs; i < 2*bs; i++ {
				x[i] = 0.75
			}
			roundTrip(t, tc.t, x)
			spike := make([]float32, bs)
			spike[bs/2+1] = -5
			tol := 0.2
			if tc.t == MXFP4 {
				tol = 1 // E2M1 has nothing between 4 and 6 (times the power-of-two scale)
			}
			if y := roundTrip(t, tc.t, spike); math.Abs(float64(y[bs/2+1])+5) > tol {
				t.Errorf("spike: -5 comes back as %v", y[bs/2+1])
			}
			roundTrip(t, tc.t, randNormal(rng, bs, 1e-20))
			roundTrip(t, tc.t, randNormal(rng, bs, 1e-30))
			big := randNormal(rng, bs, 1000)
			if r := relRMS(big, roundTrip(t, tc.t, big)); r > tc.relRMS*1.5 {
				t.Errorf("scale 1000: relative RMS error %.4g", r)
			}
			// All positive and all negative data (the Q*_1 and K minimums).
			pos := randNormal(rng, 2*bs, 1)
			for i := range pos {
				pos[i] = float32(math.Abs(float64(pos[i]))) + 2
			}
			if r := relRMS(pos, roundTrip(t, tc.t, pos)); r > tc.relRMS {
				t.Errorf("positive data: relative RMS error %.4g", r)
			}
			for i := range pos {
				pos[i] = -pos[i]
			}
			if r := relRMS(pos, roundTrip(t, tc.t, pos)); r > tc.relRMS {
				t.Errorf("negative data: relative RMS error %.4g", r)
			}
		})
	}
}

// Quantizing is deterministic and QuantizeInto writes the same bytes.
func TestQuantizeInto(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	x := randNormal(rng, 512, 1)
	for _, tc := range allTypes {
		a, err := Quantize(tc.t, x)
		if err != nil {
			t.Fatal(err)
		}
		b := bytes.Repeat([]byte{0xa5}, len(a)+3)
		if err := QuantizeInto(tc.t, x, b); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b[:len(a)]) || !bytes.Equal(b[len(a):], []byte{0xa5, 0xa5, 0xa5}) {
			t.Errorf("%s: QuantizeInto differs from Quantize or writes past the row", tc.t)
		}
	}
}

func TestErrors(t *testing.T) {
	wantErr := func(err error, sub string) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), sub) {
			t.Errorf("error %v, want one containing %q", err, sub)
		}
	}
	_, err := Quantize(IQ2_XS, make([]float32, 256))
	wantErr(err, "quant: type IQ2_XS not supported")
	wantErr(Dequantize(TQ2_0, make([]byte, 66), make([]float32, 256)), "quant: type TQ2_0 not supported")
	wantErr(Dequantize(Type(99), make([]byte, 64), make([]float32, 32)), "type(99) not supported")
	_, err = Quantize(Q4_K, make([]float32, 300))
	wantErr(err, "not a multiple of the block size 256")
	wantErr(Dequantize(Q8_0, make([]byte, 33), make([]float32, 32)), "need 34 bytes, have 33")
	wantErr(Dequantize(Q6_K, make([]byte, 210), make([]float32, 100)), "not a multiple")
	wantErr(QuantizeInto(Q5_1, make([]float32, 64), make([]byte, 47)), "need 48 bytes, have 47")
	x := make([]float32, 64)
	x[40] = float32(math.NaN())
	_, err = Quantize(Q4_0, x)
	wantErr(err, "element 40 is NaN")
	x[40] = float32(math.Inf(-1))
	_, err = Quantize(Q6_K, append(x, make([]float32, 192)...))
	wantErr(err, "element 40 is -Inf")
	// Plain float types keep non-finite values.
	if q, err := Quantize(F16, x); err != nil || F16ToF32(uint16(q[80])|uint16(q[81])<<8) != float32(math.Inf(-1)) {
		t.Errorf("F16 of -Inf: %v", err)
	}
	if _, err := RowSize(Q2_K, -256); err == nil {
		t.Error("RowSize(-256) succeeded")
	}
	if n, err := RowSize(Q2_K, 512); err != nil || n != 168 {
		t.Errorf("RowSize(Q2_K, 512) = %d, %v", n, err)
	}
	if _, err := RowSize(Type(77), 32); err == nil {
		t.Error("RowSize of an unknown type succeeded")
	}
}

// Block sizes in the code agree with types.go.
func TestBlockSizes(t *testing.T) {
	for typ, size := range map[Type]int{
		Q4_0: sizeQ4_0, Q4_1: sizeQ4_1, Q5_0: sizeQ5_0, Q5_1: sizeQ5_1, Q8_0: sizeQ8_0, Q8_1: sizeQ8_1,
		Q2_K: sizeQ2K, Q3_K: sizeQ3K, Q4_K: sizeQ4K, Q5_K: sizeQ5K, Q6_K: sizeQ6K, Q8_K: sizeQ8K,
		IQ4_NL: sizeIQ4NL, IQ4_XS: sizeIQ4XS, MXFP4: sizeMXFP4,
	} {
		if typ.TypeSize() != size {
			t.Errorf("%s: types.go says %d bytes, code uses %d", typ, typ.TypeSize(), size)
		}
	}
}

// Dequantizing a hand-built block checks the layouts independently of the
// quantizers.
func TestDequantizeHandBuilt(t *testing.T) {
	// Q4_0: d = 0.5, nibble j = j&15 low, 15-(j&15) high.
	b := make([]byte, sizeQ4_0)
	b[0], b[1] = 0x00, 0x38 // 0.5
	for j := 0; j < 16; j++ {
		b[2+j] = byte(j) | byte(15-j)<<4
	}
	y := make([]float32, 32)
	if err := Dequantize(Q4_0, b, y); err != nil {
		t.Fatal(err)
	}
	for j := 0; j < 16; j++ {
		if y[j] != float32(j-8)*0.5 || y[j+16] != float32(7-j)*0.5 {
			t.Fatalf("Q4_0 element %d: %v %v", j, y[j], y[j+16])
		}
	}
	// Q8_K: d = 0.25 (float32), q = j-128.
	b = make([]byte, sizeQ8K)
	copy(b, []byte{0, 0, 0x80, 0x3e})
	for j := 0; j < 256; j++ {
		b[4+j] = byte(j - 128)
	}
	y = make([]float32, 256)
	if err := Dequantize(Q8_K, b, y); err != nil {
		t.Fatal(err)
	}
	for j := range y {
		if y[j] != float32(j-128)*0.25 {
			t.Fatalf("Q8_K element %d: %v", j, y[j])
		}
	}
	// Q6_K: d = 1, scale of sub-block g = g-8, level of element i = i%64.
	b = make([]byte, sizeQ6K)
	for i := 0; i < 256; i++ {
		half, r := i/128, i%128
		l, quarter := r%32, r/32
		q := byte(i % 64)
		qlIdx := half*64 + l + 32*(quarter%2)
		b[qlIdx] |= (q & 0xf) << (4 * uint(quarter/2))
		b[128+half*32+l] |= (q >> 4) << (2 * uint(quarter))
	}
	for g := 0; g < 16; g++ {
		b[192+g] = byte(int8(g - 8))
	}
	b[208], b[209] = 0x00, 0x3c
	if err := Dequantize(Q6_K, b, y); err != nil {
		t.Fatal(err)
	}
	for i := range y {
		if want := float32((i/16 - 8) * (i%64 - 32)); y[i] != want {
			t.Fatalf("Q6_K element %d: %v, want %v", i, y[i], want)
		}
	}
	// IQ4_XS: d = 0.5, group g has 6-bit scale 32+g-4 (so g-4 after the
	// offset), element j of a group has codebook index j%16.
	b = make([]byte, sizeIQ4XS)
	b[0], b[1] = 0x00, 0x38
	var sh uint16
	for g := 0; g < 8; g++ {
		l := 32 + g - 4
		b[4+g/2] |= byte(l&0xf) << (4 * uint(g%2))
		sh |= uint16(l>>4) << (2 * uint(g))
		for j := 0; j < 16; j++ {
			b[8+16*g+j] = byte(j) | byte(15-j)<<4
		}
	}
	b[2], b[3] = byte(sh), byte(sh>>8)
	if err := Dequantize(IQ4_XS, b, y); err != nil {
		t.Fatal(err)
	}
	kv := []float32{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}
	for i := range y {
		g, j := i/32, i%32
		idx := j
		if j >= 16 {
			idx = 15 - (j - 16)
		}
		if want := 0.5 * float32(g-4) * kv[idx]; y[i] != want {
			t.Fatalf("IQ4_XS element %d: %v, want %v", i, y[i], want)
		}
	}
	// MXFP4: e = 128, a scale of 2^(128-127) = 2 on the E2M1 values (ggml
	// keeps the values doubled and halves the scale); nibble j low and high.
	b = make([]byte, sizeMXFP4)
	b[0] = 128
	for j := 0; j < 16; j++ {
		b[1+j] = byte(j) | byte(j)<<4
	}
	y = y[:32]
	if err := Dequantize(MXFP4, b, y); err != nil {
		t.Fatal(err)
	}
	fp4 := []float32{0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6}
	for j := 0; j < 32; j++ {
		if want := 2 * fp4[j%16]; y[j] != want {
			t.Fatalf("MXFP4 element %d: %v, want %v", j, y[j], want)
		}
	}
}

func TestRoundf(t *testing.T) {
	rng := rand.New(rand.NewPCG(19, 20))
	vals := []float32{0, 0.5, -0.5, 1.5, -1.5, 2.5, 0.49999997, -0.49999997, 126.5, -127.5, 127, 1e-30}
	for i := 0; i < 100000; i++ {
		vals = append(vals, float32(rng.Float64()*300-150), float32(rng.IntN(300)-150)+0.5)
	}
	for _, v := range vals {
		if got, want := roundf(v), int32(math.Round(float64(v))); got != want {
			t.Fatalf("roundf(%v) = %d, want %d", v, got, want)
		}
	}
}

// bestIndexBisect is ggml's best_index_int8 as written there.
func bestIndexBisect(val *[16]int8, x float32) int {
	if x <= float32(val[0]) {
		return 0
	}
	if x >= float32(val[15]) {
		return 15
	}
	ml, mu := 0, 15
	for mu-ml > 1 {
		mav := (ml + mu) / 2
		if x < float32(val[mav]) {
			mu = mav
		} else {
			ml = mav
		}
	}
	if x-float32(val[mu-1]) < float32(val[mu])-x {
		return mu - 1
	}
	return mu
}

func TestBestIndexInt8(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, 24))
	var xs []float32
	for i := -130; i <= 130; i++ {
		xs = append(xs, float32(i), float32(i)+0.5, math.Nextafter32(float32(i)+0.5, 200), math.Nextafter32(float32(i)+0.5, -200))
	}
	for i := 0; i < 200000; i++ {
		xs = append(xs, float32(rng.Float64()*280-140))
	}
	for _, x := range xs {
		if got, want := bestIndexInt8(&kvaluesIQ4NL, x), bestIndexBisect(&kvaluesIQ4NL, x); got != want {
			t.Fatalf("x = %v: %d, bisection gives %d", x, got, want)
		}
	}
}
