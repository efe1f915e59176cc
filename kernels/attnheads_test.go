package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
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
