package quant

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

var dotTypes = []Type{Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4}

func dequantAll(t *testing.T, typ Type, b []byte, n int) []float32 {
	t.Helper()
	y := make([]float32, n)
	if err := Dequantize(typ, b, y); err != nil {
		t.Fatal(err)
	}
	return y
}

// TestVecDot holds each integer dot product to two references: the float64
// dot of both dequantized operands (equal up to float32 rounding, since the
// integer math is exact), and DotRef with unquantized activations (off by
// the 8-bit activation rounding only).
func TestVecDot(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, typ := range dotTypes {
		at, ok := VecDotType(typ)
		if !ok {
			t.Fatalf("%s: no vec_dot type", typ)
		}
		for _, nb := range []int{1, 3, 5} {
			n := nb * 256
			wf := randNormal(rng, n, 0.05)
			x := randNormal(rng, n, 1)
			if nb == 3 {
				// Activations with a zero block and a large outlier.
				clear(x[:256])
				x[300] = 40
			}
			w, err := Quantize(typ, wf)
			if err != nil {
				t.Fatal(err)
			}
			asz, _ := RowSize(at, n)
			a := make([]byte, asz)
			QuantizeActivations(typ, x, a)

			got := VecDot(typ, n, w, a)
			wd, ad := dequantAll(t, typ, w, n), dequantAll(t, at, a, n)
			var exact, mag float64
			if at == Q8_1 {
				// Q4_1/Q5_1 fold their minimum in through Q8_1's f16 sum s:
				// take d·q with the minimum zeroed, then add m·s per block.
				wz := bytes.Clone(w)
				ts := typ.TypeSize()
				for b := 0; b < n/32; b++ {
					m, s := f16At(w, b*ts+2), f16At(a, b*sizeQ8_1+2)
					exact += float64(m) * float64(s)
					mag += math.Abs(float64(m) * float64(s))
					wz[b*ts+2], wz[b*ts+3] = 0, 0
				}
				wd = dequantAll(t, typ, wz, n)
			}
			for i := range wd {
				p := float64(wd[i]) * float64(ad[i])
				exact += p
				mag += math.Abs(p)
			}
			if d := math.Abs(float64(got) - exact); d > 1e-5*mag+1e-6 {
				t.Errorf("%s n=%d: VecDot %v, dequantized dot %v (diff %.3g, scale %.3g)", typ, n, got, exact, d, mag)
			}
			ref := DotRef(typ, w, x)
			if d := math.Abs(float64(got - ref)); d > 0.01*mag {
				t.Errorf("%s n=%d: VecDot %v, DotRef %v (diff %.3g, scale %.3g)", typ, n, got, ref, d, mag)
			}
		}
		if got := VecDot(typ, 0, nil, nil); got != 0 {
			t.Errorf("%s: empty dot %v", typ, got)
		}
	}
}

// The activation quantizers are the reference quantizers, and Q8_K's bsums
// are the sums of its levels.
func TestActivationQuantizers(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	x := randNormal(rng, 1024, 3)
	x[5] = 0
	clear(x[256:512])
	for _, at := range []Type{Q8_0, Q8_1, Q8_K} {
		want, err := Quantize(at, x)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(want))
		switch at {
		case Q8_0:
			QuantizeQ8_0(x, got)
		case Q8_1:
			QuantizeQ8_1(x, got)
		case Q8_K:
			QuantizeQ8_K(x, got)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: activation quantizer differs from Quantize", at)
		}
	}
	q, _ := Quantize(Q8_K, x)
	for b := 0; b < 4; b++ {
		blk := q[b*sizeQ8K:][:sizeQ8K]
		d := math.Float32frombits(binary.LittleEndian.Uint32(blk))
		var amax float32
		for j := 0; j < 256; j++ {
			v := int8(blk[4+j])
			if v == -128 {
				t.Fatalf("block %d: level -128 (Q8_K keeps -127..127)", b)
			}
			amax = max(amax, abs32(x[b*256+j]))
		}
		if b == 1 {
			if d != 0 {
				t.Errorf("zero block: d = %v", d)
			}
		} else if math.Abs(math.Abs(float64(d*127))-float64(amax)) > 1e-6*float64(amax) {
			// d carries the sign that maps the extreme element to -127.
			t.Errorf("block %d: |d|·127 = %v, max |x| = %v", b, d*127, amax)
		}
		for j := 0; j < 16; j++ {
			var s int32
			for _, v := range blk[4+16*j : 4+16*j+16] {
				s += int32(int8(v))
			}
			if got := q8KBsum(blk, j); got != s {
				t.Errorf("block %d bsum %d: %d, levels sum to %d", b, j, got, s)
			}
		}
	}
	// Q8_1's s is d times the sum of the levels, in f16.
	q, _ = Quantize(Q8_1, x[:32])
	var s int32
	for _, v := range q[4:36] {
		s += int32(int8(v))
	}
	if got, want := f16At(q, 2), F16ToF32(F32ToF16(float32(s)*f16At(q, 0))); got != want {
		t.Errorf("Q8_1 s = %v, want %v", got, want)
	}
}

func TestDotRefFloat(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	x := randNormal(rng, 77, 1)
	w := randNormal(rng, 77, 1)
	for _, typ := range []Type{F32, F16, BF16, Q8_0} {
		n := len(x)
		if typ == Q8_0 {
			n = 64
		}
		row, err := Quantize(typ, w[:n])
		if err != nil {
			t.Fatal(err)
		}
		wd := dequantAll(t, typ, row, n)
		var want float64
		for i := 0; i < n; i++ {
			want += float64(wd[i]) * float64(x[i])
		}
		if got := DotRef(typ, row, x[:n]); got != float32(want) {
			t.Errorf("%s: DotRef %v, want %v", typ, got, float32(want))
		}
	}
	xk := randNormal(rng, 512, 1)
	rowK, _ := Quantize(Q4_K, xk)
	if a := testing.AllocsPerRun(10, func() { DotRef(Q4_K, rowK, xk) }); a != 0 {
		t.Errorf("DotRef allocates %v times", a)
	}
	defer func() {
		if recover() == nil {
			t.Error("DotRef with a short row did not panic")
		}
	}()
	DotRef(Q4_0, make([]byte, 17), make([]float32, 32))
}

// TestVecDotGolden runs the dot products on llama.cpp's own quantized
// weights (the g-llama-gqa files) rather than on ours.
func TestVecDotGolden(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 18))
	for _, typ := range dotTypes[:10] { // the golden files cover these
		file := loadGolden(t, typ.String())
		w := file["blk.0.ffn_down.weight"]
		if w == nil || w.typ != typ || len(w.dims) != 2 {
			t.Fatalf("%s: no 2-D ffn_down tensor", typ)
		}
		n := int(w.dims[0])
		rowBytes, _ := RowSize(typ, n)
		at, _ := VecDotType(typ)
		asz, _ := RowSize(at, n)
		a := make([]byte, asz)
		x := randNormal(rng, n, 1)
		QuantizeActivations(typ, x, a)
		ad := dequantAll(t, at, a, n)
		for r := 0; r < 8; r++ {
			row := w.data[r*rowBytes:][:rowBytes]
			got := VecDot(typ, n, row, a)
			ref := DotRef(typ, row, ad)
			var mag float64
			for i, v := range dequantAll(t, typ, row, n) {
				mag += math.Abs(float64(v) * float64(ad[i]))
			}
			tol := 1e-5*mag + 1e-6
			if at == Q8_1 {
				tol = 2e-3 * mag // Q8_1's f16 sum s rounds the minimum's share
			}
			if d := math.Abs(float64(got - ref)); d > tol {
				t.Errorf("%s row %d: VecDot %v, DotRef on dequantized activations %v", typ, r, got, ref)
			}
		}
	}
}

// The x86 activation quantizers differ from the reference only in the
// rounding of a level: never by more than one, and only rarely.
func TestQuantizeX86(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	x := randNormal(rng, 32*512, 1)
	clear(x[:32])
	// Exact ties for the reference: with max 127 the scale is 1.
	for j := 32; j < 64; j++ {
		x[j] = float32(j-48) + 0.5
	}
	x[63] = 127
	ref := make([]byte, 512*sizeQ8_0)
	x86 := make([]byte, 512*sizeQ8_0)
	QuantizeQ8_0(x, ref)
	QuantizeQ8_0X86(x, x86)
	diff := 0
	for b := 0; b < 512; b++ {
		r, g := ref[b*sizeQ8_0:][:sizeQ8_0], x86[b*sizeQ8_0:][:sizeQ8_0]
		if r[0] != g[0] || r[1] != g[1] {
			t.Fatalf("block %d: scales differ", b)
		}
		for j := 2; j < 34; j++ {
			if d := int(int8(r[j])) - int(int8(g[j])); d != 0 {
				if d > 1 || d < -1 {
					t.Fatalf("block %d level %d: %d vs %d", b, j-2, int8(r[j]), int8(g[j]))
				}
				diff++
			}
		}
	}
	// Block 1 holds the ties k+0.5: away from zero vs to even.
	for j := 0; j < 31; j++ {
		v := float64(j-16) + 0.5
		if got, want := int8(x86[sizeQ8_0+2+j]), int8(math.RoundToEven(v)); got != want {
			t.Errorf("tie %v: x86 level %d, want %d", v, got, want)
		}
		if got, want := int8(ref[sizeQ8_0+2+j]), int8(math.Round(v)); got != want {
			t.Errorf("tie %v: reference level %d, want %d", v, got, want)
		}
	}
	if diff == 0 || diff > 32*512/20 {
		t.Errorf("%d of %d levels differ between the x86 and reference quantizers", diff, 32*512)
	}
	// Q8_1: the same levels, and s from them.
	q1 := make([]byte, 512*sizeQ8_1)
	QuantizeQ8_1X86(x, q1)
	for b := 0; b < 512; b++ {
		blk := q1[b*sizeQ8_1:][:sizeQ8_1]
		if !bytes.Equal(blk[4:36], x86[b*sizeQ8_0+2:][:32]) {
			t.Fatalf("block %d: Q8_1 levels differ from Q8_0", b)
		}
		var s int32
		for _, v := range blk[4:36] {
			s += int32(int8(v))
		}
		d := maxAbs(x[b*32:b*32+32]) / 127 // s uses d before its f16 rounding
		if got, want := f16At(blk, 2), F16ToF32(F32ToF16(d*float32(s))); got != want {
			t.Fatalf("block %d: s = %v, want %v", b, got, want)
		}
	}
}

func maxAbs(x []float32) float32 {
	var m float32
	for _, v := range x {
		m = max(m, abs32(v))
	}
	return m
}
