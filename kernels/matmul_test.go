package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"pagoda/quant"
)

// TestActQuantMatchesQuant holds the activation quantizers to package quant's
// byte-exact ports of ggml's quantize_row_q8_0_ref / q8_K_ref.
func TestActQuantMatchesQuant(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for trial := 0; trial < 50; trial++ {
		x := randF32(r, 512)
		if trial%5 == 0 {
			for i := range x {
				x[i] = float32(r.IntN(9)-4) * 0.25 // exact ties
			}
		}
		if trial == 1 {
			clear(x[:256])
		}
		q := make([]int8, 512)
		d := make([]float32, 32)
		quantRowQ8_0(x, q, d)
		ref, err := quant.Quantize(quant.Q8_0, x)
		if err != nil {
			t.Fatal(err)
		}
		for b := 0; b < 16; b++ {
			if want := quant.F16ToF32(binary.LittleEndian.Uint16(ref[34*b:])); d[2*b] != want || d[2*b+1] != want {
				t.Fatalf("trial %d Q8_0 block %d: d %g want %g", trial, b, d[2*b], want)
			}
			for j := 0; j < 32; j++ {
				if q[32*b+j] != int8(ref[34*b+2+j]) {
					t.Fatalf("trial %d Q8_0 block %d elem %d: %d want %d (x=%g)", trial, b, j, q[32*b+j], int8(ref[34*b+2+j]), x[32*b+j])
				}
			}
		}
		quantRowQ8K(x, q, d)
		ref, err = quant.Quantize(quant.Q8_K, x)
		if err != nil {
			t.Fatal(err)
		}
		for b := 0; b < 2; b++ {
			blk := ref[292*b:]
			want := math.Float32frombits(binary.LittleEndian.Uint32(blk))
			for j := 0; j < 16; j++ {
				if d[16*b+j] != want {
					t.Fatalf("trial %d Q8_K block %d: d %g want %g", trial, b, d[16*b+j], want)
				}
			}
			for j := 0; j < 256; j++ {
				if q[256*b+j] != int8(blk[4+j]) {
					t.Fatalf("trial %d Q8_K block %d elem %d: %d want %d", trial, b, j, q[256*b+j], int8(blk[4+j]))
				}
			}
		}
	}
}

// actTypeFor is the activation format ggml pairs with weight type t.
func actTypeFor(t quant.Type) quant.Type {
	switch t {
	case quant.Q2_K, quant.Q3_K, quant.Q4_K, quant.Q5_K, quant.Q6_K:
		return quant.Q8_K
	}
	return quant.Q8_0
}

var matTypes = []quant.Type{quant.Q8_0, quant.Q4_0, quant.Q4_1, quant.Q5_0, quant.Q5_1,
	quant.Q2_K, quant.Q3_K, quant.Q4_K, quant.Q5_K, quant.Q6_K, quant.F32, quant.F16, quant.BF16}

func randMatrix(t testing.TB, r *rand.Rand, typ quant.Type, rows, cols int) (*Matrix, []float32) {
	wf := make([]float32, rows*cols)
	for i := range wf {
		wf[i] = float32(r.NormFloat64() * 0.5)
	}
	data, err := quant.Quantize(typ, wf)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMatrix(typ, rows, cols, data)
	if err != nil {
		t.Fatal(err)
	}
	deq := make([]float32, rows*cols)
	if err := quant.Dequantize(typ, data, deq); err != nil {
		t.Fatal(err)
	}
	return m, deq
}

// TestMatMul checks MatMul on every ISA against float64 sums of the
// dequantized weights with, for the integer kernels, the activations
// quantized exactly as ggml does (so the only difference left is float32
// summation order: tolerance 2e-5 of Σ|w·x|), and with float activations
// for the float kernels and the generic path.
func TestMatMul(t *testing.T) { forEachISA(t, testMatMul) }

func testMatMul(t *testing.T, o *Ops) {
	r := rand.New(rand.NewPCG(7, 8))
	pool := NewPool(2)
	defer pool.Close()
	for _, typ := range matTypes {
		colsList := []int{32, 64, 96, 512}
		if actTypeFor(typ) == quant.Q8_K {
			colsList = []int{256, 512}
		}
		if typ.BlockSize() == 1 {
			colsList = append(colsList, 7, 40)
		}
		for _, cols := range colsList {
			for _, rows := range []int{1, 15, 16, 17, 40} {
				m, deq := randMatrix(t, r, typ, rows, cols)
				batches := []int{1, 2, 3, 5, 8, 9, 16, 17}
				if rows == 17 && cols <= 256 {
					batches = []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}
				}
				for _, batch := range batches {
					if testing.Short() && batch > 3 && rows > 17 {
						continue
					}
					name := fmt.Sprintf("%s/%dx%d/b%d", typ, rows, cols, batch)
					// Unaligned input and output (one float in).
					x := randF32(r, batch*cols+1)[1:]
					// Activations as the integer kernels see them.
					xq := make([]float32, len(x))
					at := actTypeFor(typ)
					for b := 0; b < batch; b++ {
						qb, _ := quant.Quantize(at, x[b*cols:(b+1)*cols])
						quant.Dequantize(at, qb, xq[b*cols:(b+1)*cols])
					}
					integer := o.packed && typ != quant.F32 && typ != quant.F16 && typ != quant.BF16
					xr := x
					if integer {
						xr = xq
					}
					out := make([]float32, batch*rows+2)[1:]
					out[batch*rows] = 42 // must stay untouched
					o.MatMul(pool, m, x, out[:batch*rows], batch)
					if out[batch*rows] != 42 {
						t.Fatalf("%s: wrote past the output", name)
					}
					for b := 0; b < batch; b++ {
						for i := 0; i < rows; i++ {
							var want, mag float64
							for c := 0; c < cols; c++ {
								p := float64(deq[i*cols+c]) * float64(xr[b*cols+c])
								want += p
								mag += math.Abs(p)
							}
							got := float64(out[b*rows+i])
							if math.Abs(got-want) > 2e-5*mag+1e-6 {
								t.Fatalf("%s: out[%d,%d] = %g, want %g (Σ|·| %g)", name, b, i, got, want, mag)
							}
						}
					}
				}
			}
		}
	}
}

// TestQuantizeActsISA: the assembly activation quantizers produce the same
// bytes and scales as the Go ones (ties and all-zero blocks included).
func TestQuantizeActsISA(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	kinds := []*packed{
		{kind: packQ8C, act: actQ8_0, block: 32, k: 128},
		{kind: packQ4C, act: actQ8_0, block: 32, k: 8},
		{kind: packSM16, act: actQ8_K, block: 16, k: 1},
		{kind: packSM16, act: actQ8_0, block: 16, k: 1},
		{kind: packQ4SM, act: actQ8_K, block: 32, k: 1},
		{kind: packQ4SM, act: actQ8_0, block: 32, k: 1},
		{kind: packQ8S16, act: actQ8_K, block: 16, k: 32},
		{kind: packQ6K, act: actQ8_K, block: 16, k: 32, nodx: true},
		{kind: packQ5C, act: actQ8_0, block: 32, k: 16},
	}
	asm := false
	for _, o := range isaSets {
		asm = asm || o.asmQuant
	}
	if !asm {
		t.Skip("no assembly quantizer on this CPU")
	}
	for _, pk := range kinds {
		for _, batch := range []int{1, 3, 8, 11} {
			const cols = 512
			x := randF32(r, batch*cols)
			for i := 0; i < cols; i++ {
				x[i] = float32(r.IntN(9)-4) * 0.25 // ties
			}
			if batch > 1 {
				clear(x[cols : cols+256]) // zero blocks
			}
			if batch > 2 {
				x[2*cols+300] = -50 // negative extreme
			}
			var want, got actBuf
			quantizeActs(nil, pk, x, batch, cols, &want, false)
			quantizeActs(nil, pk, x, batch, cols, &got, true)
			for i := range want.q {
				if want.q[i] != got.q[i] {
					t.Fatalf("%+v batch %d: q[%d] = %d, want %d", *pk, batch, i, got.q[i], want.q[i])
				}
			}
			for i := range want.st {
				if !closeRel(got.st[i], want.st[i], 1e-6) {
					t.Fatalf("%+v batch %d: st[%d] = %g, want %g", *pk, batch, i, got.st[i], want.st[i])
				}
			}
		}
	}
}

// TestMatMulN: the shared-input product gives exactly what separate MatMul
// calls give, with mixed weight types.
func TestMatMulN(t *testing.T) { forEachISA(t, testMatMulN) }

func testMatMulN(t *testing.T, o *Ops) {
	r := rand.New(rand.NewPCG(15, 16))
	pool := NewPool(2)
	defer pool.Close()
	const cols = 512
	var ws []*Matrix
	for i, typ := range []quant.Type{quant.Q8_0, quant.Q4_0, quant.Q4_K, quant.F16, quant.Q8_0, quant.Q6_K} {
		m, _ := randMatrix(t, r, typ, 17+16*i, cols)
		ws = append(ws, m)
	}
	for _, batch := range []int{1, 2, 9, 17} {
		x := randF32(r, batch*cols)
		outs := make([][]float32, len(ws))
		for i, w := range ws {
			outs[i] = make([]float32, batch*w.Rows)
		}
		o.MatMulN(pool, ws, x, outs, batch)
		for i, w := range ws {
			want := make([]float32, batch*w.Rows)
			o.MatMul(pool, w, x, want, batch)
			for k := range want {
				if outs[i][k] != want[k] {
					t.Fatalf("batch %d matrix %d (%s) out[%d] = %g, want %g", batch, i, w.Type, k, outs[i][k], want[k])
				}
			}
		}
	}
}

// TestMalformedMatrix: a hand-built Matrix whose data is too short panics
// with a message instead of letting the assembly read past it.
func TestMalformedMatrix(t *testing.T) {
	for _, typ := range []quant.Type{quant.Q8_0, quant.F16} {
		m := &Matrix{Type: typ, Rows: 8, Cols: 64, RowBytes: 0, Data: make([]byte, 10)}
		m.RowBytes, _ = quant.RowSize(typ, 64)
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", typ)
				}
			}()
			MatMul(nil, m, make([]float32, 64), make([]float32, 8), 1)
		}()
	}
	if _, err := NewMatrix(quant.Q8_0, 8, 64, make([]byte, 10)); err == nil {
		t.Error("NewMatrix accepted short data")
	}
}

// TestMatMulConcurrent: several goroutines multiplying by the same matrices
// through every instruction set at once (packing on first use races, and
// the AVX-512 and AVX2 layouts live side by side) get each set's own
// results; run under -race.
func TestMatMulConcurrent(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(19, 20))
	const cols = 256
	var ms []*Matrix
	for _, typ := range []quant.Type{quant.Q8_0, quant.Q4_K, quant.Q6_K, quant.F16} {
		m, _ := randMatrix(t, r, typ, 33, cols)
		ms = append(ms, m)
	}
	x := randF32(r, 3*cols)
	// want[k][i]: set k on matrix i, from an unpacked copy.
	want := make([][][]float32, len(isaSets))
	for k, o := range isaSets {
		want[k] = make([][]float32, len(ms))
		for i, m := range ms {
			c := *m
			c.pk = [2]unsafe.Pointer{}
			want[k][i] = make([]float32, 3*m.Rows)
			o.MatMul(nil, &c, x, want[k][i], 3)
		}
	}
	pool := NewPool(2)
	defer pool.Close()
	done := make(chan error)
	for g := 0; g < 4; g++ {
		go func() {
			var err error
			for n := 0; n < 10 && err == nil; n++ {
				k := (g + n) % len(isaSets)
				for i, m := range ms {
					out := make([]float32, 3*m.Rows)
					isaSets[k].MatMul(pool, m, x, out, 3)
					for j := range out {
						if out[j] != want[k][i][j] {
							err = fmt.Errorf("%s matrix %d out[%d] = %g, want %g", isaSets[k].name, i, j, out[j], want[k][i][j])
							break
						}
					}
				}
			}
			done <- err
		}()
	}
	for g := 0; g < 4; g++ {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// TestMatMulBatchInvariant: a row of activations gets the same bits
// whatever the batch around it (alone, or anywhere in tiles of 8 and a
// partial one), for every weight type on every instruction set. Prefill
// and decode, and a speculative step's verification rows, rely on it.
func TestMatMulBatchInvariant(t *testing.T) { forEachISA(t, testMatMulBatchInvariant) }

func testMatMulBatchInvariant(t *testing.T, o *Ops) {
	r := rand.New(rand.NewPCG(11, 12))
	pool := NewPool(2)
	defer pool.Close()
	const rows, cols, batch = 33, 512, 19
	for _, typ := range matTypes {
		m, _ := randMatrix(t, r, typ, rows, cols)
		x := randF32(r, batch*cols)
		all := make([]float32, batch*rows)
		o.MatMul(pool, m, x, all, batch)
		one := make([]float32, rows)
		for b := 0; b < batch; b++ {
			o.MatMul(pool, m, x[b*cols:(b+1)*cols], one, 1)
			for i := range one {
				if math.Float32bits(one[i]) != math.Float32bits(all[b*rows+i]) {
					t.Fatalf("%s: row %d of %d, output %d: %g alone, %g in the batch", typ, b, batch, i, one[i], all[b*rows+i])
				}
			}
		}
	}
}
