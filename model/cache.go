package model

// Batch is one flat forward pass over tokens of one or more sequences:
// prefill chunks and single decode tokens mixed. Tokens of one sequence must
// appear in increasing position order.
type Batch struct {
	Tokens []int32
	Pos    []int32
	Seq    []int32 // sequence handle of each token, as the KVCache knows it
	// Logits marks the rows whose logits Forward returns, in row order.
	// nil means only the last row.
	Logits []bool
}

// AttnParams describes the attention of one layer.
type AttnParams struct {
	NHead, NKVHead, HeadDim int
	Scale                   float32
	// Window > 0 limits attention to the last Window positions (Mistral
	// sliding window); 0 is full causal attention.
	Window int
}

// KVCache stores keys and values and runs attention over them. Begin
// prepares a batch once per forward pass (slots, block lists, what each
// row may see), so Store and Attend address rows of that batch and look
// nothing up per token and layer. The model writes K/V for a row before it
// attends from that row, so the query of row i sees positions [0, Pos[i]]
// of its sequence (less the window). Implementations: a contiguous
// float32 cache (NewFlatCache) for single runs, and the paged cache of
// package kvcache for the serving engine.
type KVCache interface {
	// Begin prepares for a forward pass over b, and reports an error when
	// some row has no room in the cache.
	Begin(b *Batch) error
	// Store writes the keys and values (NKVHead·HeadDim floats each) of
	// batch row row, layer layer.
	Store(layer, row int, k, v []float32)
	// Attend computes, for the rows [lo, hi) of the batch — consecutive
	// positions of one sequence — and each query head h of their rows of
	// q (NHead·HeadDim floats per row), out[h] = Σ_t softmax_t(Scale·q_h·k_t) v_t
	// over the positions t the row sees, with GQA head sharing
	// kv head = h / (NHead/NKVHead). q and out hold hi-lo rows.
	Attend(layer, lo, hi int, q, out []float32, p AttnParams)
}
