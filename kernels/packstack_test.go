package kernels

import (
	"math/rand/v2"
	"testing"

	"pagoda/quant"
)

// Matrices packed together by PrepackStack compute exactly what the same
// matrices packed one by one do, for every packed type.
func TestPrepackStack(t *testing.T) {
	o := Best()
	if !o.packed {
		t.Skip("no packed kernels on this machine")
	}
	p := NewPool(2)
	defer p.Close()
	rng := rand.New(rand.NewPCG(3, 4))
	const n, rows, cols, batch = 5, 40, 256, 3
	for _, typ := range []quant.Type{quant.Q4_0, quant.Q8_0, quant.Q4_K, quant.Q6_K, quant.Q5_0, quant.F32} {
		rb, err := quant.RowSize(typ, cols)
		if err != nil {
			t.Fatal(err)
		}
		data := make([]byte, n*rows*rb)
		f := make([]float32, rows*cols)
		for e := 0; e < n; e++ {
			for i := range f {
				f[i] = float32(rng.NormFloat64())
			}
			if err := quant.QuantizeInto(typ, f, data[e*rows*rb:(e+1)*rows*rb]); err != nil {
				t.Fatal(err)
			}
		}
		stack, single := make([]*Matrix, n), make([]*Matrix, n)
		for e := range stack {
			d := data[e*rows*rb : (e+1)*rows*rb]
			stack[e], _ = NewMatrix(typ, rows, cols, d)
			single[e], _ = NewMatrix(typ, rows, cols, append([]byte(nil), d...))
			o.Prepack(p, single[e])
		}
		o.PrepackStack(p, stack)
		x := make([]float32, batch*cols)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		for e := range stack {
			a, b := make([]float32, batch*rows), make([]float32, batch*rows)
			o.MatMul(p, stack[e], x, a, batch)
			o.MatMul(p, single[e], x, b, batch)
			for i := range a {
				if a[i] != b[i] {
					t.Fatalf("%s expert %d row %d: stacked %g, single %g", typ, e, i, a[i], b[i])
				}
			}
		}
	}
}
