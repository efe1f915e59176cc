package model

import (
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"pagoda/kernels"
	"pagoda/quant"
	"pagoda/testutil"
)

// dequant returns a matrix as float64 rows.
func dequant(t *testing.T, m *kernels.Matrix) [][]float64 {
	t.Helper()
	out := make([][]float64, m.Rows)
	row := make([]float32, m.Cols)
	for r := range out {
		if err := quant.Dequantize(m.Type, m.Row(r), row); err != nil {
			t.Fatal(err)
		}
		out[r] = make([]float64, m.Cols)
		for c, v := range row {
			out[r][c] = float64(v)
		}
	}
	return out
}

func mv(w [][]float64, x []float64) []float64 {
	out := make([]float64, len(w))
	for r, row := range w {
		for c, v := range row {
			out[r] += v * x[c]
		}
	}
	return out
}

func rms64(x []float64, w []float32, eps float32) []float64 {
	var ss float64
	for _, v := range x {
		ss += v * v
	}
	s := 1 / math.Sqrt(ss/float64(len(x))+float64(eps))
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = v * s * float64(w[i])
	}
	return out
}

// rope64 rotates adjacent pairs (ggml's normal mode) of x at pos.
func rope64(x []float64, pos int, theta float64) {
	n := len(x)
	for i := 0; i < n/2; i++ {
		a := float64(pos) * math.Pow(theta, -2*float64(i)/float64(n))
		c, s := math.Cos(a), math.Sin(a)
		x0, x1 := x[2*i], x[2*i+1]
		x[2*i], x[2*i+1] = x0*c-x1*s, x0*s+x1*c
	}
}

// decompressedMLA is the textbook MLA layer in float64: per head, keys
// k_h = [KB_hᵀ·c | k_pe] and values v_h = VB_h·c decompressed from every
// position's latent, ordinary causal attention, output projection; it
// returns x + attn(x) for the T rows of x (positions 0..T-1).
func decompressedMLA(t *testing.T, m *Model, li int, x [][]float64) [][]float64 {
	c, l := &m.Config, &m.W.Layers[li]
	H, nope, rope, kvl, vh := c.NHead, c.QKNope, c.QKRope, c.KVLoRA, c.VHeadDim
	qk := nope + rope
	T := len(x)
	var q [][]float64
	kva := dequant(t, l.KVA)
	kb, vb := make([][][]float64, H), make([][][]float64, H)
	for h := range kb {
		kb[h], vb[h] = dequant(t, l.KB[h]), dequant(t, l.VB[h])
	}
	lat, kpe := make([][]float64, T), make([][]float64, T)
	for i := range x {
		xf := make([]float32, len(x[i]))
		for j, v := range x[i] {
			xf[j] = float32(v)
		}
		xn := rms64(x[i], l.AttnNorm, c.RMSEps)
		var qi []float64
		if l.QA != nil {
			qi = mv(dequant(t, l.QB), rms64(mv(dequant(t, l.QA), xn), l.QANorm, c.RMSEps))
		} else {
			qi = mv(dequant(t, l.Q), xn)
		}
		for h := 0; h < H; h++ {
			rope64(qi[h*qk+nope:(h+1)*qk], i, c.RopeTheta)
		}
		q = append(q, qi)
		a := mv(kva, xn)
		lat[i] = rms64(a[:kvl], l.KVANorm, c.RMSEps)
		kpe[i] = a[kvl:]
		rope64(kpe[i], i, c.RopeTheta)
	}
	wo := dequant(t, l.O)
	out := make([][]float64, T)
	for i := 0; i < T; i++ {
		cat := make([]float64, H*vh)
		for h := 0; h < H; h++ {
			sc := make([]float64, i+1)
			mx := math.Inf(-1)
			for j := 0; j <= i; j++ {
				var s float64
				for d := 0; d < nope; d++ {
					var k float64
					for r := 0; r < kvl; r++ {
						k += kb[h][r][d] * lat[j][r]
					}
					s += q[i][h*qk+d] * k
				}
				for d := 0; d < rope; d++ {
					s += q[i][h*qk+nope+d] * kpe[j][d]
				}
				sc[j] = s / math.Sqrt(float64(qk))
				mx = math.Max(mx, sc[j])
			}
			var sum float64
			for j := range sc {
				sc[j] = math.Exp(sc[j] - mx)
				sum += sc[j]
			}
			for j := range sc {
				v := mv(vb[h], lat[j])
				for d := range v {
					cat[h*vh+d] += sc[j] / sum * v[d]
				}
			}
		}
		o := mv(wo, cat)
		out[i] = make([]float64, len(x[i]))
		for d := range o {
			out[i][d] = x[i][d] + o[d]
		}
	}
	return out
}

// TestMLAAbsorbedEqualsDecompressed holds the absorbed MLA layer (queries
// projected into the latent space, outputs read from the latent-only
// cache), run as a prefill and as one-token decode steps, to the
// decompressed computation, on both golden MLA layouts (low-rank query and
// plain attn_q), and checks that files with the combined attn_kv_b load
// the same per-head matrices.
func TestMLAAbsorbedEqualsDecompressed(t *testing.T) {
	dir := testutil.Shared(t, "golden")
	for _, name := range []string{"g-deepseek2.F32.gguf", "g-deepseek2-lite.F32.gguf"} {
		t.Run(name, func(t *testing.T) {
			for _, ref := range []bool{true, false} {
				m, err := Open(filepath.Join(dir, "models", name), Options{Threads: 2, Reference: ref})
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				c := &m.Config
				const T = 12
				rng := rand.New(rand.NewPCG(1, 2))
				x := make([][]float64, T)
				for i := range x {
					x[i] = make([]float64, c.NEmbd)
					for j := range x[i] {
						x[i][j] = float64(float32(rng.NormFloat64()))
					}
				}
				for li := 0; li < c.NLayer; li++ {
					want := decompressedMLA(t, m, li, x)
					prefill := runMLA(m, li, x, T)
					decode := runMLA(m, li, x, 1)
					for i := range want {
						for d := range want[i] {
							for _, got := range []float32{prefill[i][d], decode[i][d]} {
								if math.Abs(float64(got)-want[i][d]) > 2e-5*(1+math.Abs(want[i][d])) {
									t.Fatalf("reference %v layer %d row %d dim %d: absorbed %g, decompressed %g", ref, li, i, d, got, want[i][d])
								}
							}
						}
					}
				}
			}
			// Older files store attn_kv_b: rebuild it from the split form
			// and check splitKVB recovers the same KB and VB.
			m, err := Open(filepath.Join(dir, "models", name), Options{Threads: 1, Reference: true})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			c, l := &m.Config, &m.W.Layers[1]
			nope, vh, kvl := c.QKNope, c.VHeadDim, c.KVLoRA
			kvb := make([]float32, c.NHead*(nope+vh)*kvl)
			for h := 0; h < c.NHead; h++ {
				kb, vb := dequant(t, l.KB[h]), dequant(t, l.VB[h])
				for j := 0; j < nope; j++ {
					for r := 0; r < kvl; r++ {
						kvb[(h*(nope+vh)+j)*kvl+r] = float32(kb[r][j])
					}
				}
				for i := 0; i < vh; i++ {
					for r := 0; r < kvl; r++ {
						kvb[(h*(nope+vh)+nope+i)*kvl+r] = float32(vb[i][r])
					}
				}
			}
			wantKB, wantVB := l.KB, l.VB
			l2 := Layer{KVB: f32Matrix(kvb, c.NHead*(nope+vh), kvl)}
			if err := splitKVB(nil, c, 1, &l2); err != nil {
				t.Fatal(err)
			}
			for h := 0; h < c.NHead; h++ {
				if string(l2.KB[h].Data) != string(wantKB[h].Data) || string(l2.VB[h].Data) != string(wantVB[h].Data) {
					t.Fatalf("head %d: attn_kv_b split differs from attn_k_b/attn_v_b", h)
				}
			}
		})
	}
}

// runMLA runs layer li's MLA part over x through a fresh flat cache, step
// rows at a time (T: one prefill; 1: decode steps), returning x + attn(x).
func runMLA(m *Model, li int, x [][]float64, step int) [][]float32 {
	d := m.Config.NEmbd
	kv := m.NewFlatCache(1, len(x))
	out := make([][]float32, len(x))
	for lo := 0; lo < len(x); lo += step {
		hi := min(lo+step, len(x))
		b := &Batch{}
		for i := lo; i < hi; i++ {
			b.Tokens, b.Pos, b.Seq = append(b.Tokens, 0), append(b.Pos, int32(i)), append(b.Seq, 0)
		}
		if err := kv.Begin(b); err != nil {
			panic(err)
		}
		n := hi - lo
		s := &m.buf
		s.x, s.xn, s.o = grow(s.x, n*d), grow(s.xn, n*d), grow(s.o, n*d)
		for i := lo; i < hi; i++ {
			for j, v := range x[i] {
				s.x[(i-lo)*d+j] = float32(v)
			}
		}
		s.pieces = attnPieces(b, 0)
		mlaAttention{}.forward(m, li, b, kv)
		for i := lo; i < hi; i++ {
			out[i] = append([]float32(nil), s.x[(i-lo)*d:(i-lo+1)*d]...)
		}
	}
	return out
}
