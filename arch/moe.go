package arch

// Gating is how router logits become expert probabilities.
type Gating uint8

const (
	// GatingSoftmax: a softmax over all experts (Mixtral, Qwen-MoE, OLMoE,
	// DeepSeek-V2).
	GatingSoftmax Gating = iota + 1
	// GatingSigmoid: an independent sigmoid per expert (DeepSeek-V3).
	GatingSigmoid
)

func (g Gating) String() string {
	switch g {
	case GatingSoftmax:
		return "softmax"
	case GatingSigmoid:
		return "sigmoid"
	}
	return "unknown"
}

// MoE is a mixture-of-experts feed-forward part: a router (ffn_gate_inp)
// picks the top Dims.Experts-used experts of each token, whose SwiGLU
// outputs are summed with the routing weights; shared experts, when the
// checkpoint has them (Dims.SharedFFN > 0), run on every token. The
// experts are 3-D tensors, one matrix per expert.
type MoE struct {
	// Gating is the architecture's gating function; Norm renormalises the
	// selected weights to sum 1. With Configured, the checkpoint's
	// metadata may override both and add a scale (deepseek2's
	// expert_gating_func, expert_weights_norm, expert_weights_scale).
	Gating     Gating
	Norm       bool
	Configured bool
	// SharedGate scales the shared expert by sigmoid(ffn_gate_inp_shexp·x)
	// (qwen2moe).
	SharedGate bool
	// ProbsBias: the checkpoint may carry exp_probs_b, a per-expert bias
	// added to the probabilities for selection only (DeepSeek-V3).
	ProbsBias bool
}

// Tensors declares the MoE tensors in the order llama.cpp's converter
// writes them. Hugging Face stores experts one tensor each, so they have
// no HF name here.
func (f MoE) Tensors() []Tensor {
	embd := func(d Dims) int { return d.Embd }
	nexp := func(d Dims) int { return d.Experts }
	eff := func(d Dims) int { return d.ExpertFFN }
	sff := func(d Dims) int { return d.SharedFFN }
	shared := func(d Dims) bool { return d.SharedFFN > 0 }
	out := []Tensor{
		{Name: "ffn_norm.weight", HF: "post_attention_layernorm.weight", Role: FFNNorm, Shape: vec(embd), Split: Replicated},
		{Name: "ffn_gate_inp.weight", Role: FFNRouter, Shape: mat(embd, nexp), Split: Replicated},
	}
	if f.ProbsBias {
		out = append(out, Tensor{Name: "exp_probs_b.bias", Role: FFNProbsBias, Shape: vec(nexp), Optional: true, Split: Replicated})
	}
	out = append(out,
		Tensor{Name: "ffn_gate_exps.weight", Role: FFNGateExps, Shape: stack(embd, eff, nexp), Split: Expert},
		Tensor{Name: "ffn_down_exps.weight", Role: FFNDownExps, Shape: stack(eff, embd, nexp), Split: Expert},
		Tensor{Name: "ffn_up_exps.weight", Role: FFNUpExps, Shape: stack(embd, eff, nexp), Split: Expert})
	if f.SharedGate {
		out = append(out, Tensor{Name: "ffn_gate_inp_shexp.weight", Role: FFNSharedGate, Shape: vec(embd), When: shared, Split: Replicated})
	}
	return append(out,
		Tensor{Name: "ffn_gate_shexp.weight", Role: FFNGateShexp, Shape: mat(embd, sff), When: shared, Split: Column},
		Tensor{Name: "ffn_down_shexp.weight", Role: FFNDownShexp, Shape: mat(sff, embd), When: shared, Split: Row},
		Tensor{Name: "ffn_up_shexp.weight", Role: FFNUpShexp, Shape: mat(embd, sff), When: shared, Split: Column})
}
