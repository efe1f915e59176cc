package arch

// Qwen2 (and Qwen2.5): neox rope and q/k/v biases.
func init() {
	Register(&Arch{
		Name:    "qwen2",
		HFTypes: []string{"qwen2"},
		Attn:    Attention{Rope: RopeNeox, Bias: Always, Window: true},
		FFN:     DenseFFN{Gated: true},
	})
}
