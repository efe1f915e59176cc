package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"pagoda/quant"
)

// TestQ5KDotError measures, for qwen2-0.5B-shaped matrices of a Q5_K_M
// file (ffn_down: 896×4864 Q5_K; the 896-column ones fall back to Q5_1),
// how far the packed fast path's row dot products are from float64, next
// to ggml's arithmetic (quant.VecDot: the same activation quantization,
// integer sums per super-block, one float multiply per super-block). Both
// must stay within the activation quantization's own error; the numbers
// are logged (PAGODA_Q5K_REPORT=1 prints them at any verbosity).
func TestQ5KDotError(t *testing.T) {
	o := Best()
	if !o.packed {
		t.Skip("no packed kernels on this machine")
	}
	p := NewPool(2)
	defer p.Close()
	r := rand.New(rand.NewPCG(5, 6))
	for _, c := range []struct {
		typ        quant.Type
		rows, cols int
	}{{quant.Q5_K, 896, 4864}, {quant.Q5_1, 896, 896}} {
		m, _ := randMatrix(t, r, c.typ, c.rows, c.cols)
		wf := make([]float32, c.rows*c.cols)
		if err := quant.Dequantize(c.typ, m.Data, wf); err != nil {
			t.Fatal(err)
		}
		at, _ := quant.VecDotType(c.typ)
		asz, err := quant.RowSize(at, c.cols)
		if err != nil {
			t.Fatal(err)
		}
		ab := make([]byte, asz)
		xq := make([]float32, c.cols)
		var st [6]float64 // Σ(fast−exact)², Σ(ggml−exact)², Σ exact², Σ(fast−ggml)², Σ(fast−exactQ)², Σ(ggml−exactQ)²
		var flips, n int
		for trial := 0; trial < 8; trial++ {
			// Activations like an FFN's: mostly small, a few large.
			x := make([]float32, c.cols)
			for i := range x {
				x[i] = float32(r.NormFloat64())
				if r.IntN(64) == 0 {
					x[i] *= 20
				}
			}
			fast := make([]float32, c.rows)
			o.MatMul(p, m, x, fast, 1)
			quant.QuantizeActivations(c.typ, x, ab)
			if err := quant.Dequantize(at, ab, xq); err != nil {
				t.Fatal(err)
			}
			for row := 0; row < c.rows; row++ {
				var exact, exactQ float64
				for j, w := range wf[row*c.cols : (row+1)*c.cols] {
					exact += float64(w) * float64(x[j])
					exactQ += float64(w) * float64(xq[j])
				}
				gg := float64(quant.VecDot(c.typ, c.cols, m.Row(row), ab))
				f := float64(fast[row])
				st[0] += (f - exact) * (f - exact)
				st[1] += (gg - exact) * (gg - exact)
				st[2] += exact * exact
				st[3] += (f - gg) * (f - gg)
				st[4] += (f - exactQ) * (f - exactQ)
				st[5] += (gg - exactQ) * (gg - exactQ)
				// Which of the two is closer to float64.
				if math.Abs(f-exact) > math.Abs(gg-exact) {
					flips++
				}
				n++
			}
		}
		rms := math.Sqrt(st[2] / float64(n))
		rel := func(s float64) float64 { return math.Sqrt(s/float64(n)) / rms }
		msg := "%s %d×%d: RMS error / RMS value: fast %.3g, ggml %.3g vs float64; fast−ggml %.3g; vs float64 of the quantized activations: fast %.3g, ggml %.3g; fast farther from float64 than ggml in %.1f%% of rows"
		args := []any{c.typ, c.rows, c.cols, rel(st[0]), rel(st[1]), rel(st[3]), rel(st[4]), rel(st[5]), 100 * float64(flips) / float64(n)}
		t.Logf(msg, args...)
		if os.Getenv("PAGODA_Q5K_REPORT") != "" {
			fmt.Fprintf(os.Stderr, msg+"\n", args...)
		}
		// The fast path computes the dot product of the quantized
		// activations to float32 accuracy (its departures from ggml's
		// order of operations are at that level; for Q5_1, ggml also
		// rounds Q8_1's d·Σq to f16, which the fast path does not), and so
		// lands no farther from float64 than ggml does.
		if rel(st[4]) > 1e-5 {
			t.Errorf("%s: fast path %.3g from the exact product of its quantized activations", c.typ, rel(st[4]))
		}
		if rel(st[0]) > 1.01*rel(st[1]) {
			t.Errorf("%s: fast path error %.3g vs float64, ggml's %.3g", c.typ, rel(st[0]), rel(st[1]))
		}
	}
}
