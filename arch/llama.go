package arch

// Llama covers Llama 1/2/3, TinyLlama and Mistral (same tensors; mistral's
// sliding window comes from metadata). Biases only when config.json's
// attention_bias asks for them. Mixtral is llama with experts.
func init() {
	Register(&Arch{
		Name:    "llama",
		Aliases: []string{"mistral"},
		HFTypes: []string{"llama", "mistral"},
		Attn:    Attention{Rope: RopeNorm, Bias: Configured, Window: true},
		FFN:     DenseFFN{Gated: true},
		// Mixtral: llama with expert_count > 0; softmax, renormalised.
		MoE: MoE{Gating: GatingSoftmax, Norm: true},
	})
}
