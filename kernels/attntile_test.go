package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestAttnScoresTile: the tiled scores of every head count 1..19 (chunks
// of eight and every remainder) against the reference over keys tiled from
// f32, f16 and bf16 rows, for ranges that start and end inside a tile,
// span several tiles or fill one, with strided rows; the scores outside
// [from, to) and the gaps between heads stay untouched.
func TestAttnScoresTile(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	for _, o := range isaSets {
		if !o.Tiled() {
			continue
		}
		for _, g := range []int{1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 19} {
			for _, d := range []int{16, 64, 128} {
				for _, rg := range [][2]int{{0, 16}, {0, 1}, {3, 11}, {5, 37}, {16, 48}, {47, 48}, {0, 64}} {
					t.Run(fmt.Sprintf("%s/g%d/d%d/%d-%d", o.name, g, d, rg[0], rg[1]), func(t *testing.T) {
						checkScoresTile(t, o, r, g, d, rg[0], rg[1])
					})
				}
			}
		}
	}
}

func checkScoresTile(t *testing.T, o *Ops, r *rand.Rand, g, d, from, to int) {
	const n = 64
	stride := 2*d + 16
	k32 := randF32(r, (n-1)*stride+d)
	k16 := make([]uint16, len(k32))
	F32ToF16RowRef(k16, k32)
	kb := make([]uint16, len(k32))
	F32ToBF16RowRef(kb, k32)
	q := randF32(r, g*d)
	ss := to - from + 5
	for _, kind := range []struct {
		name string
		tile func(kt []float32)
		row  func(dst []float32, t int)
	}{
		{"f32", func(kt []float32) { o.TileKF32(kt, k32, stride, d, n) }, func(dst []float32, t int) { copy(dst, k32[t*stride:t*stride+d]) }},
		{"f16", func(kt []float32) { o.TileKF16(kt, k16, stride, d, n) }, func(dst []float32, t int) { F16ToF32RowRef(dst, k16[t*stride:t*stride+d]) }},
		{"bf16", func(kt []float32) { o.TileKBF16(kt, kb, stride, d, n) }, func(dst []float32, t int) { BF16ToF32RowRef(dst, kb[t*stride:t*stride+d]) }},
	} {
		// The tiling itself is exact: widened values, moved.
		wide := make([]float32, n*d)
		for t := 0; t < n; t++ {
			kind.row(wide[t*d:(t+1)*d], t)
		}
		want := make([]float32, n*d)
		TileKRef(want, wide, d, d, n)
		kt := make([]float32, n*d)
		kind.tile(kt)
		for i := range want {
			if kt[i] != want[i] {
				t.Fatalf("%s: tile[%d] = %v, want %v", kind.name, i, kt[i], want[i])
			}
		}
		s := make([]float32, (g-1)*ss+to-from+7)
		for i := range s {
			s[i] = -7
		}
		ref := make([]float32, len(s))
		copy(ref, s)
		o.AttnScoresTile(s, ss, q, d, kt, from, to)
		AttnScoresTileRef(ref, ss, q, d, kt, from, to)
		for i := range ref {
			if math.Abs(float64(s[i]-ref[i])) > 1e-4*(1+math.Abs(float64(ref[i]))) {
				t.Fatalf("%s: s[%d] = %v, want %v", kind.name, i, s[i], ref[i])
			}
		}
	}
}

// TestAttnScoresTileRefuses: ranges outside the tiles and short score
// slices panic (a programming error) instead of writing past them.
func TestAttnScoresTileRefuses(t *testing.T) {
	o := bestOps
	if !o.Tiled() {
		t.Skip("no tiled kernels on this CPU")
	}
	kt, q := make([]float32, 32*16), make([]float32, 2*16)
	for _, c := range []struct {
		s        []float32
		ss       int
		from, to int
	}{
		{make([]float32, 64), 16, 0, 33}, {make([]float32, 64), 16, -1, 4}, {make([]float32, 20), 16, 0, 16}, {make([]float32, 64), 4, 0, 8},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("scores [%d, %d) into %d at %d: no panic", c.from, c.to, len(c.s), c.ss)
				}
			}()
			o.AttnScoresTile(c.s, c.ss, q, 16, kt, c.from, c.to)
		}()
	}
}

// TestSoftmaxOnline: every set's block softmax against the reference, for
// lengths around the vector width, a running maximum below, inside and
// above the block's, and -Inf (the first block); chained over blocks it
// gives the one-pass softmax.
func TestSoftmaxOnline(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	for _, o := range isaSets {
		for _, n := range []int{1, 7, 16, 17, 40, 128} {
			for _, m := range []float32{float32(math.Inf(-1)), -3, 0.5, 9} {
				x := randF32(r, n)
				ref := append([]float32(nil), x...)
				gm, gs := o.SoftmaxOnline(x, 0.37, m)
				wm, ws := SoftmaxOnlineRef(ref, 0.37, m)
				if gm != wm || math.Abs(float64(gs-ws)) > 1e-5*float64(ws) {
					t.Fatalf("%s n=%d m=%v: (%v, %v), want (%v, %v)", o.name, n, m, gm, gs, wm, ws)
				}
				for i := range x {
					if math.Abs(float64(x[i]-ref[i])) > 2e-6*(1+math.Abs(float64(ref[i]))) {
						t.Fatalf("%s n=%d m=%v: x[%d] = %v, want %v", o.name, n, m, i, x[i], ref[i])
					}
				}
			}
		}
		// Blocks chained with rescaling equal the softmax of the whole row.
		x := randF32(r, 300)
		whole := append([]float32(nil), x...)
		for i := range whole {
			whole[i] *= 0.37
		}
		SoftmaxRef(whole)
		m, l := float32(math.Inf(-1)), float32(0)
		blocks := [][2]int{{0, 5}, {5, 128}, {128, 129}, {129, 300}}
		ms := make([]float32, len(blocks))
		for b, bl := range blocks {
			mx, s := o.SoftmaxOnline(x[bl[0]:bl[1]], 0.37, m)
			l = l*float32(math.Exp(float64(m-mx))) + s
			m, ms[b] = mx, mx
		}
		for b, bl := range blocks {
			f := float32(math.Exp(float64(ms[b]-m))) / l
			for i := bl[0]; i < bl[1]; i++ {
				if math.Abs(float64(x[i]*f-whole[i])) > 1e-6 {
					t.Fatalf("%s: chained p[%d] = %v, want %v", o.name, i, x[i]*f, whole[i])
				}
			}
		}
	}
}

// TestTileHeadsSplit: a head's tiled scores and its mix are the same bits
// whether its GQA group goes through the kernels whole or split (as
// tensor-parallel ranks split it), so a split group attends as one rank.
func TestTileHeadsSplit(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	for _, o := range isaSets {
		if !o.Tiled() {
			continue
		}
		const g, d, n = 8, 64, 48
		k := randF32(r, n*d)
		k16 := make([]uint16, len(k))
		F32ToF16RowRef(k16, k)
		kt := make([]float32, n*d)
		o.TileKF16(kt, k16, d, d, n)
		q, w := randF32(r, g*d), randF32(r, g*n)
		whole, out := make([]float32, g*n), make([]float32, g*d)
		o.AttnScoresTile(whole, n, q, d, kt, 0, n)
		o.AttnMixHeadsF16(out, d, w, n, k16, d, n)
		for _, split := range [][]int{{4, 4}, {2, 2, 2, 2}, {1, 3, 1, 3}, {5, 3}} {
			h := 0
			for _, c := range split {
				s, mo := make([]float32, c*n), make([]float32, c*d)
				o.AttnScoresTile(s, n, q[h*d:(h+c)*d], d, kt, 0, n)
				o.AttnMixHeadsF16(mo, d, w[h*n:(h+c)*n], n, k16, d, n)
				for i := range s {
					if s[i] != whole[h*n+i] {
						t.Fatalf("%s split %v: score %d of head %d is %v, whole %v", o.name, split, i%n, h+i/n, s[i], whole[h*n+i])
					}
				}
				for i := range mo {
					if mo[i] != out[h*d+i] {
						t.Fatalf("%s split %v: mix %d of head %d is %v, whole %v", o.name, split, i%d, h+i/d, mo[i], out[h*d+i])
					}
				}
				h += c
			}
		}
	}
}

// TestBlockWiden: every block format's rows widened by the kernel equal
// the reference decoding (up to the fused multiply-add of the formats
// with a min), rows strided, for sets that have the kernel.
func TestBlockWiden(t *testing.T) {
	r := rand.New(rand.NewPCG(6, 6))
	for _, o := range isaSets {
		for f := fmtQ8_0; f <= fmtIQ4_NL; f++ {
			a := blockAttnFor(o.name, f)
			if !a.CanWiden() {
				continue
			}
			const n, nb = 16, 2
			bb := blockFmtBytes[f]
			stride := nb*bb + 10
			k := randBlocks(r, n, nb, stride, bb)
			got := make([]float32, n*nb*32)
			a.Widen(got, k, nb*32, stride, n)
			for row := 0; row < n; row++ {
				for b := 0; b < nb; b++ {
					want := widenRef(f, k[row*stride+b*bb:row*stride+(b+1)*bb])
					for i, w := range want {
						g := got[row*nb*32+b*32+i]
						gn, wn := math.IsNaN(float64(g)), math.IsNaN(float64(w))
						if gn != wn || !wn && math.Abs(float64(g-w)) > 1e-6*(1+math.Abs(float64(w))) {
							t.Fatalf("%s %s: row %d element %d = %v, want %v", o.name, blockFmtNames[f], row, b*32+i, g, w)
						}
					}
				}
			}
		}
	}
}

// widenRef decodes one block of format f.
func widenRef(f blockFmt, blk []byte) [32]float32 {
	var x [32]float32
	d := f16ToF32(binary.LittleEndian.Uint16(blk))
	switch f {
	case fmtQ8_0:
		for i := range x {
			x[i] = d * float32(int8(blk[2+i]))
		}
	case fmtQ4_0:
		for j, c := range blk[2:18] {
			x[j], x[j+16] = d*float32(int32(c&15)-8), d*float32(int32(c>>4)-8)
		}
	default:
		decodeBlock(f, blk, &x)
	}
	return x
}
