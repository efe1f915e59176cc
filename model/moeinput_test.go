package model_test

import (
	"encoding/binary"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"pagoda/gguf"
	"pagoda/model"
	"pagoda/quant"
	"pagoda/testutil"
)

// Bad MoE/MLA input fails to load with an error naming the file and the
// key or tensor at fault.
func TestMoEBadInput(t *testing.T) {
	dir := testutil.Shared(t, "golden")
	models := filepath.Join(dir, "models")
	tmp := t.TempDir()
	for _, tc := range []struct {
		name, src string
		edit      ggufEdit
		want      []string
	}{
		{"unknown gating", "g-deepseek2.F32.gguf", ggufEdit{set: map[string]any{"deepseek2.expert_gating_func": uint32(7)}},
			[]string{"deepseek2.expert_gating_func = 7", "unknown gating function"}},
		{"expert count above the tensors'", "g-qwen3moe.F32.gguf", ggufEdit{set: map[string]any{"qwen3moe.expert_count": uint32(6)}},
			[]string{`"blk.0.ffn_gate_inp.weight"`, "routes to 8 experts", "expert_count 6"}},
		{"one expert tensor short", "g-qwen2moe.F32.gguf", ggufEdit{tensor: onTensor("blk.1.ffn_up_exps.weight",
			func(ti *gguf.TensorInfo) (quant.Type, []uint64, []byte, bool) {
				return ti.Type, []uint64{ti.Dims[0], ti.Dims[1], 4}, ti.Data[:len(ti.Data)/2], true
			})}, []string{`"blk.1.ffn_up_exps.weight"`, "holds 4 experts", "expert_count 8"}},
		{"more experts used than there are", "g-mixtral.F32.gguf", ggufEdit{set: map[string]any{"llama.expert_used_count": uint32(9)}},
			[]string{"experts used per token 9 out of range [1, 8]"}},
		{"expert width off", "g-qwen3moe.F32.gguf", ggufEdit{set: map[string]any{"qwen3moe.expert_feed_forward_length": uint32(48)}},
			[]string{`"blk.0.ffn_gate_exps.weight"`, "shape [128 32 8], want [128 48 8]"}},
		{"MoE architecture without experts", "g-qwen3moe.F32.gguf", ggufEdit{set: map[string]any{"qwen3moe.expert_count": uint32(0)}},
			[]string{"qwen3moe.expert_count > 0"}},
		{"experts one tensor each", "g-mixtral.F32.gguf", ggufEdit{tensor: func(ti *gguf.TensorInfo) (quant.Type, []uint64, []byte, bool) {
			return ti.Type, ti.Dims, ti.Data, !strings.HasPrefix(ti.Name, "blk.0.ffn_gate_exps")
		}, add: func(w *gguf.Writer) error {
			return w.AddTensor("blk.0.ffn_gate.0.weight", quant.F32, []uint64{128, 32}, make([]byte, 4*128*32))
		}}, []string{`"blk.0.ffn_gate.0.weight"`, "one tensor each"}},
		{"YaRN not supported", "g-deepseek2.F32.gguf", ggufEdit{set: map[string]any{"deepseek2.rope.scaling.type": "yarn",
			"deepseek2.rope.scaling.factor": float32(40)}}, []string{`rope.scaling.type "yarn"`, "not supported"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := rewriteGGUF(t, filepath.Join(models, tc.src), filepath.Join(tmp, strings.ReplaceAll(tc.name, " ", "_")+".gguf"), tc.edit)
			m, err := model.Open(path, model.Options{Threads: 1})
			if err == nil {
				m.Close()
				t.Fatal("loaded")
			}
			for _, w := range append(tc.want, path) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// A deepseek2 file in the older layout (one attn_kv_b per layer instead
// of attn_k_b and attn_v_b) gives the same logits.
func TestMLACombinedKVB(t *testing.T) {
	dir := testutil.Shared(t, "golden")
	src := filepath.Join(dir, "models", "g-deepseek2-lite.F32.gguf")
	f, err := gguf.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := func(k string) int { v, _ := f.Uint("deepseek2." + k); return int(v) }
	heads, kvl, nope, vh := u("attention.head_count"), u("attention.kv_lora_rank"), u("attention.key_length_mla")-u("rope.dimension_count"), u("attention.value_length_mla")
	f32at := func(b []byte, i int) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])) }
	nl := u("block_count")
	path := rewriteGGUF(t, src, filepath.Join(t.TempDir(), "kvb.gguf"), ggufEdit{
		tensor: func(ti *gguf.TensorInfo) (quant.Type, []uint64, []byte, bool) {
			drop := strings.HasSuffix(ti.Name, ".attn_k_b.weight") || strings.HasSuffix(ti.Name, ".attn_v_b.weight")
			return ti.Type, ti.Dims, ti.Data, !drop
		},
		add: func(w *gguf.Writer) error {
			for l := 0; l < nl; l++ {
				kb := f.Tensor(fmt.Sprintf("blk.%d.attn_k_b.weight", l)).Data
				vb := f.Tensor(fmt.Sprintf("blk.%d.attn_v_b.weight", l)).Data
				out := make([]byte, 4*heads*(nope+vh)*kvl)
				put := func(row, col int, v float32) {
					binary.LittleEndian.PutUint32(out[4*(row*kvl+col):], math.Float32bits(v))
				}
				for h := 0; h < heads; h++ {
					for j := 0; j < nope; j++ {
						for r := 0; r < kvl; r++ {
							put(h*(nope+vh)+j, r, f32at(kb, (h*kvl+r)*nope+j)) // attn_k_b element (j, r, h)
						}
					}
					for i := 0; i < vh; i++ {
						for r := 0; r < kvl; r++ {
							put(h*(nope+vh)+nope+i, r, f32at(vb, (h*vh+i)*kvl+r)) // attn_v_b element (r, i, h)
						}
					}
				}
				if err := w.AddTensor(fmt.Sprintf("blk.%d.attn_kv_b.weight", l), quant.F32, []uint64{uint64(kvl), uint64(heads * (nope + vh))}, out); err != nil {
					return err
				}
			}
			return nil
		},
	})
	toks := []int32{1, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120}
	var rows [2][][]float32
	for i, p := range []string{src, path} {
		m, err := model.Open(p, model.Options{Threads: 2})
		if err != nil {
			t.Fatal(err)
		}
		if i == 1 && !m.Config.KVBCombined {
			t.Fatal("attn_kv_b file not recognised as such")
		}
		rows[i] = teacherForced(t, m, toks)
		m.Close()
	}
	for p := range rows[0] {
		for j, v := range rows[0][p] {
			if math.Abs(float64(v-rows[1][p][j])) > 1e-4 {
				t.Fatalf("position %d logit %d: attn_k_b/attn_v_b %g, attn_kv_b %g", p, j, v, rows[1][p][j])
			}
		}
	}
}
