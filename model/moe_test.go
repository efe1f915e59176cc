package model

import (
	"math"
	"path/filepath"
	"testing"

	"pagoda/arch"
	"pagoda/kernels"
	"pagoda/testutil"
)

// route against hand-computed selections and weights for the gating
// variants the golden files do not cover: sigmoid gating with a selection
// bias (DeepSeek-V3), renormalisation and scale.
func TestRoute(t *testing.T) {
	logits := []float32{0.5, -1, 2, 0.1, 1.5}
	sig := func(x float32) float64 { return 1 / (1 + math.Exp(-float64(x))) }
	soft := func() []float64 {
		var s float64
		out := make([]float64, len(logits))
		for i, v := range logits {
			out[i] = math.Exp(float64(v))
			s += out[i]
		}
		for i := range out {
			out[i] /= s
		}
		return out
	}()
	for _, tc := range []struct {
		name  string
		c     Config
		bias  []float32
		sel   []int
		wants []float64
	}{
		{"softmax", Config{Gating: arch.GatingSoftmax}, nil, []int{2, 4}, []float64{soft[2], soft[4]}},
		{"softmax renormalised ×2.5", Config{Gating: arch.GatingSoftmax, ExpertNorm: true, ExpertScale: 2.5}, nil, []int{2, 4},
			[]float64{2.5 * soft[2] / (soft[2] + soft[4]), 2.5 * soft[4] / (soft[2] + soft[4])}},
		// The bias moves expert 1 ahead of 4 for selection; its weight
		// stays its unbiased probability.
		{"sigmoid with selection bias", Config{Gating: arch.GatingSigmoid}, []float32{0, 3, 0, 0, 0}, []int{1, 2},
			[]float64{sig(-1), sig(2)}},
		{"sigmoid renormalised", Config{Gating: arch.GatingSigmoid, ExpertNorm: true}, nil, []int{2, 4},
			[]float64{sig(2) / (sig(2) + sig(1.5)), sig(1.5) / (sig(2) + sig(1.5))}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.c.NExpert, tc.c.NExpertUsed = 5, 2
			m := &Model{Config: tc.c, ops: kernels.Generic()}
			ms := &moeScratch{logits: append([]float32(nil), logits...)}
			m.route(ms, &Layer{ProbsBias: tc.bias}, 1)
			got := map[int]float64{}
			for e, rows := range ms.rows {
				for j := range rows {
					got[e] = float64(ms.wts[e][j])
				}
			}
			if len(got) != 2 {
				t.Fatalf("selected %v, want %v", got, tc.sel)
			}
			for i, e := range tc.sel {
				w, ok := got[e]
				if !ok || math.Abs(w-tc.wants[i]) > 1e-6 {
					t.Errorf("expert %d: weight %v (selected %v), want %v", e, w, ok, tc.wants[i])
				}
			}
		})
	}
}

// The expert-load counters: every token of a forward pass is counted once
// per selected expert and MoE layer, and a decode step reads the weights of
// at most NExpertUsed experts per layer, not all of them.
func TestExpertLoad(t *testing.T) {
	dir := testutil.Shared(t, "golden")
	m, err := Open(filepath.Join(dir, "models", "g-deepseek2.Q8_0.gguf"), Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	c := &m.Config
	const T = 10
	kv := m.NewFlatCache(1, T+1)
	b := &Batch{}
	for i := 0; i < T; i++ {
		b.Tokens, b.Pos, b.Seq = append(b.Tokens, int32(5+i)), append(b.Pos, int32(i)), append(b.Seq, 0)
	}
	if _, err := m.Forward(b, kv); err != nil {
		t.Fatal(err)
	}
	load := m.ExpertLoad()
	for l, row := range load {
		var sum uint64
		for _, n := range row {
			sum += n
		}
		want := uint64(T * c.NExpertUsed)
		if l < c.NDenseLead {
			want = 0
			if row != nil {
				t.Errorf("dense layer %d has expert counts", l)
			}
		}
		if sum != want {
			t.Errorf("layer %d: %d routed tokens, want %d", l, sum, want)
		}
	}
	before := m.ExpertBytesRead()
	if _, err := m.Forward(&Batch{Tokens: []int32{9}, Pos: []int32{T}, Seq: []int32{0}}, kv); err != nil {
		t.Fatal(err)
	}
	l := &m.W.Layers[c.NLayer-1]
	per := uint64(len(l.GateExps[0].Data) + len(l.UpExps[0].Data) + len(l.DownExps[0].Data))
	moeLayers := uint64(c.NLayer - c.NDenseLead)
	if got, want := m.ExpertBytesRead()-before, per*uint64(c.NExpertUsed)*moeLayers; got != want {
		t.Errorf("decode step read %d expert bytes, want %d (%d experts × %d layers), all experts being %d",
			got, want, c.NExpertUsed, moeLayers, per*uint64(c.NExpert)*moeLayers)
	}
}
