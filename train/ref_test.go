package train

import "math"

// refForward is the model in float64, written as plainly as possible (no
// saved activations, no threads), for checking the float32 trainer: it
// returns the mean cross-entropy (0 without targets) and the logits.
func refForward(c Config, params []float64, tokens, targets []int32, B, T int) (float64, [][]float64) {
	ts := c.Tensors()
	byName := map[string][]float64{}
	for _, t := range ts {
		byName[t.Name] = params[t.Off : t.Off+t.Len]
	}
	D, H, KV, hd := c.Dim, c.Heads, c.KVHeads, c.HeadDim
	mat := func(w []float64, x []float64, out int) []float64 {
		in := len(x)
		y := make([]float64, out)
		for o := range y {
			for i := 0; i < in; i++ {
				y[o] += w[o*in+i] * x[i]
			}
		}
		return y
	}
	norm := func(x, w []float64) []float64 {
		var ss float64
		for _, v := range x {
			ss += v * v
		}
		r := 1 / math.Sqrt(ss/float64(len(x))+float64(c.RMSEps))
		y := make([]float64, len(x))
		for i := range x {
			y[i] = x[i] * r * w[i]
		}
		return y
	}
	freqs := c.freqs()
	rope := func(x []float64, pos int) {
		for i, f := range freqs {
			s, co := math.Sincos(float64(pos) * float64(f))
			x0, x1 := x[2*i], x[2*i+1]
			x[2*i], x[2*i+1] = x0*co-x1*s, x0*s+x1*co
		}
	}
	var loss float64
	var logits [][]float64
	for b := 0; b < B; b++ {
		xs := make([][]float64, T)
		for t := range xs {
			tok := int(tokens[b*T+t])
			xs[t] = append([]float64(nil), byName["token_embd.weight"][tok*D:(tok+1)*D]...)
		}
		for l := 0; l < c.Layers; l++ {
			g := func(s string) []float64 { return byName["blk."+itoa(l)+"."+s+".weight"] }
			qs, ks, vs := make([][]float64, T), make([][]float64, T), make([][]float64, T)
			for t := range xs {
				xn := norm(xs[t], g("attn_norm"))
				qs[t], ks[t], vs[t] = mat(g("attn_q"), xn, H*hd), mat(g("attn_k"), xn, KV*hd), mat(g("attn_v"), xn, KV*hd)
				for h := 0; h < H; h++ {
					rope(qs[t][h*hd:(h+1)*hd], t)
				}
				for h := 0; h < KV; h++ {
					rope(ks[t][h*hd:(h+1)*hd], t)
				}
			}
			for t := range xs {
				att := make([]float64, H*hd)
				for h := 0; h < H; h++ {
					kh := h / (H / KV)
					s := make([]float64, t+1)
					mx := math.Inf(-1)
					for u := 0; u <= t; u++ {
						for i := 0; i < hd; i++ {
							s[u] += qs[t][h*hd+i] * ks[u][kh*hd+i]
						}
						s[u] /= math.Sqrt(float64(hd))
						mx = math.Max(mx, s[u])
					}
					var sum float64
					for u := range s {
						s[u] = math.Exp(s[u] - mx)
						sum += s[u]
					}
					for u := range s {
						for i := 0; i < hd; i++ {
							att[h*hd+i] += s[u] / sum * vs[u][kh*hd+i]
						}
					}
				}
				o := mat(g("attn_output"), att, D)
				for i := range o {
					xs[t][i] += o[i]
				}
				xn := norm(xs[t], g("ffn_norm"))
				gt, up := mat(g("ffn_gate"), xn, c.FFN), mat(g("ffn_up"), xn, c.FFN)
				for i := range gt {
					gt[i] = gt[i] / (1 + math.Exp(-gt[i])) * up[i]
				}
				d := mat(g("ffn_down"), gt, D)
				for i := range d {
					xs[t][i] += d[i]
				}
			}
		}
		out := byName["output.weight"]
		if c.Tied {
			out = byName["token_embd.weight"]
		}
		for t := range xs {
			z := mat(out, norm(xs[t], byName["output_norm.weight"]), c.Vocab)
			logits = append(logits, z)
			if targets != nil {
				mx := math.Inf(-1)
				for _, v := range z {
					mx = math.Max(mx, v)
				}
				var s float64
				for _, v := range z {
					s += math.Exp(v - mx)
				}
				loss += mx + math.Log(s) - z[targets[b*T+t]]
			}
		}
	}
	return loss / float64(B*T), logits
}

func itoa(i int) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}
