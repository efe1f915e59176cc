package kernels

import (
	"fmt"
	"math"
	"unsafe"
)

// Tiled attention scores. The per-row kernels (AttnScoresHeads*) read a
// key row and reduce each score across the lanes of a vector: about as
// many shuffles as FMAs. With a page's keys transposed per tile of 16
// slots, 16 scores accumulate in the lanes of one register and need no
// reduction; the transposition is done once per page and KV head, for
// every query of the call. A query's scores do not depend on how many
// other queries share the tile, so chunked prefill and decode give the
// same bits.

// TileSlots is the number of key slots a tile holds.
const TileSlots = 16

// Tiled reports whether the set has the tiled kernels; callers keep the
// per-row ones otherwise.
func (o *Ops) Tiled() bool { return o.tile.scores[1] != nil }

// TileKF32 transposes the n keys k_t = k[t·stride : t·stride+d] (n a
// multiple of TileSlots, d of 16) into kt: kt[(c·d+i)·16 + t%16] = k_t[i]
// for tile c = t/16.
func (o *Ops) TileKF32(kt []float32, k []float32, stride, d, n int) {
	tileK(o.tile.tileF32, 4, kt, k, stride, d, n)
}

// TileKF16 is TileKF32 over half-float keys.
func (o *Ops) TileKF16(kt []float32, k []uint16, stride, d, n int) {
	tileK(o.tile.tileF16, 2, kt, k, stride, d, n)
}

// TileKBF16 is TileKF32 over bfloat16 keys.
func (o *Ops) TileKBF16(kt []float32, k []uint16, stride, d, n int) {
	tileK(o.tile.tileBF16, 2, kt, k, stride, d, n)
}

func tileK[E float32 | uint16](fn func(kt *float32, k unsafe.Pointer, stride, d int), width int, kt []float32, k []E, stride, d, n int) {
	if fn == nil || d <= 0 || d%16 != 0 || n <= 0 || n%TileSlots != 0 || stride < d || len(kt) < n*d || len(k) < (n-1)*stride+d {
		panic(fmt.Sprintf("kernels: TileK: %d keys of %d at stride %d from %d into %d (tiled kernels: %v)", n, d, stride, len(k), len(kt), fn != nil))
	}
	for c := 0; c < n; c += TileSlots {
		fn(&kt[c*d], unsafe.Pointer(&k[c*stride]), stride*width, d)
	}
}

// AttnScoresTile sets s[j·ss+t-from] = q_j·k_t for the len(q)/d query
// vectors q_j and the slots t in [from, to) of keys tiled by TileK*.
func (o *Ops) AttnScoresTile(s []float32, ss int, q []float32, d int, kt []float32, from, to int) {
	if d <= 0 || len(q)%d != 0 || d%16 != 0 || from < 0 || to < from || ss < to-from || to > len(kt)/d || !o.Tiled() ||
		(len(q) > 0 && (len(q)/d-1)*ss+to-from > len(s)) {
		panic(fmt.Sprintf("kernels: AttnScoresTile: %d query floats, slots [%d, %d) of %d tiled floats of %d, %d scores at stride %d (tiled kernels: %v)",
			len(q), from, to, len(kt), d, len(s), ss, o.Tiled()))
	}
	g := len(q) / d
	for t0 := from / TileSlots * TileSlots; t0 < to; t0 += TileSlots {
		a, e := max(from, t0), min(to, t0+TileSlots)
		mask := (1<<(e-t0) - 1) &^ (1<<(a-t0) - 1)
		// Lane l of the tile is slot t0+l, stored at s[t0+l-from]: the
		// offset may be negative, but only lanes inside [from, to) store.
		off := 4 * (t0 - from)
		for j := 0; j < g; j += 8 {
			c := min(8, g-j)
			o.tile.scores[c](&s[j*ss], off, 4*ss, &q[j*d], 4*d, &kt[t0*d], d, mask)
		}
	}
}

// SoftmaxOnline is one block of an online softmax: it sets
// x[i] = exp(scale·x[i] − mx) with mx = max(m, max_i scale·x[i]) and
// returns mx and Σ x[i]. Attention over blocks of keys keeps the largest
// score m and the sum l so far; a block that raises the largest to mx
// rescales what came before by exp(m − mx).
func (o *Ops) SoftmaxOnline(x []float32, scale, m float32) (mx, sum float32) {
	if len(x) == 0 {
		return m, 0
	}
	if o.tile.softmaxOnline == nil {
		return SoftmaxOnlineRef(x, scale, m)
	}
	return o.tile.softmaxOnline(&x[0], len(x), scale, m)
}

// FoldOnline folds one head's block of scores x into its running
// softmax: m and l are the largest scaled score and the sum so far, out
// the weighted values mixed so far, rescaled by exp(m − mx) where the
// block raises the largest to mx. x is left holding the block's
// exponentials, for the caller to mix into out.
func (o *Ops) FoldOnline(x []float32, scale float32, m, l *float32, out []float32) {
	if len(x) == 0 {
		return
	}
	mx, sum := o.SoftmaxOnline(x, scale, *m)
	if mx != *m && *l > 0 {
		alpha := float32(math.Exp(float64(*m - mx)))
		o.ScaleF32(out, alpha)
		*l *= alpha
	}
	*m, *l = mx, *l+sum
}

// SoftmaxOnlineRef is SoftmaxOnline's reference.
func SoftmaxOnlineRef(x []float32, scale, m float32) (mx, sum float32) {
	mx = m
	for i := range x {
		x[i] *= scale
		mx = max(mx, x[i])
	}
	for i := range x {
		x[i] = float32(math.Exp(float64(x[i] - mx)))
		sum += x[i]
	}
	return mx, sum
}

// TileKRef is TileKF32's reference.
func TileKRef(kt, k []float32, stride, d, n int) {
	for t := 0; t < n; t++ {
		for i := 0; i < d; i++ {
			kt[((t/TileSlots)*d+i)*TileSlots+t%TileSlots] = k[t*stride+i]
		}
	}
}

// AttnScoresTileRef is AttnScoresTile's reference.
func AttnScoresTileRef(s []float32, ss int, q []float32, d int, kt []float32, from, to int) {
	for j := 0; j < len(q)/d; j++ {
		for t := from; t < to; t++ {
			var sum float32
			for i := 0; i < d; i++ {
				sum += q[j*d+i] * kt[((t/TileSlots)*d+i)*TileSlots+t%TileSlots]
			}
			s[j*ss+t-from] = sum
		}
	}
}

// PrefetchRows asks for n rows of bytes bytes each, stride bytes apart
// from the start of rows, to be brought into the core's cache (L2) ahead of
// use: attention at depth calls it for the next pages it will read, whose
// addresses no hardware prefetcher can guess (pages are scattered over the
// pool).
func PrefetchRows[E any](rows []E, n, stride, bytes int) {
	if len(rows) == 0 || n <= 0 || bytes <= 0 {
		return
	}
	prefetchRows(unsafe.Pointer(&rows[0]), n, stride, (bytes+63)/64)
}
