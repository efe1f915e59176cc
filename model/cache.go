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

// KVCache stores keys and values and runs attention over them. The model
// writes K/V for a token before it attends from that token, so Attend over
// n positions sees positions [0, n) of the sequence (less the window).
// Implementations: a contiguous float32 cache (NewFlatCache) for single
// runs, and the paged cache of package kvcache for the serving engine.
type KVCache interface {
	// Store writes the keys and values (NKVHead·HeadDim floats each) of the
	// token at position pos of sequence seq, layer layer.
	Store(layer int, seq, pos int32, k, v []float32)
	// Attend computes, for each query head h of q (NHead·HeadDim floats),
	// out[h] = Σ_t softmax_t(Scale·q_h·k_t) v_t over the positions t of seq
	// below n (and within the window), with GQA head sharing
	// kv head = h / (NHead/NKVHead).
	Attend(layer int, seq, n int32, q, out []float32, p AttnParams)
}
