package model_test

import (
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"pagoda/hf/hftest"
	"pagoda/kernels"
	"pagoda/model"
	"pagoda/quant"
	"pagoda/safetensors"
	"pagoda/testutil"
)

var gptqLayouts = []struct {
	name, js string
	actOrder bool
}{
	{"gptq4-sym-g128-v1", `{"quant_method":"gptq","bits":4,"group_size":128,"sym":true,"desc_act":false}`, false},
	{"gptq4-asym-g32-v1", `{"quant_method":"gptq","bits":4,"group_size":32,"sym":false}`, false},
	{"gptq4-asym-g64-v2", `{"quant_method":"gptq","bits":4,"group_size":64,"sym":false,"checkpoint_format":"gptq_v2"}`, false},
	{"gptq4-asym-perchannel", `{"quant_method":"gptq","bits":4,"group_size":-1,"sym":false}`, false},
	{"gptq4-asym-g32-actorder", `{"quant_method":"gptq","bits":4,"group_size":32,"sym":false,"desc_act":true}`, true},
	{"gptq4-sym-g128-actorder", `{"quant_method":"gptq","bits":4,"group_size":128,"sym":true,"desc_act":true}`, true},
	{"gptq8-sym-g128", `{"quant_method":"gptq","bits":8,"group_size":128,"sym":true}`, false},
	{"gptq8-asym-g32-actorder", `{"quant_method":"gptq","bits":8,"group_size":32,"sym":false,"desc_act":true}`, true},
	{"awq-g128", `{"quant_method":"awq","bits":4,"group_size":128,"zero_point":true,"version":"gemm"}`, false},
	{"awq-g32", `{"quant_method":"awq","bits":4,"group_size":32,"zero_point":true,"version":"gemm"}`, false},
	{"gptq4-asym-g64-lmhead", `{"quant_method":"gptq","bits":4,"group_size":64,"sym":false,"lm_head":true}`, false},
}

// dequantMatrix expands m to rows×cols floats in input-column order.
func dequantMatrix(t *testing.T, m *kernels.Matrix) []float32 {
	t.Helper()
	out := make([]float32, m.Rows*m.Cols)
	row := make([]float32, m.Cols)
	for r := 0; r < m.Rows; r++ {
		if err := quant.Dequantize(m.Type, m.Row(r), row); err != nil {
			t.Fatal(err)
		}
		for j, v := range row {
			k := j
			if m.Perm != nil {
				k = int(m.Perm[j])
			}
			out[r*m.Cols+k] = v
		}
	}
	return out
}

func prefillLogits(t *testing.T, m *model.Model) []float32 {
	t.Helper()
	toks := []int32{1, 17, 300, 42, 5, 511, 77}
	b := &model.Batch{Logits: make([]bool, len(toks))}
	for i, tok := range toks {
		b.Tokens = append(b.Tokens, tok)
		b.Pos = append(b.Pos, int32(i))
		b.Seq = append(b.Seq, 0)
		b.Logits[i] = true
	}
	logits, err := m.Forward(b, model.NewFlatCache(&m.Config, 1, 16))
	if err != nil {
		t.Fatal(err)
	}
	return append([]float32(nil), logits...)
}

// TestGPTQAWQCheckpoints: for every layout, the quantized checkpoint loads
// as GQ4/GQ8 matrices whose dequantized values equal, bit for bit, GPTQ's
// float32 (q − z)·s (the float twin holds exactly those), and its logits
// match the float twin's: to float rounding on the reference path, and
// within the Q8_0 activation rounding of the integer kernels on the fast
// path.
func TestGPTQAWQCheckpoints(t *testing.T) {
	tok := testutil.Shared(t, "models/llama2.c/tok512.bin")
	for _, lc := range gptqLayouts {
		t.Run(lc.name, func(t *testing.T) {
			ck := hftest.Write(t, t.TempDir(), hftest.Tiny, lc.js, lc.actOrder)
			for _, ref := range []bool{true, false} {
				o := model.Options{Threads: 2, Tokenizer: tok, Reference: ref}
				qm, err := model.Open(ck.QuantDir, o)
				if err != nil {
					t.Fatal(err)
				}
				fm, err := model.Open(ck.FloatDir, o)
				if err != nil {
					qm.Close()
					t.Fatal(err)
				}
				if ref {
					perms := 0
					for i, l := range qm.W.Layers {
						fl := fm.W.Layers[i]
						for j, pair := range [][2]*kernels.Matrix{{l.Q, fl.Q}, {l.K, fl.K}, {l.V, fl.V}, {l.O, fl.O}, {l.Gate, fl.Gate}, {l.Up, fl.Up}, {l.Down, fl.Down}} {
							q, f := pair[0], pair[1]
							if want := map[bool]quant.Type{false: quant.GQ4, true: quant.GQ8}[strings.HasPrefix(lc.name, "gptq8")]; q.Type != want {
								t.Fatalf("layer %d matrix %d: type %s, want %s", i, j, q.Type, want)
							}
							if q.Perm != nil {
								perms++
							}
							got, want := dequantMatrix(t, q), dequantMatrix(t, f)
							for k := range want {
								if math.Float32bits(got[k]) != math.Float32bits(want[k]) {
									t.Fatalf("layer %d matrix %d [%d]: %g, dequantized checkpoint %g", i, j, k, got[k], want[k])
								}
							}
						}
						// q/k/v (and gate/up) were quantized in one order:
						// one permutation serves them (one gather).
						for _, p := range [][2]*kernels.Matrix{{l.Q, l.K}, {l.Q, l.V}, {l.Gate, l.Up}} {
							if (p[0].Perm == nil) != (p[1].Perm == nil) || (p[0].Perm != nil && &p[0].Perm[0] != &p[1].Perm[0]) {
								t.Fatalf("layer %d: act-order permutations of matrices sharing an input not shared", i)
							}
						}
					}
					// With one group a row (in = group size) act-order
					// changes nothing and no permutation is kept.
					if lc.actOrder != (perms > 0) {
						t.Fatalf("%d permuted matrices (act-order %v)", perms, lc.actOrder)
					}
					if lmHead := strings.HasSuffix(lc.name, "lmhead"); lmHead != (qm.W.Output.Type == quant.GQ4) || lmHead == (qm.W.Output == qm.W.Embd) {
						t.Fatalf("output matrix %s", qm.W.Output.Type)
					}
					if qm.W.Output.Type == quant.GQ4 && !slices.Equal(dequantMatrix(t, qm.W.Output), dequantMatrix(t, fm.W.Output)) {
						t.Fatalf("quantized lm_head differs from its dequantized twin")
					}
				}
				ql, fl := prefillLogits(t, qm), prefillLogits(t, fm)
				qm.Close()
				fm.Close()
				var maxAbs, maxDiff float64
				for i := range fl {
					maxAbs = max(maxAbs, math.Abs(float64(fl[i])))
					maxDiff = max(maxDiff, math.Abs(float64(ql[i]-fl[i])))
				}
				tol := 1e-5 * maxAbs
				if !ref {
					tol = 2e-2 * maxAbs // Q8_0 activations: measured ≤ 6.5e-3
				}
				t.Logf("reference=%v: max |Δlogit| %.3g of max |logit| %.3g", ref, maxDiff, maxAbs)
				if maxDiff > tol {
					t.Fatalf("reference=%v: logits differ by %g (max |logit| %g, tolerance %g)", ref, maxDiff, maxAbs, tol)
				}
			}
		})
	}
}

// TestGPTQBadCheckpoints: what is wrong is named — the file and tensor,
// or config.json's field.
func TestGPTQBadCheckpoints(t *testing.T) {
	const js = `{"quant_method":"gptq","bits":4,"group_size":32,"sym":false,"desc_act":true}`
	ck := hftest.Write(t, t.TempDir(), hftest.Tiny, js, true)
	drop := func(name string) []*safetensors.Tensor {
		var out []*safetensors.Tensor
		for _, x := range ck.Tensors {
			if x.Name != name {
				out = append(out, x)
			}
		}
		return out
	}
	edit := func(name string, f func(x *safetensors.Tensor) *safetensors.Tensor) []*safetensors.Tensor {
		var out []*safetensors.Tensor
		for _, x := range ck.Tensors {
			if x.Name == name {
				c := *x
				x = f(&c)
			}
			out = append(out, x)
		}
		return out
	}
	withQC := func(qc map[string]any) map[string]any {
		c := map[string]any{}
		for k, v := range ck.Config {
			c[k] = v
		}
		c["quantization_config"] = qc
		return c
	}
	for _, tc := range []struct {
		name string
		cfg  map[string]any
		ts   []*safetensors.Tensor
		want []string
	}{
		{"missing qzeros", ck.Config, drop("model.layers.1.mlp.up_proj.qzeros"),
			[]string{"model.safetensors", `"model.layers.1.mlp.up_proj.qzeros" missing`}},
		{"missing g_idx", ck.Config, drop("model.layers.0.self_attn.k_proj.g_idx"),
			[]string{"model.safetensors", `"model.layers.0.self_attn.k_proj.qweight"`, "g_idx is missing"}},
		{"scales shape", ck.Config, edit("model.layers.0.mlp.down_proj.scales", func(x *safetensors.Tensor) *safetensors.Tensor {
			x.Shape = []int64{4, 256}
			return x
		}), []string{"model.safetensors", `"model.layers.0.mlp.down_proj.scales": shape [4 256], want [8 128]`}},
		{"layer shape", ck.Config, edit("model.layers.0.self_attn.o_proj.qweight", func(x *safetensors.Tensor) *safetensors.Tensor {
			x.Shape = []int64{8, 256}
			return x
		}), []string{"model.layers.0.self_attn.o_proj"}},
		{"qweight dtype", ck.Config, edit("model.layers.0.self_attn.q_proj.qweight", func(x *safetensors.Tensor) *safetensors.Tensor {
			x.DType = "F32"
			return x
		}), []string{"model.safetensors", `"model.layers.0.self_attn.q_proj.qweight": dtype F32, want I32`}},
		{"3 bits", withQC(map[string]any{"quant_method": "gptq", "bits": 3, "group_size": 128}), ck.Tensors,
			[]string{"config.json", "quantization_config", "3 bits not supported"}},
		{"group 16", withQC(map[string]any{"quant_method": "gptq", "bits": 4, "group_size": 16}), ck.Tensors,
			[]string{"config.json", "group_size 16 not supported"}},
		{"awq 8 bits", withQC(map[string]any{"quant_method": "awq", "bits": 8, "group_size": 128}), ck.Tensors,
			[]string{"config.json", "8 bits not supported"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ck.Rewrite(t, tc.cfg, tc.ts)
			m, err := model.Open(ck.QuantDir, model.Options{Threads: 1})
			if err == nil {
				m.Close()
				t.Fatal("loaded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q does not say %q", err, w)
				}
			}
		})
	}
	ck.Rewrite(t, ck.Config, ck.Tensors)
	m, err := model.Open(ck.QuantDir, model.Options{Threads: 1})
	if err != nil {
		t.Fatalf("restored checkpoint: %v", err)
	}
	m.Close()
}

// TestGPTQQuantizeConfigFile: AutoGPTQ's quantize_config.json beside a
// config.json without quantization_config is read too (v1 zeros).
func TestGPTQQuantizeConfigFile(t *testing.T) {
	const js = `{"quant_method":"gptq","bits":4,"group_size":64,"sym":false}`
	ck := hftest.Write(t, t.TempDir(), hftest.Tiny, js, false)
	cfg := map[string]any{}
	for k, v := range ck.Config {
		if k != "quantization_config" {
			cfg[k] = v
		}
	}
	ck.Rewrite(t, cfg, ck.Tensors)
	if _, err := model.Open(ck.QuantDir, model.Options{Threads: 1}); err == nil || !strings.Contains(err.Error(), "q_proj.weight") {
		t.Fatalf("without a quantization config: %v", err)
	}
	writeBytes(t, filepath.Join(ck.QuantDir, "quantize_config.json"), []byte(`{"bits":4,"group_size":64,"sym":false,"desc_act":false}`))
	qm, err := model.Open(ck.QuantDir, model.Options{Threads: 1, Reference: true})
	if err != nil {
		t.Fatal(err)
	}
	defer qm.Close()
	fm, err := model.Open(ck.FloatDir, model.Options{Threads: 1, Reference: true})
	if err != nil {
		t.Fatal(err)
	}
	defer fm.Close()
	got, want := dequantMatrix(t, qm.W.Layers[1].Down), dequantMatrix(t, fm.W.Layers[1].Down)
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("down[%d] = %g, want %g", i, got[i], want[i])
		}
	}
}
