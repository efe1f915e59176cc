package model_test

import (
	"math"
	"path/filepath"
	"testing"

	"pagoda/arch"
	"pagoda/gguf"
	"pagoda/model"
	"pagoda/quant"
	"pagoda/synth"
)

// toymlp is an architecture declared only here: neox rope, q/k/v biases,
// and a non-gated FFN (down(silu(up(x))), no ffn_gate tensor). It proves
// that one declaration is all synth, the loader and Forward need.
func init() {
	arch.Register(&arch.Arch{
		Name: "toymlp",
		Attn: arch.Attention{Rope: arch.RopeNeox, Bias: arch.Always},
		FFN:  arch.DenseFFN{Gated: false},
	})
}

func TestToyArchitecture(t *testing.T) {
	path := filepath.Join(t.TempDir(), "toy.gguf")
	shape := synth.Shape{Arch: "toymlp", Layers: 2, Dim: 32, Heads: 4, KVHeads: 2, HeadDim: 8, FFN: 48, Vocab: 300, Context: 64}
	if err := synth.Write(path, synth.Options{Shape: shape, Seed: 3, Std: 0.3}); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Tensor("blk.0.ffn_gate.weight") != nil || f.Tensor("blk.1.attn_v.bias") == nil {
		t.Fatal("synth did not follow the declaration (gate present or bias missing)")
	}
	tokens := []int32{1, 17, 250, 3, 99, 42, 7}
	want := toyReference(t, f, shape, tokens)
	for _, reference := range []bool{true, false} {
		m, err := model.Open(path, model.Options{Threads: 2, Reference: reference})
		if err != nil {
			t.Fatal(err)
		}
		if m.W.Layers[0].Gate != nil || !m.Config.QKVBias || !m.Config.RopeNeox {
			t.Fatalf("config %+v, gate %v", m.Config, m.W.Layers[0].Gate)
		}
		got := teacherForced(t, m, tokens)
		m.Close()
		for p := range tokens {
			for i, w := range want[p] {
				if d := math.Abs(float64(got[p][i]) - w); d > 1e-3*(1+math.Abs(w)) {
					t.Fatalf("reference=%v pos %d logit %d: got %g, want %g", reference, p, i, got[p][i], w)
				}
			}
		}
	}
}

// toyReference is the forward pass written out plainly in float64 over the
// file's dequantized tensors: every position attends to all earlier ones.
func toyReference(t *testing.T, f *gguf.File, s synth.Shape, tokens []int32) [][]float64 {
	get := func(name string) []float64 {
		tt := f.Tensor(name)
		if tt == nil {
			t.Fatalf("tensor %s missing", name)
		}
		n := 1
		for _, d := range tt.Dims {
			n *= int(d)
		}
		out := make([]float32, n)
		if err := quant.Dequantize(tt.Type, tt.Data, out); err != nil {
			t.Fatal(err)
		}
		r := make([]float64, n)
		for i, v := range out {
			r[i] = float64(v)
		}
		return r
	}
	matvec := func(w, x []float64) []float64 {
		out := make([]float64, len(w)/len(x))
		for r := range out {
			for c, v := range x {
				out[r] += w[r*len(x)+c] * v
			}
		}
		return out
	}
	norm := func(x, w []float64) []float64 {
		var ss float64
		for _, v := range x {
			ss += v * v
		}
		inv := 1 / math.Sqrt(ss/float64(len(x))+1e-5)
		out := make([]float64, len(x))
		for i := range x {
			out[i] = x[i] * inv * w[i]
		}
		return out
	}
	add := func(x, y []float64) {
		for i := range x {
			x[i] += y[i]
		}
	}
	hd := s.HeadDim
	rope := func(x []float64, pos int) {
		for h := 0; h < len(x)/hd; h++ {
			v := x[h*hd : (h+1)*hd]
			for i := 0; i < hd/2; i++ {
				a := float64(pos) * math.Pow(10000, -2*float64(i)/float64(hd))
				x0, x1 := v[i], v[i+hd/2]
				v[i], v[i+hd/2] = x0*math.Cos(a)-x1*math.Sin(a), x0*math.Sin(a)+x1*math.Cos(a)
			}
		}
	}
	embd := get("token_embd.weight")
	d := s.Dim
	xs := make([][]float64, len(tokens))
	for p, tok := range tokens {
		xs[p] = append([]float64(nil), embd[int(tok)*d:(int(tok)+1)*d]...)
	}
	for l := 0; l < s.Layers; l++ {
		w := func(n string) []float64 { return get(arch.BlockName(l, n)) }
		wq, wk, wv, wo := w("attn_q.weight"), w("attn_k.weight"), w("attn_v.weight"), w("attn_output.weight")
		var ks, vs [][]float64
		for p := range tokens {
			xn := norm(xs[p], w("attn_norm.weight"))
			q, k, v := matvec(wq, xn), matvec(wk, xn), matvec(wv, xn)
			add(q, w("attn_q.bias"))
			add(k, w("attn_k.bias"))
			add(v, w("attn_v.bias"))
			rope(q, p)
			rope(k, p)
			ks, vs = append(ks, k), append(vs, v)
			att := make([]float64, len(q))
			for h := 0; h < s.Heads; h++ {
				kh := h / (s.Heads / s.KVHeads)
				sc := make([]float64, p+1)
				mx := math.Inf(-1)
				for j := range sc {
					for i := 0; i < hd; i++ {
						sc[j] += q[h*hd+i] * ks[j][kh*hd+i]
					}
					sc[j] /= math.Sqrt(float64(hd))
					mx = math.Max(mx, sc[j])
				}
				var sum float64
				for j := range sc {
					sc[j] = math.Exp(sc[j] - mx)
					sum += sc[j]
				}
				for j := range sc {
					for i := 0; i < hd; i++ {
						att[h*hd+i] += sc[j] / sum * vs[j][kh*hd+i]
					}
				}
			}
			add(xs[p], matvec(wo, att))
			u := matvec(w("ffn_up.weight"), norm(xs[p], w("ffn_norm.weight")))
			for i, v := range u {
				u[i] = v / (1 + math.Exp(-v))
			}
			add(xs[p], matvec(w("ffn_down.weight"), u))
		}
	}
	out := make([][]float64, len(tokens))
	for p := range tokens {
		out[p] = matvec(get("output.weight"), norm(xs[p], get("output_norm.weight")))
	}
	return out
}
