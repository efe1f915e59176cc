package arch

// Rope is how a head's dimensions pair up for rotation.
type Rope uint8

const (
	// RopeNorm rotates adjacent pairs (ggml's "normal" rope; llama). HF
	// stores such q/k rows in rotate-half order, so loaders reorder them.
	RopeNorm Rope = iota
	// RopeNeox rotates the first half against the second (qwen2, qwen3).
	RopeNeox
)

// Presence says whether an optional feature's tensors are stored.
type Presence uint8

const (
	Never Presence = iota
	Always
	// Configured: the checkpoint says (Dims.Bias from HF attention_bias).
	Configured
)

// Attention is dot-product attention over q, k and v projections: MHA,
// GQA or MQA by the ratio of Dims.Heads to Dims.KVHeads.
type Attention struct {
	Rope Rope
	// Bias adds q/k/v biases after the projections.
	Bias Presence
	// QKNorm applies a per-head RMSNorm to q and k before rope; with
	// QKNormFull the norm spans all heads of q (of k) at once (olmoe).
	QKNorm, QKNormFull bool
	// Window: the architecture honours a sliding-window size from the
	// checkpoint's metadata.
	Window bool
}

// HasBias resolves Bias under these dims.
func (a Attention) HasBias(d Dims) bool {
	return a.Bias == Always || (a.Bias == Configured && d.Bias)
}

// Tensors declares the attention tensors in the order llama.cpp's
// converter writes them.
func (a Attention) Tensors() []Tensor {
	embd := func(d Dims) int { return d.Embd }
	q := func(d Dims) int { return d.Heads * d.HeadDim }
	kv := func(d Dims) int { return d.KVHeads * d.HeadDim }
	hd := func(d Dims) int { return d.HeadDim }
	bias := func(d Dims) bool { return a.HasBias(d) }
	out := []Tensor{{Name: "attn_norm.weight", HF: "input_layernorm.weight", Role: AttnNorm, Shape: vec(embd), Split: Replicated}}
	for _, p := range []struct {
		name, hf string
		w, b     Role
		rows     func(Dims) int
	}{{"attn_q", "self_attn.q_proj", AttnQ, AttnQBias, q}, {"attn_k", "self_attn.k_proj", AttnK, AttnKBias, kv},
		{"attn_v", "self_attn.v_proj", AttnV, AttnVBias, kv}} {
		out = append(out, Tensor{Name: p.name + ".weight", HF: p.hf + ".weight", Role: p.w, Shape: mat(embd, p.rows), Split: Column})
		if a.Bias != Never {
			out = append(out, Tensor{Name: p.name + ".bias", HF: p.hf + ".bias", Role: p.b, Shape: vec(p.rows), When: bias, Split: Column})
		}
	}
	switch {
	case a.QKNormFull:
		out = append(out,
			Tensor{Name: "attn_q_norm.weight", HF: "self_attn.q_norm.weight", Role: AttnQNorm, Shape: vec(q), Split: Column},
			Tensor{Name: "attn_k_norm.weight", HF: "self_attn.k_norm.weight", Role: AttnKNorm, Shape: vec(kv), Split: Column})
	case a.QKNorm:
		out = append(out,
			Tensor{Name: "attn_q_norm.weight", HF: "self_attn.q_norm.weight", Role: AttnQNorm, Shape: vec(hd), Split: Replicated},
			Tensor{Name: "attn_k_norm.weight", HF: "self_attn.k_norm.weight", Role: AttnKNorm, Shape: vec(hd), Split: Replicated})
	}
	return append(out, Tensor{Name: "attn_output.weight", HF: "self_attn.o_proj.weight", Role: AttnOut, Shape: mat(q, embd), Split: Row})
}

// Rope is the rope style of the architecture's attention part (RopeNorm
// for parts without one).
func (a *Arch) Rope() Rope {
	if r, ok := a.Attn.(interface{ RopeStyle() Rope }); ok {
		return r.RopeStyle()
	}
	return RopeNorm
}

// RopeStyle is how this part rotates q and k.
func (a Attention) RopeStyle() Rope { return a.Rope }
