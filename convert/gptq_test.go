package convert

import (
	"math"
	"path/filepath"
	"strings"
	"testing"

	"pagoda/gguf"
	"pagoda/hf/hftest"
	"pagoda/kernels"
	"pagoda/model"
	"pagoda/quant"
	"pagoda/testutil"
)

func dequantAll(t *testing.T, m *kernels.Matrix) []float32 {
	t.Helper()
	out := make([]float32, m.Rows*m.Cols)
	if err := quant.Dequantize(m.Type, m.Data[:m.Rows*m.RowBytes], out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestConvertGPTQAWQ: pagoda convert writes each layout as the type its
// comment promises, and the GGUF's weights are the checkpoint's
// dequantized ones — bit for bit for Q4_0/Q8_0, within s/128 for Q4_1
// (f16 m = −z·s), within 2^-11 relative for F16 — in ggml's row order.
func TestConvertGPTQAWQ(t *testing.T) {
	tok := testutil.Shared(t, "models/llama2.c/tok512.bin")
	for _, tc := range []struct {
		name, js string
		actOrder bool
		want     quant.Type
	}{
		{"gptq4-sym-g128", `{"quant_method":"gptq","bits":4,"group_size":128,"sym":true}`, false, quant.Q4_0},
		{"gptq4-sym-g32-v2", `{"quant_method":"gptq","bits":4,"group_size":32,"sym":true,"checkpoint_format":"gptq_v2"}`, false, quant.Q4_0},
		{"gptq4-asym-g64", `{"quant_method":"gptq","bits":4,"group_size":64,"sym":false}`, false, quant.Q4_1},
		{"awq-g128", `{"quant_method":"awq","bits":4,"group_size":128,"zero_point":true,"version":"gemm"}`, false, quant.Q4_1},
		{"gptq8-sym-perchannel", `{"quant_method":"gptq","bits":8,"group_size":-1,"sym":true}`, false, quant.Q8_0},
		{"gptq8-asym-g32", `{"quant_method":"gptq","bits":8,"group_size":32,"sym":false}`, false, quant.F16},
		{"gptq4-asym-g32-actorder", `{"quant_method":"gptq","bits":4,"group_size":32,"sym":false,"desc_act":true}`, true, quant.F16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			ck := hftest.Write(t, dir, hftest.Tiny, tc.js, tc.actOrder)
			out := filepath.Join(dir, "m.gguf")
			if err := ToGGUF(ck.QuantDir, out, ConvertOptions{Tokenizer: tok}); err != nil {
				t.Fatal(err)
			}
			f, err := gguf.Open(out)
			if err != nil {
				t.Fatal(err)
			}
			for _, name := range []string{"blk.0.attn_q.weight", "blk.1.ffn_down.weight", "blk.1.attn_output.weight"} {
				if typ := f.Tensor(name).Type; typ != tc.want {
					t.Fatalf("%s: %s, want %s", name, typ, tc.want)
				}
			}
			f.Close()
			o := model.Options{Threads: 2, Reference: true}
			gm, err := model.Open(out, o)
			if err != nil {
				t.Fatal(err)
			}
			defer gm.Close()
			fm, err := model.Open(ck.FloatDir, o)
			if err != nil {
				t.Fatal(err)
			}
			defer fm.Close()
			var worst float64 // max |Δ| / tolerance
			defer func() { t.Logf("%s: max |Δw| / tolerance %.3g", tc.want, worst) }()
			for i, l := range gm.W.Layers {
				fl := fm.W.Layers[i]
				for j, pair := range [][2]*kernels.Matrix{{l.Q, fl.Q}, {l.K, fl.K}, {l.V, fl.V}, {l.O, fl.O}, {l.Gate, fl.Gate}, {l.Up, fl.Up}, {l.Down, fl.Down}} {
					got, want := dequantAll(t, pair[0]), dequantAll(t, pair[1])
					cols := pair[1].Cols
					for k := range want {
						var tol float64
						switch tc.want {
						case quant.Q4_1:
							// s ≤ (row range)/15 for every group.
							lo, hi := float32(0), float32(0)
							for _, v := range want[k/cols*cols : (k/cols+1)*cols] {
								lo, hi = min(lo, v), max(hi, v)
							}
							tol = float64(hi-lo) / 15 / 128
						case quant.F16:
							tol = math.Abs(float64(want[k]))/2048 + 0x1p-25 // f16 subnormals: absolute
						}
						d := math.Abs(float64(got[k] - want[k]))
						if d > 0 {
							worst = max(worst, d/tol)
						}
						if d > tol {
							t.Fatalf("layer %d matrix %d [%d]: %g, dequantized checkpoint %g (tolerance %g)", i, j, k, got[k], want[k], tol)
						}
					}
				}
			}
		})
	}
}

// TestConvertGPTQErrors: a broken layer fails the conversion naming the
// file and tensor.
func TestConvertGPTQErrors(t *testing.T) {
	dir := t.TempDir()
	ck := hftest.Write(t, dir, hftest.Tiny, `{"quant_method":"gptq","bits":4,"group_size":32,"sym":false,"desc_act":true}`, true)
	var ts = ck.Tensors[:0:0]
	for _, x := range ck.Tensors {
		if x.Name != "model.layers.1.self_attn.v_proj.scales" {
			ts = append(ts, x)
		}
	}
	ck.Rewrite(t, ck.Config, ts)
	err := ToGGUF(ck.QuantDir, filepath.Join(dir, "m.gguf"), ConvertOptions{})
	if err == nil || !strings.Contains(err.Error(), "model.safetensors") || !strings.Contains(err.Error(), `"model.layers.1.self_attn.v_proj.scales" missing`) {
		t.Fatalf("err %v", err)
	}
}
