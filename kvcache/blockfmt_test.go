package kvcache

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"pagoda/kernels"
	"pagoda/model"
	"pagoda/quant"
)

// quantRef is quant's own quantize-then-dequantize of x.
func quantRef(t *testing.T, f BlockFormat, x []float32) []float32 {
	t.Helper()
	b, err := quant.Quantize(f.qtype(), x)
	if err != nil {
		t.Fatal(err)
	}
	y := make([]float32, len(x))
	if err := quant.Dequantize(f.qtype(), b, y); err != nil {
		t.Fatal(err)
	}
	return y
}

// TestBlockFormatRoundTrip: what Put stores, Get reads back bit for bit
// as quant's dequantization of quant's quantization, and Scores/Mix see
// the same numbers (a one-hot query or weight picks out one element).
func TestBlockFormatRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const heads, dim, tokens = 2, 64, 4
	for _, f := range blockFormats {
		p := f.NewPages(3, tokens, heads, dim, nil, nil)
		rows := make([][]float32, tokens)
		for s := range rows {
			rows[s] = randRow(r, heads*dim)
			for i := range rows[s] {
				rows[s][i] *= float32(math.Pow(10, float64(i/qk%4-2)))
			}
			p.Put(2, s, rows[s])
		}
		p.CopyPage(1, 2)
		bp := p.(*blockPages)
		for s, row := range rows {
			// The page holds ggml's bytes: quant's encoder of the row.
			want, err := quant.Quantize(f.qtype(), row)
			if err != nil {
				t.Fatal(err)
			}
			if got := bp.data[bp.pageBytes+s*bp.rowBytes : bp.pageBytes+(s+1)*bp.rowBytes]; string(got) != string(want) {
				t.Fatalf("%v slot %d: page bytes differ from quant.Quantize", f, s)
			}
		}
		for s, row := range rows {
			want, got := quantRef(t, f, row), make([]float32, heads*dim)
			p.Get(1, s, got)
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("%v slot %d elem %d: got %v, want %v", f, s, i, got[i], want[i])
				}
			}
		}
	}
}

// TestBlockFormatNaN: a NaN in a row reads back as NaN over its block,
// not as a finite number attention would silently use.
func TestBlockFormatNaN(t *testing.T) {
	p := Q8_0.NewPages(1, 1, 1, 64, nil, nil)
	row := make([]float32, 64)
	row[40] = float32(math.NaN())
	row[3] = 1
	p.Put(0, 0, row)
	got := make([]float32, 64)
	p.Get(0, 0, got)
	if math.Abs(float64(got[3])-1) > 1e-3 || !math.IsNaN(float64(got[33])) {
		t.Fatalf("got %v", got)
	}
}

// TestBlockFormatAttention: attention through the cache with K/V in every
// block format, read in place by every instruction set's fused kernels,
// matches float64 attention over the dequantized rows tightly; against
// the f32 originals the quantization error is reported.
func TestBlockFormatAttention(t *testing.T) {
	for _, isa := range kernels.ISAs() {
		ops, _ := kernels.ForISA(isa)
		t.Run(isa, func(t *testing.T) { testBlockFormatAttention(t, ops) })
	}
}

func testBlockFormatAttention(t *testing.T, ops *kernels.Ops) {
	p := model.AttnParams{NHead: 8, NKVHead: 2, HeadDim: 64, Scale: 0.125}
	const n = 37
	for _, f := range blockFormats {
		r := rand.New(rand.NewPCG(7, 8))
		c, err := New(Config{NLayer: 1, NKVHead: 2, HeadDim: 64, BlockSize: 16, NumBlocks: 8, KFormat: f, VFormat: f, Ops: ops})
		if err != nil {
			t.Fatal(err)
		}
		var keys, vals, dk, dv, qs [][]float32
		for i := 0; i < n; i++ {
			keys, vals, qs = append(keys, randRow(r, 128)), append(vals, randRow(r, 128)), append(qs, randRow(r, 8*64))
			dk, dv = append(dk, quantRef(t, f, keys[i])), append(dv, quantRef(t, f, vals[i]))
		}
		c.Allocate(1, nil, 0, n)
		got := prefill(t, c, []int{0}, 1, 0, n, keys, vals, qs, p, 64)
		var worst float64
		for i := 0; i < n; i++ {
			var pos []int
			for j := 0; j <= i; j++ {
				pos = append(pos, j)
			}
			closeTo(t, f.String(), got[i], refAttend(dk, dv, pos, qs[i], 8, 2, 64, 64, p.Scale), 1e-5)
			exact := refAttend(keys, vals, pos, qs[i], 8, 2, 64, 64, p.Scale)
			for j := range exact {
				worst = max(worst, math.Abs(float64(got[i][j]-exact[j]))/(1+math.Abs(float64(exact[j]))))
			}
		}
		t.Logf("%v: worst error against f32 K/V %.3g (relative, 1+|x|)", f, worst)
		if limit := map[BlockFormat]float64{Q8_0: 2e-2, Q4_0: 3e-1, Q4_1: 3e-1, Q5_0: 1.5e-1, Q5_1: 1.5e-1, IQ4_NL: 3e-1}[f]; worst > limit {
			t.Errorf("%v: error %.3g against f32 K/V, over %g", f, worst, limit)
		}
	}
}

// TestBlockFormatBytes: a block's bytes are the formats' real sizes,
// 8.5/16 and 4.5/16 of f16, mixed K/V included.
func TestBlockFormatBytes(t *testing.T) {
	base := Config{NLayer: 3, NKVHead: 4, HeadDim: 64, NumBlocks: 1}
	f16 := base.BlockBytes()
	for _, c := range []struct {
		k, v       Format
		num, denom int64
	}{{Q8_0, Q8_0, 85, 160}, {Q4_0, Q4_0, 45, 160}, {Q8_0, F16, 85 + 160, 320}, {Q4_0, Q8_0, 45 + 85, 320}} {
		cfg := base
		cfg.KFormat, cfg.VFormat = c.k, c.v
		if got, want := cfg.BlockBytes(), f16*c.num/c.denom; got != want {
			t.Errorf("K %v V %v: block %d bytes, want %d (f16 %d)", c.k, c.v, got, want, f16)
		}
	}
}

func TestBlockFormatHeadDim(t *testing.T) {
	_, err := New(Config{NLayer: 1, NKVHead: 2, HeadDim: 48, NumBlocks: 4, VFormat: Q4_0})
	if err == nil || !strings.Contains(err.Error(), "multiples of 32") {
		t.Fatalf("head dim 48 with q4_0: %v", err)
	}
	if _, err := New(Config{NLayer: 1, NKVHead: 2, HeadDim: 48, NumBlocks: 4, KFormat: F32}); err != nil {
		t.Fatal(err)
	}
}

func TestParseFormat(t *testing.T) {
	for s, want := range map[string]Format{"q8_0": Q8_0, "Q4_0": Q4_0, "f16": F16, "bf16": BF16, "float32": F32, "": F16} {
		if got, err := ParseFormat(s); err != nil || got != want {
			t.Errorf("ParseFormat(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, f := range blockFormats {
		if got, err := ParseFormat(strings.ToUpper(f.String())); err != nil || got != f {
			t.Errorf("ParseFormat(%q) = %v, %v", f, got, err)
		}
	}
	if _, err := ParseFormat("q6_k"); err == nil || !strings.Contains(err.Error(), "iq4_nl") {
		t.Errorf("q6_k: %v", err)
	}
}
