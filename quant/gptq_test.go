package quant

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

func mustQC(t testing.TB, js string) *QuantConfig {
	t.Helper()
	c, err := ParseQuantConfig([]byte(js), "")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func i32T(name string, shape []int64, words ...uint32) *PackedTensor {
	b := make([]byte, 4*len(words))
	for i, v := range words {
		binary.LittleEndian.PutUint32(b[4*i:], v)
	}
	return &PackedTensor{Name: name, DType: "I32", Shape: shape, Data: b}
}

func f16T(name string, shape []int64, v float32) *PackedTensor {
	n := 1
	for _, d := range shape {
		n *= int(d)
	}
	b := make([]byte, 2*n)
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint16(b[2*i:], F32ToF16(v))
	}
	return &PackedTensor{Name: name, DType: "F16", Shape: shape, Data: b}
}

// dequantRepacked expands r to out×in floats in the original column order.
func dequantRepacked(t testing.TB, r *Repacked) []float32 {
	t.Helper()
	got := make([]float32, r.Rows*r.Cols)
	row := make([]float32, r.Cols)
	rb, _ := RowSize(r.Type, r.Cols)
	for n := 0; n < r.Rows; n++ {
		if err := Dequantize(r.Type, r.Data[n*rb:(n+1)*rb], row); err != nil {
			t.Fatal(err)
		}
		for j, v := range row {
			k := j
			if r.Perm != nil {
				k = int(r.Perm[j])
			}
			got[n*r.Cols+k] = v
		}
	}
	return got
}

// TestRepackGoldenGPTQ: a hand-built v1 layer. Codes are packed along the
// input dimension, 8 a word from the low bits; zeros along the output one,
// stored as z − 1.
func TestRepackGoldenGPTQ(t *testing.T) {
	const out, in = 8, 32
	var qw []uint32
	for i := 0; i < in/8; i++ {
		for n := 0; n < out; n++ {
			var w uint32
			for b := 0; b < 8; b++ {
				w |= uint32((8*i+b+n)%16) << (4 * b)
			}
			qw = append(qw, w)
		}
	}
	l := Linear{
		QWeight: i32T("l.qweight", []int64{in / 8, out}, qw...),
		QZeros:  i32T("l.qzeros", []int64{1, 1}, 0x76543210), // stored 0..7: z = 1..8
		Scales:  f16T("l.scales", []int64{1, out}, 0.5),
	}
	r, err := mustQC(t, `{"quant_method":"gptq","bits":4,"group_size":32,"desc_act":false,"sym":false}`).Repack(l, out, in)
	if err != nil {
		t.Fatal(err)
	}
	got := dequantRepacked(t, r)
	for n := 0; n < out; n++ {
		for k := 0; k < in; k++ {
			if want := float32((k+n)%16-(n+1)) * 0.5; got[n*in+k] != want {
				t.Fatalf("w[%d,%d] = %g, want %g", n, k, got[n*in+k], want)
			}
		}
	}
}

// TestRepackV1ZeroWrap: AutoGPTQ v1 stores z − 1, so a zero point of 0
// was written as −1 and reads back as the nibble 15 + 1 = 16; the loader
// keeps that reading (as AutoGPTQ's own kernels do), for 8 bits too.
func TestRepackV1ZeroWrap(t *testing.T) {
	for _, bits := range []int{4, 8} {
		per := 32 / bits
		const out, in = 8, 32
		qw := make([]uint32, in/per*out)
		for i := range qw {
			qw[i] = 0x01010101 * uint32(i%7+1) // codes 1..7 (per byte/nibble)
		}
		qz := make([]uint32, out/per)
		for i := range qz {
			qz[i] = 0xffffffff
		}
		l := Linear{
			QWeight: i32T("l.qweight", []int64{int64(in / per), out}, qw...),
			QZeros:  i32T("l.qzeros", []int64{1, int64(out / per)}, qz...),
			Scales:  f16T("l.scales", []int64{1, out}, 0.25),
		}
		c := mustQC(t, fmt.Sprintf(`{"quant_method":"gptq","bits":%d,"group_size":-1,"sym":false}`, bits))
		r, err := c.Repack(l, out, in)
		if err != nil {
			t.Fatal(err)
		}
		got := dequantRepacked(t, r)
		z := 1 << bits // stored all ones, plus one
		for n := 0; n < out; n++ {
			for k := 0; k < in; k++ {
				word := qw[k/per*out+n]
				q := int(word >> (bits * (k % per)) & (1<<bits - 1))
				if want := float32(q-z) * 0.25; got[n*in+k] != want {
					t.Fatalf("%d bits w[%d,%d] = %g, want %g", bits, n, k, got[n*in+k], want)
				}
			}
		}
	}
}

// TestRepackGoldenAWQ: AutoAWQ packs output columns 8c+[0 2 4 6 1 3 5 7] at
// nibbles 0..7, so the word 0x76543210 holds columns 0..7 = 0 4 1 5 2 6 3 7;
// zeros are stored as they are.
func TestRepackGoldenAWQ(t *testing.T) {
	const out, in = 16, 64
	qw := make([]uint32, in*out/8)
	for i := range qw {
		qw[i] = 0x76543210
	}
	l := Linear{
		QWeight: i32T("l.qweight", []int64{in, out / 8}, qw...),
		QZeros:  i32T("l.qzeros", []int64{2, 2}, 0x11111111, 0x22222222, 0x33333333, 0x44444444),
		Scales:  f16T("l.scales", []int64{2, out}, 2),
	}
	r, err := mustQC(t, `{"quant_method":"awq","bits":4,"group_size":32,"zero_point":true,"version":"gemm"}`).Repack(l, out, in)
	if err != nil {
		t.Fatal(err)
	}
	got := dequantRepacked(t, r)
	vals := []int{0, 4, 1, 5, 2, 6, 3, 7}
	for n := 0; n < out; n++ {
		for k := 0; k < in; k++ {
			z := []int{1, 2, 3, 4}[k/32*2+n/8]
			if want := float32(vals[n%8]-z) * 2; got[n*in+k] != want {
				t.Fatalf("w[%d,%d] = %g, want %g", n, k, got[n*in+k], want)
			}
		}
	}
}

var layoutConfigs = []struct {
	name, js string
	actOrder bool
}{
	{"gptq4-sym-g128-v1", `{"quant_method":"gptq","bits":4,"group_size":128,"sym":true,"desc_act":false}`, false},
	{"gptq4-asym-g32-v1", `{"quant_method":"gptq","bits":4,"group_size":32,"sym":false}`, false},
	{"gptq4-asym-g64-v2", `{"quant_method":"gptq","bits":4,"group_size":64,"sym":false,"checkpoint_format":"gptq_v2"}`, false},
	{"gptq4-sym-perchannel", `{"quant_method":"gptq","bits":4,"group_size":-1,"sym":true}`, false},
	{"gptq4-asym-g32-actorder", `{"quant_method":"gptq","bits":4,"group_size":32,"sym":false,"desc_act":true}`, true},
	{"gptq4-sym-g64-actorder-v2", `{"quant_method":"gptq","bits":4,"group_size":64,"sym":true,"desc_act":true,"checkpoint_format":"gptq_v2"}`, true},
	{"gptq8-sym-g128", `{"quant_method":"gptq","bits":8,"group_size":128,"sym":true}`, false},
	{"gptq8-asym-g32-v1", `{"quant_method":"gptq","bits":8,"group_size":32,"sym":false}`, false},
	{"gptq8-asym-actorder-v2", `{"quant_method":"gptq","bits":8,"group_size":64,"sym":false,"desc_act":true,"checkpoint_format":"gptq_v2"}`, true},
	{"awq-g128", `{"quant_method":"awq","bits":4,"group_size":128,"zero_point":true,"version":"gemm"}`, false},
	{"awq-g32", `{"quant_method":"awq","w_bit":4,"q_group_size":32,"version":"GEMM"}`, false},
}

// TestRepackRoundTrip: every layout, written by EncodeLinear from random
// float weights, repacks to rows that dequantize to GPTQ's float32
// (q − z)·s bit for bit, and those are close to the float weights.
func TestRepackRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, lc := range layoutConfigs {
		c := mustQC(t, lc.js)
		for _, shape := range [][2]int{{64, 256}, {24, 128}} {
			out, in := shape[0], shape[1]
			w := make([]float32, out*in)
			for i := range w {
				w[i] = float32(r.NormFloat64() * 0.05)
			}
			var order []int
			if lc.actOrder {
				order = r.Perm(in)
			}
			l, deq, err := EncodeLinear(c, "layer", w, out, in, order)
			if err != nil {
				t.Fatalf("%s: %v", lc.name, err)
			}
			rp, err := c.Repack(l, out, in)
			if err != nil {
				t.Fatalf("%s: %v", lc.name, err)
			}
			if lc.actOrder != (rp.Perm != nil) {
				t.Fatalf("%s: perm %v, act-order %v", lc.name, rp.Perm != nil, lc.actOrder)
			}
			if rp.Type != c.Type() || rp.Rows != out || rp.Cols != in {
				t.Fatalf("%s: repacked %s %d×%d", lc.name, rp.Type, rp.Rows, rp.Cols)
			}
			got := dequantRepacked(t, rp)
			var maxErr float64
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(deq[i]) {
					t.Fatalf("%s %dx%d: w[%d] = %g, GPTQ dequantizes %g", lc.name, out, in, i, got[i], deq[i])
				}
				maxErr = max(maxErr, math.Abs(float64(got[i]-w[i])))
			}
			// 4 bits over ±4σ of 0.05: steps ≤ 0.03 (per-channel: wider).
			if limit := 0.05 * 4 / float64(int(1)<<(c.Bits-1)); maxErr > limit {
				t.Fatalf("%s: max |dequantized − float| %g > %g", lc.name, maxErr, limit)
			}
		}
	}
}

func TestQuantConfigErrors(t *testing.T) {
	for _, tc := range []struct{ js, method, want string }{
		{`{"quant_method":"gptq","bits":3,"group_size":128}`, "", "3 bits not supported"},
		{`{"quant_method":"gptq","bits":2,"group_size":128}`, "", "2 bits not supported"},
		{`{"quant_method":"gptq","bits":4,"group_size":16}`, "", "group_size 16 not supported"},
		{`{"quant_method":"gptq","bits":4,"group_size":48}`, "", "group_size 48 not supported"},
		{`{"quant_method":"gptq","bits":4,"group_size":0}`, "", "group_size 0 not supported"},
		{`{"quant_method":"gptq","bits":4}`, "", "group_size missing"},
		{`{"quant_method":"gptq","group_size":128}`, "", "bits missing"},
		{`{"quant_method":"gptq","bits":4,"group_size":128,"checkpoint_format":"marlin"}`, "", `checkpoint_format "marlin" not supported`},
		{`{"quant_method":"awq","bits":8,"group_size":128}`, "", "8 bits not supported"},
		{`{"bits":4,"group_size":128,"is_marlin_format":true}`, "gptq", "is_marlin_format"},
		{`{"quant_method":"awq","bits":4,"group_size":128,"version":"gemv"}`, "", `version "gemv" not supported`},
		{`{"quant_method":"awq","bits":4,"group_size":-1}`, "", "group_size -1 not supported"},
		{`{"quant_method":"awq","bits":4,"group_size":128,"zero_point":false}`, "", "zero_point false"},
		{`{"quant_method":"bitsandbytes","bits":4,"group_size":64}`, "", `"bitsandbytes" not supported`},
		{`{"bits":4,"group_size":128}`, "", "quant_method missing"},
		{`{"bits":"4"}`, "gptq", "cannot unmarshal"},
	} {
		_, err := ParseQuantConfig([]byte(tc.js), tc.method)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.js, err, tc.want)
		}
	}
	c, err := ParseQuantConfig([]byte(`{"bits":4,"group_size":128,"desc_act":true}`), "gptq")
	if err != nil || c.Method != "gptq" || c.ZeroOffset != 1 || !c.DescAct || !c.Sym {
		t.Fatalf("quantize_config.json: %+v, %v", c, err)
	}
}

// TestRepackErrors: malformed layers are errors naming the tensor.
func TestRepackErrors(t *testing.T) {
	c := mustQC(t, `{"quant_method":"gptq","bits":4,"group_size":32,"sym":false,"desc_act":true}`)
	r := rand.New(rand.NewPCG(3, 4))
	w := make([]float32, 16*64)
	for i := range w {
		w[i] = float32(r.NormFloat64())
	}
	good, _, err := EncodeLinear(c, "m.q_proj", w, 16, 64, r.Perm(64))
	if err != nil {
		t.Fatal(err)
	}
	mod := func(f func(l *Linear)) Linear {
		l := good
		for _, p := range []**PackedTensor{&l.QWeight, &l.QZeros, &l.Scales, &l.GIdx} {
			cp := **p
			cp.Data = append([]byte(nil), cp.Data...)
			*p = &cp
		}
		f(&l)
		return l
	}
	for _, tc := range []struct {
		name    string
		l       Linear
		out, in int
		want    string
	}{
		{"no qzeros", mod(func(l *Linear) { l.QZeros = nil }), 16, 64, "qzeros missing"},
		{"qweight shape", mod(func(l *Linear) { l.QWeight.Shape = []int64{4, 16} }), 16, 64, `tensor "m.q_proj.qweight": shape [4 16], want [8 16]`},
		{"layer shape", good, 16, 96, `tensor "m.q_proj.scales": shape [2 16], want [3 16]`},
		{"qzeros shape", mod(func(l *Linear) { l.QZeros.Shape = []int64{1, 2} }), 16, 64, `tensor "m.q_proj.qzeros": shape [1 2], want [2 2]`},
		{"scales dtype", mod(func(l *Linear) { l.Scales.DType = "BF16" }), 16, 64, `tensor "m.q_proj.scales": dtype BF16, want F16`},
		{"short scales", mod(func(l *Linear) { l.Scales.Data = l.Scales.Data[:10] }), 16, 64, `tensor "m.q_proj.scales": 10 bytes`},
		{"inf scale", mod(func(l *Linear) { binary.LittleEndian.PutUint16(l.Scales.Data[2*17:], 0x7c00) }), 16, 64, `tensor "m.q_proj.scales" holds non-finite scales (at [1, 1])`},
		{"g_idx range", mod(func(l *Linear) { binary.LittleEndian.PutUint32(l.GIdx.Data[8:], 7) }), 16, 64, `tensor "m.q_proj.g_idx": g_idx[2] = 7 outside the 2 groups`},
		{"g_idx blocks", mod(func(l *Linear) {
			for k := 0; k < 64; k++ {
				binary.LittleEndian.PutUint32(l.GIdx.Data[4*k:], uint32(k%3/2))
			}
		}), 16, 64, `tensor "m.q_proj.g_idx": g_idx groups are not whole blocks`},
		{"no g_idx", mod(func(l *Linear) { l.GIdx = nil }), 16, 64, "desc_act is set but g_idx is missing"},
		{"odd columns", good, 16, 40, "40 input columns"},
	} {
		_, err := c.Repack(tc.l, tc.out, tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.name, err, tc.want)
		}
	}
}

// FuzzParseQuantConfig: arbitrary JSON never panics, and what parses is
// within what Repack supports.
func FuzzParseQuantConfig(f *testing.F) {
	for _, lc := range layoutConfigs {
		f.Add([]byte(lc.js), "")
	}
	f.Add([]byte(`{"bits":8,"group_size":-1}`), "gptq")
	f.Add([]byte(`{"w_bit":4,"q_group_size":128,"zero_point":true,"version":"GEMM"}`), "awq")
	f.Fuzz(func(t *testing.T, b []byte, method string) {
		c, err := ParseQuantConfig(b, method)
		if err != nil {
			return
		}
		ok := (c.Method == "gptq" && (c.Bits == 4 || c.Bits == 8)) || (c.Method == "awq" && c.Bits == 4)
		ok = ok && (c.GroupSize == -1 || (c.GroupSize > 0 && c.GroupSize%32 == 0))
		ok = ok && (c.ZeroOffset == 0 || (c.ZeroOffset == 1 && c.Format == "gptq"))
		if !ok {
			t.Fatalf("accepted %s as %+v", b, c)
		}
		if typ := c.Type(); typ != GQ4 && typ != GQ8 {
			t.Fatalf("type %s", typ)
		}
		_ = fmt.Sprint(c)
	})
}

// FuzzRepack feeds arbitrary bytes as a layer's tensors (shapes right or
// off by the fuzzer's choice): no panics, and what repacks dequantizes to
// finite values (non-finite scales are errors).
func FuzzRepack(f *testing.F) {
	f.Add(uint8(0), uint8(1), uint8(2), uint8(0), []byte("0123456789abcdef0123456789abcdef0123456789abcdef"))
	f.Add(uint8(4), uint8(3), uint8(1), uint8(1), make([]byte, 300))
	f.Fuzz(func(t *testing.T, ci, ob, ib, skew uint8, data []byte) {
		lc := layoutConfigs[int(ci)%len(layoutConfigs)]
		c, err := ParseQuantConfig([]byte(lc.js), "")
		if err != nil {
			t.Fatal(err)
		}
		out, in := 8*(int(ob)%8+1), 32*(int(ib)%8+1)
		gs := c.GroupSize
		if gs == -1 || gs > in {
			gs = in
		}
		ng := max(1, in/gs)
		per := 32 / c.Bits
		take := func(n int) []byte {
			b := make([]byte, n)
			for i := range b {
				if len(data) > 0 {
					b[i] = data[i%len(data)] ^ byte(i)
				}
			}
			return b
		}
		d := int64(skew % 3) // 0: right shapes; 1, 2: one off
		l := Linear{
			QZeros: &PackedTensor{Name: "qzeros", DType: "I32", Shape: []int64{int64(ng), int64(out/per) + d/2}, Data: take(4 * ng * out / per)},
			Scales: &PackedTensor{Name: "scales", DType: "F16", Shape: []int64{int64(ng), int64(out)}, Data: take(2 * ng * out)},
			GIdx:   &PackedTensor{Name: "g_idx", DType: "I32", Shape: []int64{int64(in)}, Data: take(4 * in)},
		}
		if c.Method == "awq" {
			l.QWeight = &PackedTensor{Name: "qweight", DType: "I32", Shape: []int64{int64(in) + d%2, int64(out / 8)}, Data: take(4 * in * out / 8)}
		} else {
			l.QWeight = &PackedTensor{Name: "qweight", DType: "I32", Shape: []int64{int64(in/per) + d%2, int64(out)}, Data: take(4 * in / per * out)}
		}
		r, err := c.Repack(l, out, in)
		if err != nil {
			return
		}
		if d != 0 {
			t.Fatalf("accepted shapes off by %d", d)
		}
		row := make([]float32, in)
		rb, _ := RowSize(r.Type, in)
		for n := 0; n < out; n++ {
			if err := Dequantize(r.Type, r.Data[n*rb:(n+1)*rb], row); err != nil {
				t.Fatal(err)
			}
			for _, v := range row {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					t.Fatalf("row %d: non-finite %g", n, v)
				}
			}
		}
	})
}
