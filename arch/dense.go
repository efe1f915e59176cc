package arch

// DenseFFN is the feed-forward part every token runs through whole:
// down(silu(gate(x)) · up(x)) when Gated (SwiGLU), down(silu(up(x)))
// otherwise.
type DenseFFN struct {
	Gated bool
}

// Tensors declares the feed-forward tensors in the order llama.cpp's
// converter writes them.
func (f DenseFFN) Tensors() []Tensor {
	embd := func(d Dims) int { return d.Embd }
	ffn := func(d Dims) int { return d.FFN }
	out := []Tensor{{Name: "ffn_norm.weight", HF: "post_attention_layernorm.weight", Role: FFNNorm, Shape: vec(embd), Split: Replicated}}
	if f.Gated {
		out = append(out, Tensor{Name: "ffn_gate.weight", HF: "mlp.gate_proj.weight", Role: FFNGate, Shape: mat(embd, ffn), Split: Column})
	}
	return append(out,
		Tensor{Name: "ffn_up.weight", HF: "mlp.up_proj.weight", Role: FFNUp, Shape: mat(embd, ffn), Split: Column},
		Tensor{Name: "ffn_down.weight", HF: "mlp.down_proj.weight", Role: FFNDown, Shape: mat(ffn, embd), Split: Row})
}
