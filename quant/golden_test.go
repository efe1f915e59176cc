package quant

import (
	"bytes"
	"math"
	"sort"
	"testing"

	"pagoda/testutil"
)

// goldenTypes lists the g-llama-gqa files made by `llama-quantize --pure`
// from the F32 file, with the relative RMS error Dequantize(file bytes) may
// show against the F32 weights (random normal weights, so these are the
// formats' typical errors with ~15% headroom, tight enough that a
// misplaced nibble or scale shows).
var goldenTypes = []struct {
	t      Type
	relRMS float64
}{
	{F16, 3e-4}, {BF16, 2.5e-3}, {Q8_0, 7e-3},
	{Q4_0, 0.1}, {Q4_1, 0.09}, {Q5_0, 0.05}, {Q5_1, 0.045},
	{Q2_K, 0.33}, {Q3_K, 0.17}, {Q4_K, 0.08}, {Q5_K, 0.04}, {Q6_K, 0.02},
}

func loadGolden(t *testing.T, typ string) map[string]*testTensor {
	t.Helper()
	return loadModel(t, "g-llama-gqa", typ)
}

func loadModel(t *testing.T, model, typ string) map[string]*testTensor {
	t.Helper()
	p := testutil.Shared(t, "golden/models/"+model+"."+typ+".gguf")
	ts, err := readGGUF(p)
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

func f32Data(t *testing.T, tt *testTensor) []float32 {
	t.Helper()
	out := make([]float32, tt.elems())
	if err := Dequantize(F32, tt.data, out); err != nil {
		t.Fatal(err)
	}
	return out
}

func sortedNames(m map[string]*testTensor) []string {
	var names []string
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// TestGoldenQuantize checks that Quantize reproduces llama-quantize's bytes
// and that Dequantize of llama.cpp's bytes lands near the F32 weights.
func TestGoldenQuantize(t *testing.T) {
	ref := loadGolden(t, "F32")
	for _, gt := range goldenTypes {
		t.Run(gt.t.String(), func(t *testing.T) {
			checkGoldenFile(t, ref, loadGolden(t, gt.t.String()), gt.t, gt.relRMS)
		})
	}
}

// TestGoldenOtherModels repeats the check on the other quantized golden
// models that have an F32 sibling (more tensor shapes, tied embeddings).
func TestGoldenOtherModels(t *testing.T) {
	for _, c := range []struct {
		model string
		t     Type
		rel   float64
	}{{"g-qwen2", Q4_K, 0.08}, {"g-qwen3", Q8_0, 7e-3}} {
		t.Run(c.model+"."+c.t.String(), func(t *testing.T) {
			checkGoldenFile(t, loadModel(t, c.model, "F32"), loadModel(t, c.model, c.t.String()), c.t, c.rel)
		})
	}
}

func checkGoldenFile(t *testing.T, ref, file map[string]*testTensor, typ Type, maxRel float64) {
	t.Helper()
	bs, ts := typ.BlockSize(), typ.TypeSize()
	nTensors, blocks, same := 0, 0, 0
	for _, name := range sortedNames(file) {
		q := file[name]
		if q.typ != typ {
			if q.typ != F32 || len(q.dims) != 1 {
				t.Errorf("%s: type %s in a %s file", name, q.typ, typ)
			}
			continue
		}
		nTensors++
		r, ok := ref[name]
		if !ok || r.typ != F32 || r.elems() != q.elems() {
			t.Fatalf("%s: no matching F32 tensor", name)
		}
		x := f32Data(t, r)

		got, err := Quantize(typ, x)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(got) != len(q.data) {
			t.Fatalf("%s: %d bytes, llama.cpp has %d", name, len(got), len(q.data))
		}
		bad := 0
		for b := 0; b < len(got); b += ts {
			blocks++
			if bytes.Equal(got[b:b+ts], q.data[b:b+ts]) {
				same++
			} else {
				if bad < 3 {
					t.Logf("%s: block %d (elements %d..) differs:\n got %x\nwant %x", name, b/ts, b/ts*bs, got[b:b+ts], q.data[b:b+ts])
				}
				bad++
			}
		}

		y := make([]float32, len(x))
		if err := Dequantize(typ, q.data, y); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var se, sx float64
		for i := range x {
			if math.IsNaN(float64(y[i])) || math.IsInf(float64(y[i]), 0) {
				t.Fatalf("%s: element %d dequantizes to %v", name, i, y[i])
			}
			d := float64(y[i]) - float64(x[i])
			se += d * d
			sx += float64(x[i]) * float64(x[i])
		}
		rel := math.Sqrt(se / sx)
		if rel > maxRel {
			t.Errorf("%s: dequantized relative RMS error %.4g > %.4g", name, rel, maxRel)
		}
		t.Logf("%s %v: rel RMS err %.4g, %d/%d blocks identical", name, q.dims, rel, len(got)/ts-bad, len(got)/ts)
	}
	if nTensors == 0 {
		t.Fatalf("no %s tensors in the file", typ)
	}
	t.Logf("%s: %d tensors, %d/%d blocks byte-identical to llama-quantize", typ, nTensors, same, blocks)
	if same != blocks {
		t.Errorf("%s: %d of %d blocks differ from llama-quantize", typ, blocks-same, blocks)
	}
}
