package model

import (
	"math"
	"strings"
	"testing"

	"pagoda/kernels"
	"pagoda/quant"
)

type mapSource map[string]*rawTensor

func (s mapSource) tensor(name string) (*rawTensor, bool) {
	t, ok := s[name]
	return t, ok
}

// A 3-D tensor (ggml dims [cols, rows, n], as GGUF stores MoE experts) in
// a block-quantized type binds as n matrices, each the rows of its slice:
// the products of each view match the plain product over the dequantized
// slice.
func TestBindStack(t *testing.T) {
	for _, typ := range []quant.Type{quant.Q4_K, quant.Q8_0, quant.F16} {
		const n, rows, cols = 3, 5, 256
		f := make([]float32, n*rows*cols)
		for i := range f {
			f[i] = float32(math.Sin(float64(i)*0.37)) * float32(1+i%7)
		}
		data, err := quant.Quantize(typ, f)
		if err != nil {
			t.Fatal(err)
		}
		deq := make([]float32, len(f))
		if err := quant.Dequantize(typ, data, deq); err != nil {
			t.Fatal(err)
		}
		src := mapSource{"blk.0.ffn_up_exps.weight": {Type: typ, Dims: []uint64{cols, rows, n}, Data: data}}
		ms, err := bindStack(src, "blk.0.ffn_up_exps.weight", n, rows, cols)
		if err != nil {
			t.Fatal(err)
		}
		if len(ms) != n {
			t.Fatalf("%s: %d matrices, want %d", typ, len(ms), n)
		}
		x := make([]float32, cols)
		for i := range x {
			x[i] = float32(i%11) - 5
		}
		pool := kernels.NewPool(1)
		defer pool.Close()
		for e, m := range ms {
			if m.Rows != rows || m.Cols != cols || m.Type != typ {
				t.Fatalf("%s expert %d: %d×%d %s", typ, e, m.Rows, m.Cols, m.Type)
			}
			out := make([]float32, rows)
			kernels.MatMulRef(pool, m, x, out, 1)
			for r := range out {
				var want float64
				for c, v := range x {
					want += float64(deq[(e*rows+r)*cols+c]) * float64(v)
				}
				if math.Abs(float64(out[r])-want) > 1e-3*(1+math.Abs(want)) {
					t.Fatalf("%s expert %d row %d: %g, want %g", typ, e, r, out[r], want)
				}
			}
		}
	}
}

func TestBindStackErrors(t *testing.T) {
	data := make([]byte, 3*2*34) // 3 slices of 2 rows of one Q8_0 block
	for _, c := range []struct {
		name string
		t    *rawTensor
		cols int
		want string
	}{
		{"2-D", &rawTensor{Type: quant.Q8_0, Dims: []uint64{32, 6}, Data: data}, 32, "shape"},
		{"wrong n", &rawTensor{Type: quant.Q8_0, Dims: []uint64{32, 2, 4}, Data: data}, 32, "shape"},
		{"short", &rawTensor{Type: quant.Q8_0, Dims: []uint64{32, 2, 3}, Data: data[:len(data)-1]}, 32, "bytes"},
		{"row not whole blocks", &rawTensor{Type: quant.Q8_0, Dims: []uint64{33, 2, 3}, Data: data}, 33, "block size"},
	} {
		_, err := bindStack(mapSource{"x": c.t}, "x", 3, 2, c.cols)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one about %s", c.name, err, c.want)
		}
	}
	if _, err := bindStack(mapSource{}, "x", 3, 2, 32); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing tensor: %v", err)
	}
}
