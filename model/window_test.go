package model_test

// Sliding-window attention against a plain float64 O(n²) reference forward
// pass computed here from the model's own weights, the window's receptive
// field, the loaders' window settings, and batch invariance: a prompt's
// logits do not depend on how it was split into forward passes or what
// else shared the batch.

import (
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"testing"

	"pagoda/kernels"
	"pagoda/model"
	"pagoda/quant"
	"pagoda/synth"
	"pagoda/testutil"
)

// windowShape has weights large enough (see openSynth's std) that attention
// is far from uniform, so which positions it sees shows in the logits.
var windowShape = synth.Shape{Arch: "llama", Layers: 2, Dim: 64, Heads: 4, KVHeads: 2, HeadDim: 16,
	FFN: 128, Vocab: 260, Context: 64}

func openSynth(t *testing.T, s synth.Shape, typ quant.Type, o model.Options) *model.Model {
	t.Helper()
	p := filepath.Join(t.TempDir(), "m.gguf")
	if err := synth.Write(p, synth.Options{Shape: s, Type: typ, Seed: 11, Std: 0.15}); err != nil {
		t.Fatal(err)
	}
	m, err := model.Open(p, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func testTokens(n, vocab int, seed uint32) []int32 {
	out := make([]int32, n)
	for i := range out {
		seed = seed*1664525 + 1013904223
		out[i] = int32(seed>>8) % int32(vocab)
	}
	return out
}

// --- float64 reference ---

func deq(t *testing.T, m *kernels.Matrix) []float64 {
	t.Helper()
	f := make([]float32, m.Rows*m.Cols)
	if err := quant.Dequantize(m.Type, m.Data[:m.Rows*m.RowBytes], f); err != nil {
		t.Fatal(err)
	}
	out := make([]float64, len(f))
	for i, v := range f {
		out[i] = float64(v)
	}
	return out
}

func matVec(w []float64, rows, cols int, x []float64) []float64 {
	out := make([]float64, rows)
	for r := range out {
		var s float64
		row := w[r*cols : (r+1)*cols]
		for c, v := range row {
			s += v * x[c]
		}
		out[r] = s
	}
	return out
}

func rmsNorm64(x []float64, w []float32, eps float64) []float64 {
	var ss float64
	for _, v := range x {
		ss += v * v
	}
	s := 1 / math.Sqrt(ss/float64(len(x))+eps)
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = v * s
		if w != nil {
			out[i] *= float64(w[i])
		}
	}
	return out
}

func rope64(x []float64, pos int, theta float64, ropeDim int, neox bool) {
	n := ropeDim / 2
	for i := 0; i < n; i++ {
		ang := float64(pos) * math.Pow(theta, -2*float64(i)/float64(ropeDim))
		s, c := math.Sincos(ang)
		a, b := 2*i, 2*i+1
		if neox {
			a, b = i, i+n
		}
		x0, x1 := x[a], x[b]
		x[a], x[b] = x0*c-x1*s, x0*s+x1*c
	}
}

// referenceLogits runs tokens (positions 0…n-1 of one sequence) through a
// float64 transcription of the llama forward pass with window-limited
// causal attention: position p sees [p-window+1, p] (all of [0, p] when
// window is 0). Weights are m's own, dequantized.
func referenceLogits(t *testing.T, m *model.Model, tokens []int32, window int) [][]float64 {
	t.Helper()
	c := m.Config
	if c.QKVBias || c.QKNorm || c.RopeFreqs != nil || (c.RopeScale != 0 && c.RopeScale != 1) {
		t.Fatal("reference covers plain llama only")
	}
	n, d, hd := len(tokens), c.NEmbd, c.HeadDim
	qd, kvd := c.NHead*hd, c.NKVHead*hd
	eps := float64(c.RMSEps)
	emb := deq(t, m.W.Embd)
	x := make([][]float64, n)
	for i, tok := range tokens {
		x[i] = append([]float64(nil), emb[int(tok)*d:(int(tok)+1)*d]...)
	}
	for _, l := range m.W.Layers {
		wq, wk, wv, wo := deq(t, l.Q), deq(t, l.K), deq(t, l.V), deq(t, l.O)
		wg, wu, wd := deq(t, l.Gate), deq(t, l.Up), deq(t, l.Down)
		qs, ks, vs := make([][]float64, n), make([][]float64, n), make([][]float64, n)
		for i := range x {
			xn := rmsNorm64(x[i], l.AttnNorm, eps)
			qs[i], ks[i], vs[i] = matVec(wq, qd, d, xn), matVec(wk, kvd, d, xn), matVec(wv, kvd, d, xn)
			for h := 0; h < c.NHead; h++ {
				rope64(qs[i][h*hd:(h+1)*hd], i, c.RopeTheta, c.RopeDim, c.RopeNeox)
			}
			for h := 0; h < c.NKVHead; h++ {
				rope64(ks[i][h*hd:(h+1)*hd], i, c.RopeTheta, c.RopeDim, c.RopeNeox)
			}
		}
		for i := range x {
			lo := 0
			if window > 0 && i-window+1 > 0 {
				lo = i - window + 1
			}
			att := make([]float64, qd)
			for h := 0; h < c.NHead; h++ {
				kh := h / (c.NHead / c.NKVHead)
				q := qs[i][h*hd : (h+1)*hd]
				scores := make([]float64, i+1-lo)
				mx := math.Inf(-1)
				for j := lo; j <= i; j++ {
					var s float64
					for e := 0; e < hd; e++ {
						s += q[e] * ks[j][kh*hd+e]
					}
					scores[j-lo] = s / math.Sqrt(float64(hd))
					mx = math.Max(mx, scores[j-lo])
				}
				var sum float64
				for k := range scores {
					scores[k] = math.Exp(scores[k] - mx)
					sum += scores[k]
				}
				for j := lo; j <= i; j++ {
					w := scores[j-lo] / sum
					for e := 0; e < hd; e++ {
						att[h*hd+e] += w * vs[j][kh*hd+e]
					}
				}
			}
			o := matVec(wo, d, qd, att)
			for e := range o {
				x[i][e] += o[e]
			}
			xn := rmsNorm64(x[i], l.FFNNorm, eps)
			g, u := matVec(wg, c.FFN, d, xn), matVec(wu, c.FFN, d, xn)
			for e := range g {
				g[e] = g[e] / (1 + math.Exp(-g[e])) * u[e]
			}
			dn := matVec(wd, d, c.FFN, g)
			for e := range dn {
				x[i][e] += dn[e]
			}
		}
	}
	out := deq(t, m.W.Output)
	logits := make([][]float64, n)
	for i := range x {
		logits[i] = matVec(out, c.VocabSize, d, rmsNorm64(x[i], m.W.OutputNorm, eps))
	}
	return logits
}

// --- running the model ---

// prefill runs tokens as one batch of sequence 0 and returns every row.
func prefill(t *testing.T, m *model.Model, tokens []int32) [][]float32 {
	t.Helper()
	cache := model.NewFlatCache(&m.Config, 1, len(tokens))
	return runChunks(t, m, cache, 0, tokens, len(tokens))
}

// runChunks feeds tokens of seq through cache in forward passes of chunk
// tokens, returning every position's logits.
func runChunks(t *testing.T, m *model.Model, cache model.KVCache, seq int32, tokens []int32, chunk int) [][]float32 {
	t.Helper()
	V := m.Config.VocabSize
	var rows [][]float32
	for lo := 0; lo < len(tokens); lo += chunk {
		hi := min(lo+chunk, len(tokens))
		b := &model.Batch{}
		for i := lo; i < hi; i++ {
			b.Tokens = append(b.Tokens, tokens[i])
			b.Pos = append(b.Pos, int32(i))
			b.Seq = append(b.Seq, seq)
			b.Logits = append(b.Logits, true)
		}
		l, err := m.Forward(b, cache)
		if err != nil {
			t.Fatal(err)
		}
		for r := 0; r < hi-lo; r++ {
			rows = append(rows, l[r*V:(r+1)*V])
		}
	}
	return rows
}

func maxDiff(a []float32, b []float64) float64 {
	var d float64
	for i := range a {
		d = math.Max(d, math.Abs(float64(a[i])-b[i]))
	}
	return d
}

func identical(a, b []float32) bool {
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return len(a) == len(b)
}

// --- tests ---

// TestSlidingWindowReference: for windows from 1 to beyond the sequence,
// prefill and token-by-token decode match the float64 reference, and a
// window no shorter than the sequence is exactly full attention.
func TestSlidingWindowReference(t *testing.T) {
	for _, reference := range []bool{true, false} {
		m := openSynth(t, windowShape, quant.F32, model.Options{Threads: 2, Reference: reference})
		tokens := testTokens(24, m.Config.VocabSize, 3)
		m.Config.SlidingWindow = 0
		full := prefill(t, m, tokens)
		fullRef := referenceLogits(t, m, tokens, 0)
		for _, w := range []int{1, 2, 5, 8, 23, 24, 100} {
			name := fmt.Sprintf("reference=%v/window=%d", reference, w)
			m.Config.SlidingWindow = w
			if got := m.AttnParams().Window; got != w {
				t.Fatalf("%s: AttnParams().Window = %d", name, got)
			}
			ref := referenceLogits(t, m, tokens, w)
			cache := model.NewFlatCache(&m.Config, 1, len(tokens))
			for mode, rows := range map[string][][]float32{
				"prefill": prefill(t, m, tokens),
				"decode":  runChunks(t, m, cache, 0, tokens, 1),
			} {
				var worst float64
				for p := range rows {
					worst = math.Max(worst, maxDiff(rows[p], ref[p]))
				}
				if worst > 5e-5 {
					t.Errorf("%s %s: logits differ from the float64 reference by %.3g (bound 5e-5)", name, mode, worst)
				}
				if w >= len(tokens) {
					for p := range rows {
						if !identical(rows[p], full[p]) {
							t.Errorf("%s %s: position %d differs from full attention", name, mode, p)
							break
						}
					}
				}
			}
			// The window must matter, or this test proves nothing: the
			// reference itself moves at the last position.
			if w < len(tokens)-1 {
				last := len(tokens) - 1
				var moved float64
				for i := range ref[last] {
					moved = math.Max(moved, math.Abs(ref[last][i]-fullRef[last][i]))
				}
				if moved < 1e-2 {
					t.Errorf("%s: window %d changes the reference's last logits by only %.3g", name, w, moved)
				}
			}
		}
		m.Config.SlidingWindow = 0
	}
}

// TestSlidingWindowReceptiveField: with window W, a token reaches W-1
// positions further per layer. Changing token 0 must leave every position
// beyond layers·(W-1) bit-identical and change the position at the edge.
func TestSlidingWindowReceptiveField(t *testing.T) {
	for _, layers := range []int{1, 2} {
		for _, typ := range []quant.Type{quant.F32, quant.Q8_0} {
			s := windowShape
			s.Layers = layers
			m := openSynth(t, s, typ, model.Options{Threads: 2})
			const W = 5
			m.Config.SlidingWindow = W
			a := testTokens(20, m.Config.VocabSize, 9)
			b := append([]int32(nil), a...)
			b[0] = (a[0] + 1) % int32(m.Config.VocabSize)
			ra, rb := prefill(t, m, a), prefill(t, m, b)
			reach := layers * (W - 1)
			for p := range ra {
				same := identical(ra[p], rb[p])
				switch {
				case p > reach && !same:
					t.Errorf("%d layers, %s, window %d: position %d changed with token 0, beyond the reach %d", layers, typ, W, p, reach)
				case p <= reach && same && (p == 0 || p == reach):
					t.Errorf("%d layers, %s, window %d: position %d did not change with token 0 (reach %d)", layers, typ, W, p, reach)
				}
			}
		}
	}
}

// TestSlidingWindowLoaders: the window comes from GGUF metadata and HF
// config.json, where use_sliding_window=false or null disables it.
func TestSlidingWindowLoaders(t *testing.T) {
	dir := t.TempDir()
	base := writeSynth(t, dir, "base.gguf", tinyShape, quant.F32)
	p := rewriteGGUF(t, base, filepath.Join(dir, "sw.gguf"), ggufEdit{set: map[string]any{"llama.attention.sliding_window": uint32(6)}})
	m, err := model.Open(p, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	if m.Config.SlidingWindow != 6 || m.AttnParams().Window != 6 {
		t.Errorf("GGUF sliding_window 6: Config %d, AttnParams %d", m.Config.SlidingWindow, m.AttnParams().Window)
	}
	m.Close()
	m, err = model.Open(base, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	if m.AttnParams().Window != 0 {
		t.Errorf("GGUF without sliding_window: window %d", m.AttnParams().Window)
	}
	m.Close()

	h := newHFDir(t)
	for _, c := range []struct {
		changes map[string]any
		want    int
	}{
		{map[string]any{"sliding_window": 6}, 6},
		{map[string]any{"sliding_window": 6, "use_sliding_window": false}, 0},
		{map[string]any{"sliding_window": 6, "use_sliding_window": true}, 6},
		{map[string]any{"sliding_window": nil}, 0},
		{map[string]any{"sliding_window": json.RawMessage("null")}, 0},
	} {
		h.writeConfig(t, c.changes)
		m, err := model.Open(h.dir, model.Options{Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		if m.Config.SlidingWindow != c.want {
			t.Errorf("config.json %v: window %d, want %d", c.changes, m.Config.SlidingWindow, c.want)
		}
		m.Close()
	}
}

// TestBatchInvariance: a prompt's logits are bit-identical whether it is
// prefilled in one pass, in chunks of 1, 3 or 7, or interleaved with a
// second sequence in the same batches of a two-sequence cache.
func TestBatchInvariance(t *testing.T) {
	k := windowShape
	k.Dim, k.HeadDim, k.FFN = 256, 64, 256 // rows of 256: K-quants stored as such
	cases := []struct {
		shape  synth.Shape
		typ    quant.Type
		window int
	}{
		{windowShape, quant.F32, 0},
		{windowShape, quant.F16, 0},
		{windowShape, quant.Q8_0, 0},
		{windowShape, quant.Q4_0, 6},
		{k, quant.Q4_K, 0},
		{k, quant.Q6_K, 0},
	}
	for _, c := range cases {
		for _, reference := range []bool{false, true} {
			name := fmt.Sprintf("%s/window=%d/reference=%v", c.typ, c.window, reference)
			t.Run(name, func(t *testing.T) {
				m := openSynth(t, c.shape, c.typ, model.Options{Threads: 2, Reference: reference})
				m.Config.SlidingWindow = c.window
				checkBatchInvariance(t, m)
			})
		}
	}
	t.Run("stories260K", func(t *testing.T) {
		m, err := model.Open(testutil.Shared(t, "models/gguf/stories260K.gguf"), model.Options{Threads: 2})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		checkBatchInvariance(t, m)
	})
}

func checkBatchInvariance(t *testing.T, m *model.Model) {
	t.Helper()
	V := m.Config.VocabSize
	a := testTokens(29, V, 5)
	other := testTokens(17, V, 77)
	whole := prefill(t, m, a)
	otherWhole := prefill(t, m, other)
	compare := func(what string, got, want [][]float32) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %d rows, want %d", what, len(got), len(want))
		}
		for p := range want {
			if !identical(got[p], want[p]) {
				var d float64
				for i := range got[p] {
					d = math.Max(d, math.Abs(float64(got[p][i]-want[p][i])))
				}
				t.Errorf("%s: position %d differs from the one-batch prefill (max |Δ| %.3g)", what, p, d)
				return
			}
		}
	}
	for _, chunk := range []int{1, 3, 7} {
		cache := model.NewFlatCache(&m.Config, 1, len(a))
		compare(fmt.Sprintf("chunks of %d", chunk), runChunks(t, m, cache, 0, a, chunk), whole)
	}

	// Two sequences share every batch: sequence 1 is handle 0 of the cache
	// (so a's rows live at handle 1), chunk sizes vary, and which sequence
	// comes first in the batch alternates.
	cache := model.NewFlatCache(&m.Config, 2, len(a))
	seqs := []struct {
		handle int32
		tokens []int32
		next   int
		rows   [][]float32
	}{{1, a, 0, nil}, {0, other, 0, nil}}
	sizes := [][2]int{{5, 1}, {1, 4}, {7, 2}, {3, 3}, {2, 1}, {6, 5}, {4, 1}, {1, 1}}
	for step := 0; seqs[0].next < len(a) || seqs[1].next < len(other); step++ {
		sz := sizes[step%len(sizes)]
		order := []int{0, 1}
		if step%2 == 1 {
			order = []int{1, 0}
		}
		b := &model.Batch{}
		var owner []int
		for _, si := range order {
			s := &seqs[si]
			hi := min(s.next+sz[si], len(s.tokens))
			for i := s.next; i < hi; i++ {
				b.Tokens = append(b.Tokens, s.tokens[i])
				b.Pos = append(b.Pos, int32(i))
				b.Seq = append(b.Seq, s.handle)
				b.Logits = append(b.Logits, true)
				owner = append(owner, si)
			}
			s.next = hi
		}
		l, err := m.Forward(b, cache)
		if err != nil {
			t.Fatal(err)
		}
		for r, si := range owner {
			seqs[si].rows = append(seqs[si].rows, l[r*V:(r+1)*V])
		}
	}
	compare("mixed with another sequence", seqs[0].rows, whole)
	compare("the other sequence", seqs[1].rows, otherWhole)
}
