package kvcache

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"

	"pagoda/model"
)

// TestSnapKVMatchesReference prefills a prompt in chunks, then decodes,
// holding the cache to SnapKV stated plainly: votes of the last window
// queries (dense softmax over their causal prefix, summed over the GQA
// group) for the positions before the window, zero-padded sum pooling,
// the top capacity-window kept per KV head, the window and all decoded
// tokens kept.
func TestSnapKVMatchesReference(t *testing.T) {
	const bs, hd, nkv, nh, P, W, K, capacity, n = 4, 8, 2, 4, 30, 8, 3, 14, 45
	p := model.AttnParams{NHead: nh, NKVHead: nkv, HeadDim: hd, Scale: 0.5}
	c, err := New(Config{NLayer: 1, NKVHead: nkv, HeadDim: hd, BlockSize: bs, NumBlocks: 20, DType: F32, Policy: NewSnapKV(capacity, W, K)})
	if err != nil {
		t.Fatal(err)
	}
	c.NotePrompt(1, P)
	r := rand.New(rand.NewPCG(4, 4))
	var keys, vals, qs [][]float32
	for pos := 0; pos < n; pos++ {
		keys, vals, qs = append(keys, randRow(r, nkv*hd)), append(vals, randRow(r, nkv*hd)), append(qs, randRow(r, nh*hd))
	}
	toks := make([]int32, n)
	// The prompt in chunks of 13, 13 and 4: the window spans two chunks.
	for _, ch := range [][2]int{{0, 13}, {13, 26}, {26, P}} {
		c.Allocate(1, nil, ch[0], ch[1])
		b := &model.Batch{}
		var q []float32
		for pos := ch[0]; pos < ch[1]; pos++ {
			b.Tokens, b.Pos, b.Seq = append(b.Tokens, 0), append(b.Pos, int32(pos)), append(b.Seq, 1)
			q = append(q, qs[pos]...)
		}
		if err := c.Begin(b); err != nil {
			t.Fatal(err)
		}
		for i := range b.Pos {
			c.Store(0, i, keys[ch[0]+i], vals[ch[0]+i])
		}
		out := make([]float32, len(q))
		for lo := 0; lo < len(b.Pos); lo += 5 { // pieces, as the model splits
			hi := min(lo+5, len(b.Pos))
			c.Attend(0, lo, hi, q[lo*nh*hd:hi*nh*hd], out[lo*nh*hd:hi*nh*hd], p)
		}
		c.Commit(1, toks, ch[1], 0)
	}
	// The reference's kept sets.
	kept := make([][]int, nkv)
	for kh := 0; kh < nkv; kh++ {
		votes := make([]float64, P-W)
		for pos := P - W; pos < P; pos++ {
			for h := kh * (nh / nkv); h < (kh+1)*(nh/nkv); h++ {
				s := make([]float64, pos+1)
				mx := math.Inf(-1)
				for tp := range s {
					for j := 0; j < hd; j++ {
						s[tp] += float64(qs[pos][h*hd+j]) * float64(keys[tp][kh*hd+j])
					}
					s[tp] *= float64(p.Scale)
					mx = math.Max(mx, s[tp])
				}
				var z float64
				for tp := range s {
					s[tp] = math.Exp(s[tp] - mx)
					z += s[tp]
				}
				for tp := 0; tp < P-W; tp++ {
					votes[tp] += s[tp] / z
				}
			}
		}
		type cand struct {
			t int
			v float64
		}
		var cs []cand
		for tp := range votes {
			var v float64
			for d := -K / 2; d <= K/2; d++ {
				if u := tp + d; u >= 0 && u < len(votes) {
					v += votes[u]
				}
			}
			cs = append(cs, cand{tp, v})
		}
		sort.Slice(cs, func(i, j int) bool {
			if cs[i].v != cs[j].v {
				return cs[i].v > cs[j].v
			}
			return cs[i].t > cs[j].t
		})
		keep := map[int]bool{}
		for _, x := range cs[:capacity-W] {
			keep[x.t] = true
		}
		for tp := 0; tp < n; tp++ {
			if keep[tp] || tp >= P-W {
				kept[kh] = append(kept[kh], tp)
			}
		}
	}
	for pos := P; pos < n; pos++ {
		c.Allocate(1, nil, pos, pos+1)
		storeTok(c, 0, 1, int32(pos), keys[pos], vals[pos])
		got := make([]float32, nh*hd)
		c.Attend(0, 0, 1, qs[pos], got, p)
		for kh := 0; kh < nkv; kh++ {
			var vis []int
			for _, tp := range kept[kh] {
				if tp <= pos {
					vis = append(vis, tp)
				}
			}
			want := refAttend(keys, vals, vis, qs[pos], nh, nkv, hd, hd, p.Scale)
			lo, hi := kh*(nh/nkv)*hd, (kh+1)*(nh/nkv)*hd
			closeTo(t, "snapkv head", got[lo:hi], want[lo:hi], 1e-5)
		}
		c.Commit(1, toks, pos+1, 0)
		mustCheck(t, c)
	}
	c.Free(1)
	mustCheck(t, c)
	if c.Usage().Used != 0 {
		t.Fatal("leak")
	}
}
