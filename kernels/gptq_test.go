package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"pagoda/quant"
)

// randGQ builds a random GQ4/GQ8 matrix: codes over the whole range,
// zeros (all 128 when z128, else random over 0..2^bits), f16 scales, and a
// random column permutation when perm is set. deq is the dequantized matrix
// in stored column order.
func randGQ(t testing.TB, r *rand.Rand, typ quant.Type, rows, cols int, z128, perm bool) (*Matrix, []float32) {
	ts := typ.TypeSize()
	data := make([]byte, rows*cols/32*ts)
	for b := 0; b < len(data); b += ts {
		d := quant.F32ToF16(float32(r.Float64()*0.02 + 0.001))
		binary.LittleEndian.PutUint16(data[b:], d)
		if typ == quant.GQ4 {
			data[b+2] = uint8(r.IntN(17))
			for j := 4; j < ts; j++ {
				data[b+j] = uint8(r.IntN(256))
			}
		} else {
			z := uint16(r.IntN(257))
			if z128 {
				z = 128
			}
			binary.LittleEndian.PutUint16(data[b+2:], z)
			for j := 4; j < ts; j++ {
				data[b+j] = uint8(r.IntN(256))
			}
		}
	}
	m, err := NewMatrix(typ, rows, cols, data)
	if err != nil {
		t.Fatal(err)
	}
	if perm {
		m.Perm = make([]int32, cols)
		for i, p := range r.Perm(cols) {
			m.Perm[i] = int32(p)
		}
	}
	deq := make([]float32, rows*cols)
	if err := quant.Dequantize(typ, data, deq); err != nil {
		t.Fatal(err)
	}
	return m, deq
}

// TestMatMulGQ holds every ISA's GQ4/GQ8 products (packed Q4SM, Q8C, SM16,
// or the dequantizing fallback) to float64 sums of the dequantized weights
// against the gathered activations, quantized to Q8_0 for the integer
// kernels: tolerance 2e-5 of Σ|w·x| as in TestMatMul.
func TestMatMulGQ(t *testing.T) { forEachISA(t, testMatMulGQ) }

func testMatMulGQ(t *testing.T, o *Ops) {
	r := rand.New(rand.NewPCG(11, 12))
	pool := NewPool(2)
	defer pool.Close()
	type variant struct {
		typ        quant.Type
		z128, perm bool
	}
	for _, v := range []variant{{quant.GQ4, false, false}, {quant.GQ4, false, true}, {quant.GQ8, true, false},
		{quant.GQ8, false, false}, {quant.GQ8, true, true}, {quant.GQ8, false, true}} {
		for _, cols := range []int{32, 96, 256} {
			for _, rows := range []int{1, 16, 17, 40} {
				m, deq := randGQ(t, r, v.typ, rows, cols, v.z128, v.perm)
				pk := m.packedFor(o.avx2)
				integer := o.packed && pk.kind != packNone
				for _, batch := range []int{1, 3, 8, 9} {
					name := fmt.Sprintf("%s z128=%v perm=%v/%dx%d/b%d", v.typ, v.z128, v.perm, rows, cols, batch)
					x := randF32(r, batch*cols)
					xg := append([]float32(nil), x...)
					if m.Perm != nil {
						for b := 0; b < batch; b++ {
							for j, k := range m.Perm {
								xg[b*cols+j] = x[b*cols+int(k)]
							}
						}
					}
					if integer {
						for b := 0; b < batch; b++ {
							qb, _ := quant.Quantize(quant.Q8_0, xg[b*cols:(b+1)*cols])
							quant.Dequantize(quant.Q8_0, qb, xg[b*cols:(b+1)*cols])
						}
					}
					out := make([]float32, batch*rows)
					o.MatMul(pool, m, x, out, batch)
					for b := 0; b < batch; b++ {
						for i := 0; i < rows; i++ {
							var want, mag float64
							for c := 0; c < cols; c++ {
								p := float64(deq[i*cols+c]) * float64(xg[b*cols+c])
								want += p
								mag += math.Abs(p)
							}
							if got := float64(out[b*rows+i]); math.Abs(got-want) > 2e-5*mag+1e-6 {
								t.Fatalf("%s (pack %d): out[%d,%d] = %g, want %g (Σ|·| %g)", name, pk.kind, b, i, got, want, mag)
							}
						}
					}
				}
			}
		}
	}
}

// TestMatMulNGQ: MatMulN over matrices with shared, different and no
// permutations gives each the bits MatMul gives it alone (the activations
// are gathered and quantized per permutation, not shared across them).
func TestMatMulNGQ(t *testing.T) { forEachISA(t, testMatMulNGQ) }

func testMatMulNGQ(t *testing.T, o *Ops) {
	r := rand.New(rand.NewPCG(13, 14))
	pool := NewPool(2)
	defer pool.Close()
	const cols, batch = 128, 5
	a, _ := randGQ(t, r, quant.GQ4, 24, cols, false, true)
	b, _ := randGQ(t, r, quant.GQ4, 16, cols, false, false)
	b.Perm = a.Perm // shared
	c, _ := randGQ(t, r, quant.GQ4, 8, cols, false, true)
	d, _ := randGQ(t, r, quant.GQ8, 16, cols, false, false)
	e, _ := randGQ(t, r, quant.GQ8, 16, cols, true, false)
	ws := []*Matrix{a, b, c, d, e}
	x := randF32(r, batch*cols)
	outs := make([][]float32, len(ws))
	for i, w := range ws {
		outs[i] = make([]float32, batch*w.Rows)
	}
	o.MatMulN(pool, ws, x, outs, batch)
	for i, w := range ws {
		want := make([]float32, batch*w.Rows)
		o.MatMul(pool, w, x, want, batch)
		for j := range want {
			if outs[i][j] != want[j] {
				t.Fatalf("matrix %d (%s): MatMulN[%d] = %g, MatMul %g", i, w.Type, j, outs[i][j], want[j])
			}
		}
	}
}

// TestPackGQExact: the packed S·u + M form reproduces d·(q − z) bit for bit.
func TestPackGQExact(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	for _, typ := range []quant.Type{quant.GQ4, quant.GQ8} {
		m, deq := randGQ(t, r, typ, 3, 256, false, false)
		d := newSMRow(m.Cols)
		for row := 0; row < m.Rows; row++ {
			d.decode(typ, m.Row(row))
			for c := 0; c < m.Cols; c++ {
				got := d.s[c/16]*float32(d.q[c]) + d.m[c/16]
				if got != deq[row*m.Cols+c] {
					t.Fatalf("%s [%d,%d]: S·u+M = %g, d·(q−z) = %g", typ, row, c, got, deq[row*m.Cols+c])
				}
			}
		}
	}
}
