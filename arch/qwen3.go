package arch

// Qwen3: neox rope, per-head RMSNorm of q and k, no biases.
func init() {
	Register(&Arch{
		Name:    "qwen3",
		HFTypes: []string{"qwen3"},
		Attn:    Attention{Rope: RopeNeox, QKNorm: true, Window: true},
		FFN:     DenseFFN{Gated: true},
	})
}
