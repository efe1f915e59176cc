package model

import (
	"math"
	"math/rand"
	"testing"

	"pagoda/kernels"
)

// TestFlatTiled checks the tiled, online-softmax attention of the flat
// cache against float64 attention over the stored keys and values, for
// prompts attended in chunks and decode rows of several sequences in one
// call, with and without a window, and that a query's output has the same
// bits alone as in any chunk.
func TestFlatTiled(t *testing.T) {
	ops := kernels.Best()
	if !ops.Tiled() {
		t.Skip("no tiled kernels on this CPU")
	}
	for _, tc := range []struct {
		nh, nkv, hd, window, maxLen int
		mla                         bool
	}{
		{8, 1, 64, 0, 300, false}, {4, 2, 32, 0, 203, false}, {14, 2, 64, 0, 161, false}, {6, 3, 16, 50, 300, false},
		{16, 1, 576, 0, 140, true},
	} {
		c := &Config{NLayer: 2, NHead: tc.nh, NKVHead: tc.nkv, HeadDim: tc.hd}
		if tc.mla {
			c.MLA, c.KVLoRA, c.QKRope = true, tc.hd-64, 64
		}
		f := newFlatCache(c, 2, tc.maxLen, ops)
		if !f.tiles(AttnParams{NHead: tc.nh, NKVHead: tc.nkv, HeadDim: tc.hd}) {
			t.Fatalf("%+v: not tiled", tc)
		}
		p := AttnParams{NHead: tc.nh, NKVHead: tc.nkv, HeadDim: tc.hd, Scale: 0.3, Window: tc.window}
		rng := rand.New(rand.NewSource(int64(tc.hd)))
		kvd, qd := tc.nkv*tc.hd, tc.nh*tc.hd
		// Fill both sequences' layer 1, all positions, one row per call.
		for seq := int32(0); seq < 2; seq++ {
			for pos := 0; pos < tc.maxLen; pos++ {
				if err := f.Begin(&Batch{Seq: []int32{seq}, Pos: []int32{int32(pos)}, Tokens: []int32{0}}); err != nil {
					t.Fatal(err)
				}
				k, v := randNorm(rng, kvd), randNorm(rng, kvd)
				f.Store(1, 0, k, v)
			}
		}
		L := tc.maxLen
		q := randNorm(rng, L*qd)
		// Sequence 0 as one prompt in chunks of 37; then decode rows of
		// both sequences together.
		got := make([]float32, L*qd)
		for lo := 0; lo < L; lo += 37 {
			hi := min(L, lo+37)
			b := &Batch{}
			for pos := lo; pos < hi; pos++ {
				b.Seq, b.Pos, b.Tokens = append(b.Seq, 0), append(b.Pos, int32(pos)), append(b.Tokens, 0)
			}
			if err := f.Begin(b); err != nil {
				t.Fatal(err)
			}
			f.Attend(1, 0, hi-lo, q[lo*qd:hi*qd], got[lo*qd:hi*qd], p)
		}
		for pos := 0; pos < L; pos += 29 {
			want := flatRef(f, p, 0, pos, q[pos*qd:(pos+1)*qd])
			for i, w := range want {
				if d := math.Abs(float64(got[pos*qd+i]) - w); d > 2e-5*(1+math.Abs(w)) {
					t.Fatalf("%+v: position %d value %d: %g, float64 %g", tc, pos, i, got[pos*qd+i], w)
				}
			}
		}
		// Decode rows: sequence 1 at L-1, sequence 0 at 97 and 98 (a run
		// of two), in one call: each equals its own chunked bits above
		// (sequence 0) or float64 attention (sequence 1).
		b := &Batch{Seq: []int32{1, 0, 0}, Pos: []int32{int32(L - 1), 97, 98}, Tokens: []int32{0, 0, 0}}
		if err := f.Begin(b); err != nil {
			t.Fatal(err)
		}
		qs := append(append(append([]float32(nil), q[(L-1)*qd:L*qd]...), q[97*qd:98*qd]...), q[98*qd:99*qd]...)
		out := make([]float32, 3*qd)
		f.Attend(1, 0, 3, qs, out, p)
		for i := range 2 * qd {
			if out[qd+i] != got[97*qd+i] {
				t.Fatalf("%+v: decode row of position %d differs from its chunk: %g vs %g", tc, 97+i/qd, out[qd+i], got[97*qd+i])
			}
		}
		want := flatRef(f, p, 1, L-1, q[(L-1)*qd:L*qd])
		for i, w := range want {
			if d := math.Abs(float64(out[i]) - w); d > 2e-5*(1+math.Abs(w)) {
				t.Fatalf("%+v: sequence 1 value %d: %g, float64 %g", tc, i, out[i], w)
			}
		}
	}
}

func randNorm(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}

// flatRef is float64 attention of query q at pos over f's layer 1.
func flatRef(f *FlatCache, p AttnParams, seq int32, pos int, q []float32) []float64 {
	hd, g := p.HeadDim, p.NHead/p.NKVHead
	out := make([]float64, p.NHead*hd)
	start := 0
	if p.Window > 0 && pos+1 > p.Window {
		start = pos + 1 - p.Window
	}
	for h := 0; h < p.NHead; h++ {
		kh := h / g * hd
		s := make([]float64, pos+1-start)
		mx := math.Inf(-1)
		for t := start; t <= pos; t++ {
			o := f.off(1, seq, int32(t)) + kh
			var d float64
			for i := 0; i < hd; i++ {
				d += float64(q[h*hd+i]) * float64(f.k[o+i])
			}
			s[t-start] = d * float64(p.Scale)
			mx = max(mx, s[t-start])
		}
		var sum float64
		for i := range s {
			s[i] = math.Exp(s[i] - mx)
			sum += s[i]
		}
		vs := f.v
		if vs == nil {
			vs = f.k
		}
		for t := start; t <= pos; t++ {
			o := f.off(1, seq, int32(t)) + kh
			for i := 0; i < hd; i++ {
				out[h*hd+i] += s[t-start] / sum * float64(vs[o+i])
			}
		}
	}
	return out
}

// TestFlatAttendHeads: attending a chunk one KV head at a time gives the
// bits of attending all heads at once, tiled or row by row.
func TestFlatAttendHeads(t *testing.T) {
	for _, tc := range []struct{ nh, nkv, hd int }{{8, 4, 64}, {8, 4, 8}, {6, 6, 16}} {
		c := &Config{NLayer: 1, NHead: tc.nh, NKVHead: tc.nkv, HeadDim: tc.hd}
		f := newFlatCache(c, 1, 200, kernels.Best())
		p := AttnParams{NHead: tc.nh, NKVHead: tc.nkv, HeadDim: tc.hd, Scale: 0.2}
		rng := rand.New(rand.NewSource(int64(tc.hd)))
		kvd, qd := tc.nkv*tc.hd, tc.nh*tc.hd
		b := &Batch{}
		for pos := 0; pos < 200; pos++ {
			b.Seq, b.Pos, b.Tokens = append(b.Seq, 0), append(b.Pos, int32(pos)), append(b.Tokens, 0)
		}
		if err := f.Begin(b); err != nil {
			t.Fatal(err)
		}
		for r := 0; r < 200; r++ {
			f.Store(0, r, randNorm(rng, kvd), randNorm(rng, kvd))
		}
		q := randNorm(rng, 200*qd)
		for _, rows := range [][2]int{{0, 200}, {150, 166}, {199, 200}} {
			lo, hi := rows[0], rows[1]
			all := make([]float32, (hi-lo)*qd)
			f.Attend(0, lo, hi, q[lo*qd:hi*qd], all, p)
			split := make([]float32, (hi-lo)*qd)
			for kh := 0; kh < tc.nkv; kh++ {
				f.AttendHeads(0, lo, hi, kh, kh+1, q[lo*qd:hi*qd], split, p)
			}
			for i := range all {
				if math.Float32bits(all[i]) != math.Float32bits(split[i]) {
					t.Fatalf("%+v rows %d..%d value %d: %g split by head, %g whole", tc, lo, hi, i, split[i], all[i])
				}
			}
			// One head alone writes its query heads' outputs and no others.
			nan := float32(math.NaN())
			for i := range split {
				split[i] = nan
			}
			f.AttendHeads(0, lo, hi, 1, 2, q[lo*qd:hi*qd], split, p)
			g := tc.nh / tc.nkv
			for i := range split {
				h := i % qd / tc.hd
				if mine := h/g == 1; mine != (split[i] == split[i]) || mine && split[i] != all[i] {
					t.Fatalf("%+v: KV head 1 alone: value %d (query head %d) = %g", tc, i, h, split[i])
				}
			}
		}
	}
}
