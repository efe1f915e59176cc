package kernels

import "unsafe"

// Attention over the heads of a GQA group at once: the query heads that
// share a KV head read the same rows, so a kernel that takes them together
// widens each row once for several heads and sums their scores in one
// reduction, where a call per head re-reads the row and reduces each
// score alone. The result is each head's AttnScores/AttnMix, up to the
// order of float additions.

// AttnScoresHeadsF32 sets s[j·ss+t] = q_j·k_t for t < n and the len(q)/d
// query vectors q_j = q[j·d:(j+1)·d], rows k_t = k[t·stride:t·stride+d].
func (o *Ops) AttnScoresHeadsF32(s []float32, ss int, q []float32, d int, k []float32, stride, n int) {
	scoresHeads(o.attnScoresF32, o.h4.scoresF32, 4, s, ss, q, d, k, stride, n)
}

// AttnScoresHeadsF16 is AttnScoresHeadsF32 over half-float rows.
func (o *Ops) AttnScoresHeadsF16(s []float32, ss int, q []float32, d int, k []uint16, stride, n int) {
	scoresHeads(o.attnScoresF16, o.h4.scoresF16, 2, s, ss, q, d, k, stride, n)
}

// AttnScoresHeadsBF16 is AttnScoresHeadsF32 over bfloat16 rows.
func (o *Ops) AttnScoresHeadsBF16(s []float32, ss int, q []float32, d int, k []uint16, stride, n int) {
	scoresHeads(o.attnScoresBF16, o.h4.scoresBF16, 2, s, ss, q, d, k, stride, n)
}

// AttnMixHeadsF32 adds Σ_t w_j[t]·v_t to out_j = out[j·d:(j+1)·d] for the
// len(out)/d heads j, weights w_j = w[j·ws:j·ws+n], rows
// v_t = v[t·stride:t·stride+d].
func (o *Ops) AttnMixHeadsF32(out []float32, d int, w []float32, ws int, v []float32, stride, n int) {
	mixHeads(o.attnMixF32, &o.tile.mixF32, 4, out, d, w, ws, v, stride, n)
}

// AttnMixHeadsF16 is AttnMixHeadsF32 over half-float rows.
func (o *Ops) AttnMixHeadsF16(out []float32, d int, w []float32, ws int, v []uint16, stride, n int) {
	mixHeads(o.attnMixF16, &o.tile.mixF16, 2, out, d, w, ws, v, stride, n)
}

// AttnMixHeadsBF16 is AttnMixHeadsF32 over bfloat16 rows.
func (o *Ops) AttnMixHeadsBF16(out []float32, d int, w []float32, ws int, v []uint16, stride, n int) {
	mixHeads(o.attnMixBF16, &o.tile.mixBF16, 2, out, d, w, ws, v, stride, n)
}

// checkHeads panics unless g heads of n values at stride ss fit in have
// values, d divides the heads' vectors and the n rows fit in rows.
func checkHeads(op string, hv, d, ss, n, have, rows, stride int) int {
	if d <= 0 || hv%d != 0 || n < 0 || ss < n || stride < 0 {
		panic("kernels: " + op + ": bad head geometry")
	}
	g := hv / d
	if g > 0 && n > 0 && ((g-1)*ss+n > have || (n-1)*stride+d > rows) {
		panic("kernels: " + op + ": heads exceed their slices")
	}
	return g
}

func scoresHeads[E float32 | uint16](one func(s, q []float32, k []E, stride int), four func(s, q *float32, k unsafe.Pointer, n, d, stride, ss int),
	width int, s []float32, ss int, q []float32, d int, k []E, stride, n int) {
	g := checkHeads("AttnScoresHeads", len(q), d, ss, n, len(s), len(k), stride)
	if n == 0 {
		return
	}
	j := 0
	if four != nil && d%16 == 0 {
		for ; j+4 <= g; j += 4 {
			four(&s[j*ss], &q[j*d], unsafe.Pointer(&k[0]), n, d, stride*width, ss*4)
		}
	}
	for ; j < g; j++ {
		one(s[j*ss:j*ss+n], q[j*d:(j+1)*d], k, stride)
	}
}

// mixHeads runs the heads in chunks of up to eight through many (indexed
// by the chunk's heads; nil where a set has no such kernel), the rest one
// at a time.
func mixHeads[E float32 | uint16](one func(out, w []float32, v []E, stride int), many *[9]func(out, w *float32, v unsafe.Pointer, n, d, stride, ws int),
	width int, out []float32, d int, w []float32, ws int, v []E, stride, n int) {
	g := checkHeads("AttnMixHeads", len(out), d, ws, n, len(w), len(v), stride)
	if n == 0 {
		return
	}
	j := 0
	for d%16 == 0 && j < g {
		c := min(8, g-j)
		if many[c] == nil {
			break
		}
		many[c](&out[j*d], &w[j*ws], unsafe.Pointer(&v[0]), n, d, stride*width, ws*4)
		j += c
	}
	for ; j < g; j++ {
		one(out[j*d:(j+1)*d], w[j*ws:j*ws+n], v, stride)
	}
}
