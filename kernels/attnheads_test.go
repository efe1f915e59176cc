package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// TestAttnHeads checks the GQA-group kernels of every instruction set
// against one reference call per head: group sizes around the 4-head
// kernel, head dims that take it and that fall back, strided rows.
func TestAttnHeads(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	for _, o := range isaSets {
		for _, g := range []int{1, 3, 4, 7, 8} {
			for _, d := range []int{16, 40, 64, 128} {
				for _, n := range []int{1, 5, 16} {
					t.Run(fmt.Sprintf("%s/g%d/d%d/n%d", o.name, g, d, n), func(t *testing.T) { checkAttnHeads(t, o, r, g, d, n) })
				}
			}
		}
	}
}

func checkAttnHeads(t *testing.T, o *Ops, r *rand.Rand, g, d, n int) {
	stride := 3*d + 8 // rows of other KV heads in between
	ss := n + 3
	q := randF32(r, g*d)
	k32 := randF32(r, (n-1)*stride+d)
	k16 := make([]uint16, len(k32))
	F32ToF16RowRef(k16, k32)
	kb := make([]uint16, len(k32))
	F32ToBF16RowRef(kb, k32)
	w := randF32(r, (g-1)*ss+n)
	base := randF32(r, g*d)
	check := func(name string, got, want []float32) {
		t.Helper()
		for i := range want {
			if math.Abs(float64(got[i]-want[i])) > 1e-4*(1+math.Abs(float64(want[i]))) {
				t.Fatalf("%s[%d] = %v, want %v", name, i, got[i], want[i])
			}
		}
	}
	type kind struct {
		name   string
		scores func(s []float32)
		ref    func(s, q []float32)
		mix    func(out []float32)
		mref   func(out, w []float32)
	}
	kinds := []kind{
		{"f32", func(s []float32) { o.AttnScoresHeadsF32(s, ss, q, d, k32, stride, n) },
			func(s, q []float32) { AttnScoresF32Ref(s, q, k32, stride) },
			func(out []float32) { o.AttnMixHeadsF32(out, d, w, ss, k32, stride, n) },
			func(out, w []float32) { AttnMixF32Ref(out, w, k32, stride) }},
		{"f16", func(s []float32) { o.AttnScoresHeadsF16(s, ss, q, d, k16, stride, n) },
			func(s, q []float32) { AttnScoresF16Ref(s, q, k16, stride) },
			func(out []float32) { o.AttnMixHeadsF16(out, d, w, ss, k16, stride, n) },
			func(out, w []float32) { AttnMixF16Ref(out, w, k16, stride) }},
		{"bf16", func(s []float32) { o.AttnScoresHeadsBF16(s, ss, q, d, kb, stride, n) },
			func(s, q []float32) { AttnScoresBF16Ref(s, q, kb, stride) },
			func(out []float32) { o.AttnMixHeadsBF16(out, d, w, ss, kb, stride, n) },
			func(out, w []float32) { AttnMixBF16Ref(out, w, kb, stride) }},
	}
	for _, kd := range kinds {
		got, want := make([]float32, (g-1)*ss+n), make([]float32, (g-1)*ss+n)
		for i := range got {
			got[i], want[i] = 99, 99 // the gaps between heads stay untouched
		}
		kd.scores(got)
		for j := 0; j < g; j++ {
			kd.ref(want[j*ss:j*ss+n], q[j*d:(j+1)*d])
		}
		check(kd.name+" scores", got, want)
		mo, mw := append([]float32(nil), base...), append([]float32(nil), base...)
		kd.mix(mo)
		for j := 0; j < g; j++ {
			kd.mref(mw[j*d:(j+1)*d], w[j*ss:j*ss+n])
		}
		check(kd.name+" mix", mo, mw)
	}
}

// TestBlockAttnHeads holds every set's four-head block kernels against
// one Scores/Mix call per head, for every block format: group sizes
// around four, one to four blocks a head, strided rows, gaps between the
// heads' score rows that must stay untouched.
func TestBlockAttnHeads(t *testing.T) {
	r := rand.New(rand.NewPCG(6, 6))
	for _, o := range isaSets {
		for f := fmtQ8_0; f <= fmtIQ4_NL; f++ {
			a, bb := blockAttnFor(o.name, f), blockFmtBytes[f]
			if o.name == "generic" {
				a = blockRef(f)
			}
			for _, g := range []int{3, 4, 8, 9} {
				for _, nb := range []int{1, 2, 4} {
					for _, n := range []int{1, 7, 16} {
						name := fmt.Sprintf("%s/%s/g%d/nb%d/n%d", o.name, blockFmtNames[f], g, nb, n)
						checkBlockHeads(t, name, a, r, bb, g, nb, n)
					}
				}
			}
		}
	}
}

func checkBlockHeads(t *testing.T, name string, a BlockAttn, r *rand.Rand, bb, g, nb, n int) {
	d, stride, ss := nb*32, 3*nb*bb+5, n+2
	k := randBlocks(r, n, nb, stride, bb)
	if strings.Contains(name, "q4_1") || strings.Contains(name, "q5_1") {
		for t := 0; t < n; t++ { // a finite min where random bytes could be NaN
			for b := 0; b < nb; b++ {
				binary.LittleEndian.PutUint16(k[t*stride+b*bb+2:], f32ToF16(float32(r.NormFloat64())))
			}
		}
	}
	q := randF32(r, g*d)
	got, want := make([]float32, (g-1)*ss+n), make([]float32, (g-1)*ss+n)
	for i := range got {
		got[i], want[i] = 99, 99
	}
	a.ScoresHeads(got, ss, q, d, k, stride, n)
	for j := 0; j < g; j++ {
		a.Scores(want[j*ss:j*ss+n], q[j*d:(j+1)*d], k, stride)
	}
	for i := range want {
		j := min(i/ss, g-1)
		var qa float64
		for _, x := range q[j*d : (j+1)*d] {
			qa += math.Abs(float64(x))
		}
		if diff := math.Abs(float64(got[i] - want[i])); diff > 2e-6*qa*128+1e-6 || math.IsNaN(float64(got[i])) {
			t.Fatalf("%s: score %d = %g, per head %g", name, i, got[i], want[i])
		}
	}
	w := make([]float32, (g-1)*ss+n)
	for i := range w {
		w[i] = float32(r.Float64())
	}
	mo := randF32(r, g*d)
	mw := append([]float32(nil), mo...)
	a.MixHeads(mo, d, w, ss, k, stride, n)
	for j := 0; j < g; j++ {
		a.Mix(mw[j*d:(j+1)*d], w[j*ss:j*ss+n], k, stride)
	}
	for i := range mw {
		if diff := math.Abs(float64(mo[i] - mw[i])); diff > 1e-5*(float64(n)*128+math.Abs(float64(mw[i]))) {
			t.Fatalf("%s: mix %d = %g, per head %g", name, i, mo[i], mw[i])
		}
	}
}
