package hf

import (
	"strings"

	"pagoda/quant"
)

// LayerTensor names one per-block tensor both ways, without the
// "model.layers.N." / "blk.N." prefix.
type LayerTensor struct{ HF, GGUF string }

// layerTensors is in the order llama.cpp's converter writes a block.
var layerTensors = [...]LayerTensor{
	{"input_layernorm.weight", "attn_norm.weight"},
	{"self_attn.q_proj.weight", "attn_q.weight"},
	{"self_attn.q_proj.bias", "attn_q.bias"},
	{"self_attn.k_proj.weight", "attn_k.weight"},
	{"self_attn.k_proj.bias", "attn_k.bias"},
	{"self_attn.v_proj.weight", "attn_v.weight"},
	{"self_attn.v_proj.bias", "attn_v.bias"},
	{"self_attn.q_norm.weight", "attn_q_norm.weight"},
	{"self_attn.k_norm.weight", "attn_k_norm.weight"},
	{"self_attn.o_proj.weight", "attn_output.weight"},
	{"post_attention_layernorm.weight", "ffn_norm.weight"},
	{"mlp.gate_proj.weight", "ffn_gate.weight"},
	{"mlp.up_proj.weight", "ffn_up.weight"},
	{"mlp.down_proj.weight", "ffn_down.weight"},
}

// globalTensors are the tensors outside the blocks, as {HF, GGUF}.
var globalTensors = [...]LayerTensor{
	{"model.embed_tokens.weight", "token_embd.weight"},
	{"model.norm.weight", "output_norm.weight"},
	{"lm_head.weight", "output.weight"},
}

// LayerTensors returns the per-block tensors in the order the GGUF
// converter writes a block.
func LayerTensors() []LayerTensor {
	out := layerTensors
	return out[:]
}

// BlockOrder is the position of a per-block tensor (GGUF name without
// "blk.N.") in LayerTensors; unknown names come after all known ones.
func BlockOrder(ggufSuffix string) int {
	for i, m := range layerTensors {
		if m.GGUF == ggufSuffix {
			return i
		}
	}
	return len(layerTensors)
}

// GGUFName maps an HF tensor name (model.layers.3.self_attn.q_proj.weight)
// to its GGUF name (blk.3.attn_q.weight).
func GGUFName(hfName string) (string, bool) { return mapName(hfName, true) }

// HFName maps a GGUF tensor name to the HF name it is stored under.
func HFName(ggufName string) (string, bool) { return mapName(ggufName, false) }

func mapName(name string, toGGUF bool) (string, bool) {
	pick := func(m LayerTensor) (from, to string) {
		if toGGUF {
			return m.HF, m.GGUF
		}
		return m.GGUF, m.HF
	}
	for _, m := range globalTensors {
		if from, to := pick(m); from == name {
			return to, true
		}
	}
	fromPrefix, toPrefix := "blk.", "model.layers."
	if toGGUF {
		fromPrefix, toPrefix = toPrefix, fromPrefix
	}
	layer, suffix, ok := splitLayer(name, fromPrefix)
	if !ok {
		return "", false
	}
	for _, m := range layerTensors {
		if from, to := pick(m); from == suffix {
			return toPrefix + layer + "." + to, true
		}
	}
	return "", false
}

// splitLayer splits prefix + "N." + suffix, N decimal digits.
func splitLayer(name, prefix string) (layer, suffix string, ok bool) {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return "", "", false
	}
	i := strings.IndexByte(rest, '.')
	if i <= 0 {
		return "", "", false
	}
	for _, c := range rest[:i] {
		if c < '0' || c > '9' {
			return "", "", false
		}
	}
	return rest[:i], rest[i+1:], true
}

// TensorType is the ggml type of a safetensors dtype the loaders read
// directly: F32, F16 or BF16.
func TensorType(dtype string) (quant.Type, bool) {
	switch dtype {
	case "F32":
		return quant.F32, true
	case "F16":
		return quant.F16, true
	case "BF16":
		return quant.BF16, true
	}
	return 0, false
}

// Unpermute reorders each head's rows from HF's rotate-half order
// [x_0..x_{h/2-1}, y_0..y_{h/2-1}] to the adjacent pairs
// [x_0, y_0, x_1, y_1, …] of ggml's "normal" rope, undoing the permutation
// llama.cpp's converter applies to llama q/k weights. data holds rows rows
// of rowBytes bytes split evenly into heads heads. It returns nil when the
// rows do not split into heads of even size or data is short.
func Unpermute(data []byte, rowBytes, rows, heads int) []byte {
	if heads <= 0 || rows <= 0 || rowBytes < 0 || rows%heads != 0 || (rows/heads)%2 != 0 || len(data)/rows < rowBytes {
		return nil
	}
	hd := rows / heads
	out := make([]byte, rows*rowBytes)
	for h := 0; h < heads; h++ {
		for i := 0; i < hd/2; i++ {
			for j := 0; j < 2; j++ {
				dst := h*hd + 2*i + j
				src := h*hd + j*(hd/2) + i
				copy(out[dst*rowBytes:(dst+1)*rowBytes], data[src*rowBytes:(src+1)*rowBytes])
			}
		}
	}
	return out
}
