package arch

// MLA is DeepSeek's multi-head latent attention: keys and values are
// compressed into one latent of Dims.KVLoRA values per token plus a rope
// key of Dims.QKRope shared by all heads (attn_kv_a_mqa), which is all the
// KV cache keeps. Queries come from attn_q or, with Dims.QLoRA > 0,
// through a normed low rank (attn_q_a → attn_q_a_norm → attn_q_b). The
// per-head up-projections are attn_k_b and attn_v_b, or in older files the
// combined attn_kv_b (Dims.KVBCombined). Rope is ggml's normal
// (adjacent pairs) mode, on the rope part of q and on the rope key only.
type MLA struct{}

// RopeStyle is how MLA rotates the rope parts.
func (MLA) RopeStyle() Rope { return RopeNorm }

// Tensors declares the MLA tensors in the order llama.cpp's converter
// writes them (no HF names: the HF loader does not take deepseek2).
func (MLA) Tensors() []Tensor {
	embd := func(d Dims) int { return d.Embd }
	qlora := func(d Dims) int { return d.QLoRA }
	kvlora := func(d Dims) int { return d.KVLoRA }
	q := func(d Dims) int { return d.Heads * (d.QKNope + d.QKRope) }
	kva := func(d Dims) int { return d.KVLoRA + d.QKRope }
	kvb := func(d Dims) int { return d.Heads * (d.QKNope + d.VHead) }
	heads := func(d Dims) int { return d.Heads }
	nope := func(d Dims) int { return d.QKNope }
	vh := func(d Dims) int { return d.VHead }
	out := func(d Dims) int { return d.Heads * d.VHead }
	combined := func(d Dims) bool { return d.KVBCombined }
	split := func(d Dims) bool { return !d.KVBCombined }
	lowRank := func(d Dims) bool { return d.QLoRA > 0 }
	plain := func(d Dims) bool { return d.QLoRA == 0 }
	return []Tensor{
		{Name: "attn_norm.weight", Role: AttnNorm, Shape: vec(embd), Split: Replicated},
		{Name: "attn_q_a.weight", Role: AttnQA, Shape: mat(embd, qlora), When: lowRank, Split: Replicated},
		{Name: "attn_q_a_norm.weight", Role: AttnQANorm, Shape: vec(qlora), When: lowRank, Split: Replicated},
		{Name: "attn_q_b.weight", Role: AttnQB, Shape: mat(qlora, q), When: lowRank, Split: Column},
		{Name: "attn_q.weight", Role: AttnQ, Shape: mat(embd, q), When: plain, Split: Column},
		{Name: "attn_kv_a_mqa.weight", Role: AttnKVA, Shape: mat(embd, kva), Split: Replicated},
		{Name: "attn_kv_a_norm.weight", Role: AttnKVANorm, Shape: vec(kvlora), Split: Replicated},
		{Name: "attn_kv_b.weight", Role: AttnKVB, Shape: mat(kvlora, kvb), When: combined, Split: Column},
		{Name: "attn_k_b.weight", Role: AttnKB, Shape: stack(nope, kvlora, heads), When: split, Split: Expert},
		{Name: "attn_v_b.weight", Role: AttnVB, Shape: stack(kvlora, vh, heads), When: split, Split: Expert},
		{Name: "attn_output.weight", Role: AttnOut, Shape: mat(out, embd), Split: Row},
	}
}
