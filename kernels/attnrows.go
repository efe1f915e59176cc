package kernels

// Attention over many cached positions at once: one call per head instead of
// one DotF16/AxpyF16 call per position, which for head_dim 64 costs more in
// call overhead than in arithmetic. Rows t of a K or V cache sit stride
// elements apart (stride = NKVHead·HeadDim for interleaved heads).

// AttnScoresF32 sets s[t] = q·k[t·stride : t·stride+len(q)] for t < len(s).
func AttnScoresF32(s, q, k []float32, stride int) {
	checkRows("AttnScoresF32", len(s), len(q), len(k), stride)
	best.attnScoresF32(s, q, k, stride)
}

// AttnScoresF32 is the package-level AttnScoresF32 with o's kernels.
func (o *Ops) AttnScoresF32(s, q, k []float32, stride int) {
	checkRows("AttnScoresF32", len(s), len(q), len(k), stride)
	o.attnScoresF32(s, q, k, stride)
}

// AttnScoresF16 is AttnScoresF32 over half-float keys.
func AttnScoresF16(s, q []float32, k []uint16, stride int) {
	checkRows("AttnScoresF16", len(s), len(q), len(k), stride)
	best.attnScoresF16(s, q, k, stride)
}

// AttnScoresF16 is the package-level AttnScoresF16 with o's kernels.
func (o *Ops) AttnScoresF16(s, q []float32, k []uint16, stride int) {
	checkRows("AttnScoresF16", len(s), len(q), len(k), stride)
	o.attnScoresF16(s, q, k, stride)
}

// AttnScoresBF16 is AttnScoresF32 over bfloat16 keys.
func AttnScoresBF16(s, q []float32, k []uint16, stride int) {
	checkRows("AttnScoresBF16", len(s), len(q), len(k), stride)
	best.attnScoresBF16(s, q, k, stride)
}

// AttnScoresBF16 is the package-level AttnScoresBF16 with o's kernels.
func (o *Ops) AttnScoresBF16(s, q []float32, k []uint16, stride int) {
	checkRows("AttnScoresBF16", len(s), len(q), len(k), stride)
	o.attnScoresBF16(s, q, k, stride)
}

// AttnMixF32 adds Σ_t w[t]·v[t·stride : t·stride+len(out)] to out.
func AttnMixF32(out, w, v []float32, stride int) {
	checkRows("AttnMixF32", len(w), len(out), len(v), stride)
	best.attnMixF32(out, w, v, stride)
}

// AttnMixF32 is the package-level AttnMixF32 with o's kernels.
func (o *Ops) AttnMixF32(out, w, v []float32, stride int) {
	checkRows("AttnMixF32", len(w), len(out), len(v), stride)
	o.attnMixF32(out, w, v, stride)
}

// AttnMixF16 is AttnMixF32 over half-float values.
func AttnMixF16(out, w []float32, v []uint16, stride int) {
	checkRows("AttnMixF16", len(w), len(out), len(v), stride)
	best.attnMixF16(out, w, v, stride)
}

// AttnMixF16 is the package-level AttnMixF16 with o's kernels.
func (o *Ops) AttnMixF16(out, w []float32, v []uint16, stride int) {
	checkRows("AttnMixF16", len(w), len(out), len(v), stride)
	o.attnMixF16(out, w, v, stride)
}

// AttnMixBF16 is AttnMixF32 over bfloat16 values.
func AttnMixBF16(out, w []float32, v []uint16, stride int) {
	checkRows("AttnMixBF16", len(w), len(out), len(v), stride)
	best.attnMixBF16(out, w, v, stride)
}

// AttnMixBF16 is the package-level AttnMixBF16 with o's kernels.
func (o *Ops) AttnMixBF16(out, w []float32, v []uint16, stride int) {
	checkRows("AttnMixBF16", len(w), len(out), len(v), stride)
	o.attnMixBF16(out, w, v, stride)
}

// checkRows panics (a programming error, like an index out of range) when
// n rows of d elements, stride apart, do not fit in have elements.
func checkRows(op string, n, d, have, stride int) {
	if n > 0 && d > 0 && (stride < 0 || (n-1)*stride+d > have) {
		panic("kernels: " + op + ": rows exceed the cache slice")
	}
}

// AttnScoresF32Ref is the reference AttnScoresF32.
func AttnScoresF32Ref(s, q, k []float32, stride int) {
	for t := range s {
		s[t] = DotF32Ref(q, k[t*stride:t*stride+len(q)])
	}
}

// AttnScoresF16Ref is the reference AttnScoresF16.
func AttnScoresF16Ref(s, q []float32, k []uint16, stride int) {
	for t := range s {
		s[t] = DotF16Ref(q, k[t*stride:t*stride+len(q)])
	}
}

// AttnScoresBF16Ref is the reference AttnScoresBF16.
func AttnScoresBF16Ref(s, q []float32, k []uint16, stride int) {
	for t := range s {
		s[t] = DotBF16Ref(q, k[t*stride:t*stride+len(q)])
	}
}

// AttnMixF32Ref is the reference AttnMixF32.
func AttnMixF32Ref(out, w, v []float32, stride int) {
	for t, a := range w {
		AxpyF32Ref(out, a, v[t*stride:t*stride+len(out)])
	}
}

// AttnMixF16Ref is the reference AttnMixF16.
func AttnMixF16Ref(out, w []float32, v []uint16, stride int) {
	for t, a := range w {
		AxpyF16Ref(out, a, v[t*stride:t*stride+len(out)])
	}
}

// AttnMixBF16Ref is the reference AttnMixBF16.
func AttnMixBF16Ref(out, w []float32, v []uint16, stride int) {
	for t, a := range w {
		AxpyBF16Ref(out, a, v[t*stride:t*stride+len(out)])
	}
}
