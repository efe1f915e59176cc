// Package hftest writes small Hugging Face llama checkpoints for tests: a
// random float model, and the same model with its linear layers stored in
// a GPTQ or AWQ layout (quant.EncodeLinear) beside a float twin whose
// weights are exactly the quantized ones dequantized.
package hftest

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"pagoda/quant"
	"pagoda/safetensors"
)

// Llama is the shape of the tiny model.
type Llama struct {
	Hidden, FFN, Layers, Heads, KVHeads, HeadDim, Vocab int
	Seed                                                uint64
}

// Tiny is a llama small enough for fast tests whose every input width is
// a multiple of 128, so group sizes 32, 64 and 128 all apply; its 512
// tokens match the shared stories260K tokenizer (tok512.bin).
var Tiny = Llama{Hidden: 128, FFN: 256, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 32, Vocab: 512, Seed: 1}

// Checkpoint is what Write produced.
type Checkpoint struct {
	QuantDir, FloatDir string
	// Tensors of the quantized checkpoint, as written (for edits).
	Tensors []*safetensors.Tensor
	Config  map[string]any
}

// linears lists each layer's linear modules with (out, in) and the
// act-order group they share (q/k/v see the same input, as do gate/up).
func (l Llama) linears() []struct {
	name    string
	out, in int
	share   int
} {
	q, kv := l.Heads*l.HeadDim, l.KVHeads*l.HeadDim
	return []struct {
		name    string
		out, in int
		share   int
	}{
		{"self_attn.q_proj", q, l.Hidden, 0}, {"self_attn.k_proj", kv, l.Hidden, 0}, {"self_attn.v_proj", kv, l.Hidden, 0},
		{"self_attn.o_proj", l.Hidden, q, 1},
		{"mlp.gate_proj", l.FFN, l.Hidden, 2}, {"mlp.up_proj", l.FFN, l.Hidden, 2},
		{"mlp.down_proj", l.Hidden, l.FFN, 3},
	}
}

// Write writes the model in qcJSON's layout (a quantization_config object,
// put in config.json) to dir/quant, and its dequantized twin in F32 to
// dir/float. actOrder gives GPTQ layers a random quantization order; a
// config with lm_head true quantizes an untied output matrix too.
func Write(t testing.TB, dir string, l Llama, qcJSON string, actOrder bool) *Checkpoint {
	t.Helper()
	qc, err := quant.ParseQuantConfig([]byte(qcJSON), "")
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(l.Seed, 99))
	randF := func(n int, sd float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64() * sd)
		}
		return v
	}
	var qts, fts []*safetensors.Tensor
	both := func(name string, shape []int64, v []float32) {
		t := f32Tensor(name, shape, v)
		qts, fts = append(qts, t), append(fts, t)
	}
	both("model.embed_tokens.weight", []int64{int64(l.Vocab), int64(l.Hidden)}, randF(l.Vocab*l.Hidden, 1))
	both("model.norm.weight", []int64{int64(l.Hidden)}, ones(l.Hidden, r))
	for i := 0; i < l.Layers; i++ {
		p := fmt.Sprintf("model.layers.%d.", i)
		both(p+"input_layernorm.weight", []int64{int64(l.Hidden)}, ones(l.Hidden, r))
		both(p+"post_attention_layernorm.weight", []int64{int64(l.Hidden)}, ones(l.Hidden, r))
		orders := map[int][]int{}
		for _, m := range l.linears() {
			w := randF(m.out*m.in, 0.6/float64(m.in)*8)
			var order []int
			if actOrder {
				if orders[m.share] == nil {
					orders[m.share] = r.Perm(m.in)
				}
				order = orders[m.share]
			}
			lin, deq, err := quant.EncodeLinear(qc, p+m.name, w, m.out, m.in, order)
			if err != nil {
				t.Fatal(err)
			}
			for _, pt := range []*quant.PackedTensor{lin.QWeight, lin.QZeros, lin.Scales, lin.GIdx} {
				if pt != nil {
					qts = append(qts, &safetensors.Tensor{Name: pt.Name, DType: pt.DType, Shape: pt.Shape, Data: pt.Data})
				}
			}
			fts = append(fts, f32Tensor(p+m.name+".weight", []int64{int64(m.out), int64(m.in)}, deq))
		}
	}
	if qc.LMHead {
		// lm_head: true quantizes the output matrix too (untied).
		w := randF(l.Vocab*l.Hidden, 0.1)
		lin, deq, err := quant.EncodeLinear(qc, "lm_head", w, l.Vocab, l.Hidden, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, pt := range []*quant.PackedTensor{lin.QWeight, lin.QZeros, lin.Scales, lin.GIdx} {
			if pt != nil {
				qts = append(qts, &safetensors.Tensor{Name: pt.Name, DType: pt.DType, Shape: pt.Shape, Data: pt.Data})
			}
		}
		fts = append(fts, f32Tensor("lm_head.weight", []int64{int64(l.Vocab), int64(l.Hidden)}, deq))
	}
	cfg := map[string]any{
		"architectures": []string{"LlamaForCausalLM"}, "model_type": "llama",
		"vocab_size": l.Vocab, "hidden_size": l.Hidden, "intermediate_size": l.FFN,
		"num_hidden_layers": l.Layers, "num_attention_heads": l.Heads, "num_key_value_heads": l.KVHeads,
		"head_dim": l.HeadDim, "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
		"hidden_act": "silu", "tie_word_embeddings": !qc.LMHead, "torch_dtype": "float16",
	}
	c := &Checkpoint{QuantDir: filepath.Join(dir, "quant"), FloatDir: filepath.Join(dir, "float"), Tensors: qts, Config: cfg}
	writeDir(t, c.FloatDir, cfg, fts)
	var q any
	if err := json.Unmarshal([]byte(qcJSON), &q); err != nil {
		t.Fatal(err)
	}
	qcfg := map[string]any{"quantization_config": q}
	for k, v := range cfg {
		qcfg[k] = v
	}
	c.Config = qcfg
	writeDir(t, c.QuantDir, qcfg, qts)
	return c
}

// Rewrite writes the quantized checkpoint again with cfg and tensors.
func (c *Checkpoint) Rewrite(t testing.TB, cfg map[string]any, ts []*safetensors.Tensor) {
	t.Helper()
	writeDir(t, c.QuantDir, cfg, ts)
}

func writeDir(t testing.TB, dir string, cfg map[string]any, ts []*safetensors.Tensor) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := safetensors.Write(filepath.Join(dir, "model.safetensors"), ts); err != nil {
		t.Fatal(err)
	}
}

func ones(n int, r *rand.Rand) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(1 + 0.1*r.NormFloat64())
	}
	return v
}

func f32Tensor(name string, shape []int64, v []float32) *safetensors.Tensor {
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return &safetensors.Tensor{Name: name, DType: "F32", Shape: shape, Data: b}
}
