package arch

// The mixture-of-experts architectures (Mixtral is llama with experts,
// declared in llama.go). Renormalisation and gating are fixed per
// architecture as llama.cpp applies them.
func init() {
	// Qwen1.5-MoE / Qwen2-MoE: softmax, top-k weights not renormalised, a
	// shared expert behind a sigmoid gate; qwen2's attention.
	Register(&Arch{
		Name: "qwen2moe",
		Attn: Attention{Rope: RopeNeox, Bias: Always},
		MoE:  MoE{Gating: GatingSoftmax, SharedGate: true},
	})
	// Qwen3-MoE: softmax, always renormalised (whatever norm_topk_prob).
	Register(&Arch{
		Name: "qwen3moe",
		Attn: Attention{Rope: RopeNeox, QKNorm: true},
		MoE:  MoE{Gating: GatingSoftmax, Norm: true},
	})
	// OLMoE: softmax, not renormalised; q/k RMSNorm over the whole
	// projection, neox rope.
	Register(&Arch{
		Name: "olmoe",
		Attn: Attention{Rope: RopeNeox, QKNormFull: true},
		MoE:  MoE{Gating: GatingSoftmax},
	})
	// DeepSeek-V2/V3: MLA, leading dense layers, shared experts without a
	// gate; gating, renormalisation and scale from the metadata (softmax,
	// none, none when absent), and V3's selection bias when stored.
	Register(&Arch{
		Name: "deepseek2",
		Attn: MLA{},
		FFN:  DenseFFN{Gated: true},
		MoE:  MoE{Gating: GatingSoftmax, Configured: true, ProbsBias: true},
	})
}
