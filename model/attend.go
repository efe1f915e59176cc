package model

// attend stores the K/V rows of every batch token for layer li and then runs
// attention for every token, writing att (T × NHead·HeadDim). It is the one
// place the forward pass touches the KV cache: the layer blocks produce q, k
// and v (biases, norms and RoPE applied) and consume att.
//
// Every token's K/V is stored before any token attends, so a prefill chunk
// sees itself causally through the cache.
func (m *Model) attend(li int, b *Batch, kv KVCache, q, k, v, att []float32, ap AttnParams) {
	T := len(b.Tokens)
	qd, kvd := ap.NHead*ap.HeadDim, ap.NKVHead*ap.HeadDim
	for i := 0; i < T; i++ {
		kv.Store(li, b.Seq[i], b.Pos[i], k[i*kvd:(i+1)*kvd], v[i*kvd:(i+1)*kvd])
	}
	rows := func(lo, hi int) {
		for j := lo; j < hi; j++ {
			// Pair short and long causal rows (0, T-1, 1, T-2, …) so
			// the pool's contiguous ranges carry equal work.
			i := j / 2
			if j%2 == 1 {
				i = T - 1 - j/2
			}
			kv.Attend(li, b.Seq[i], b.Pos[i]+1, q[i*qd:(i+1)*qd], att[i*qd:(i+1)*qd], ap)
		}
	}
	if pa, ok := kv.(interface{ ParallelAttend() bool }); ok && pa.ParallelAttend() && T > 1 {
		m.pool.For(T, 1, rows)
	} else {
		rows(0, T)
	}
}
