package kvcache

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"pagoda/model"
)

// miniRef merges one token's rows of a pair as MiniCache says, in float64:
// per head the magnitudes, the SLERP of the directions; unmerged (ok
// false) when the mean cosine is below retain.
func miniRef(a, b []float32, heads, dim int, t, retain float64) (ra, rb []float32, ok bool) {
	ra, rb = make([]float32, len(a)), make([]float32, len(b))
	var cos float64
	for h := 0; h < heads; h++ {
		var na, nb, c float64
		for k := h * dim; k < (h+1)*dim; k++ {
			na += float64(a[k]) * float64(a[k])
			nb += float64(b[k]) * float64(b[k])
			c += float64(a[k]) * float64(b[k])
		}
		na, nb = math.Sqrt(na), math.Sqrt(nb)
		c /= na * nb
		cos += c / float64(heads)
		th := math.Acos(max(-1, min(1, c)))
		wa, wb := math.Sin((1-t)*th)/math.Sin(th), math.Sin(t*th)/math.Sin(th)
		e := make([]float64, dim)
		var n float64
		for k := range e {
			e[k] = wa*float64(a[h*dim+k])/na + wb*float64(b[h*dim+k])/nb
			n += e[k] * e[k]
		}
		for k := range e {
			ra[h*dim+k], rb[h*dim+k] = float32(na*e[k]/math.Sqrt(n)), float32(nb*e[k]/math.Sqrt(n))
		}
	}
	if cos < retain {
		return a, b, false
	}
	return ra, rb, true
}

// TestMiniCacheMatchesReference decodes through a merged layer pair and
// holds both layers' attention to the plain statement: each earlier token
// reconstructed from shared direction and own magnitude, or exact when
// kept unmerged while the page has spare rows; the first layer reads the
// current token exact. The pair's block is smaller than two layers'.
func TestMiniCacheMatchesReference(t *testing.T) {
	const bs, hd, nkv, nh, n, spare = 4, 8, 2, 4, 40, 1
	const T, retain = 0.5, 0.2
	p := model.AttnParams{NHead: nh, NKVHead: nkv, HeadDim: hd, Scale: 0.3}
	gs := MiniCacheGroups(2, nkv, hd, 0, F32, T, retain, spare)
	c, err := New(Config{Groups: gs, BlockSize: bs, NumBlocks: 12})
	if err != nil {
		t.Fatal(err)
	}
	plain := int64(2 * 2 * bs * nkv * hd * 4)
	pair := int64(2 * (bs*(nkv*hd*4+8*nkv+2) + spare*nkv*hd*4))
	if got := c.Config().BlockBytes(); got != pair || got >= plain {
		t.Fatalf("pair block %d bytes, want %d (plain %d)", got, pair, plain)
	}
	r := rand.New(rand.NewPCG(6, 6))
	rec := [2][2][][]float32{} // [layer][k or v][pos]
	kept := 0
	c.Allocate(0, nil, 0, n)
	perPage := map[int]int{}
	for pos := 0; pos < n; pos++ {
		oneRow(c, 0, int32(pos))
		var raw [2][2][]float32
		for l := 0; l < 2; l++ {
			for kv := 0; kv < 2; kv++ {
				raw[l][kv] = randRow(r, nkv*hd)
				if l == 1 && pos%3 == 0 {
					// Nearly the first layer's direction: merges cleanly.
					for i := range raw[1][kv] {
						raw[1][kv][i] = 2*raw[0][kv][i] + 0.1*raw[1][kv][i]
					}
				}
			}
		}
		q0, q1 := randRow(r, nh*hd), randRow(r, nh*hd)
		c.Store(0, 0, raw[0][0], raw[0][1])
		got := make([]float32, nh*hd)
		c.Attend(0, 0, 1, q0, got, p)
		idx := make([]int, pos+1)
		for i := range idx {
			idx[i] = i
		}
		want := refAttend(append(rec[0][0][:pos:pos], raw[0][0]), append(rec[0][1][:pos:pos], raw[0][1]), idx, q0, nh, nkv, hd, hd, p.Scale)
		closeTo(t, fmt.Sprintf("first layer at %d", pos), got, want, 1e-5)
		// The pair merges K and V each on its own.
		for kv := 0; kv < 2; kv++ {
			ra, rb, ok := miniRef(raw[0][kv], raw[1][kv], nkv, hd, T, retain)
			if !ok && kv == 0 {
				kept++
			}
			_ = rb
			rec[0][kv], rec[1][kv] = append(rec[0][kv], ra), append(rec[1][kv], rb)
		}
		// A page holds `spare` unmerged tokens; the rest merge anyway.
		for kv := 0; kv < 2; kv++ {
			_, _, ok := miniRef(raw[0][kv], raw[1][kv], nkv, hd, T, retain)
			key := pos/bs*2 + kv
			if !ok {
				if perPage[key] < spare {
					perPage[key]++
				} else {
					ra, rb, _ := miniRef(raw[0][kv], raw[1][kv], nkv, hd, T, -2)
					rec[0][kv][pos], rec[1][kv][pos] = ra, rb
				}
			}
		}
		c.Store(1, 0, raw[1][0], raw[1][1])
		c.Attend(1, 0, 1, q1, got, p)
		want = refAttend(rec[1][0], rec[1][1], idx, q1, nh, nkv, hd, hd, p.Scale)
		closeTo(t, fmt.Sprintf("second layer at %d", pos), got, want, 1e-5)
	}
	if kept == 0 || kept == n {
		t.Fatalf("%d of %d tokens over the retention threshold: the test does not exercise both paths", kept, n)
	}
	c.Free(0)
	mustCheck(t, c)
}

// TestMiniCacheQuality merges stories260K's layers from a start layer on
// and measures the logits against the full cache, by start layer and
// retention threshold, with the bytes a block takes.
func TestMiniCacheQuality(t *testing.T) {
	if os.Getenv("PAGODA_KVPOL_QUALITY") == "" {
		t.Skip("the quality table runs with PAGODA_KVPOL_QUALITY=1")
	}
	m := openStories(t)
	c := &m.Config
	var corpora [][]int32
	for s := range 3 {
		corpora = append(corpora, sampleCorpus(t, m, 512, uint64(s)))
	}
	full := storiesConfig(m, 512, nil).BlockBytes()
	table := fmt.Sprintf("%-34s %9s %8s %7s %8s\n", "minicache (stories260K, 5 layers)", "K+V bytes", "KL", "top-1", "ppl")
	for _, from := range []int{3, 2, 1, 0} {
		for _, retain := range []float64{-2, 0.5, 0.8} {
			var sum quality
			var bytes int64
			for _, toks := range corpora {
				cfg := storiesConfig(m, len(toks), nil)
				cfg.Groups = MiniCacheGroups(c.NLayer, c.NKVHead, c.HeadDim, from, F32, 0.5, retain, 4)
				bytes = cfg.BlockBytes()
				ref := teacherForced(t, m, FullPolicy{}, toks, 1)
				q := compareRows(ref, teacherForcedConfig(t, m, cfg, toks, 1), toks, 1)
				sum.kl, sum.top1, sum.ppl = sum.kl+q.kl/3, sum.top1+q.top1/3, sum.ppl+q.ppl/3
			}
			name := fmt.Sprintf("from layer %d, retain cos<%g", from, retain)
			if retain < -1 {
				name = fmt.Sprintf("from layer %d, merge all", from)
			}
			table += fmt.Sprintf("%-34s %8.0f%% %8.4f %7.3f %8.3f\n", name, 100*float64(bytes)/float64(full), sum.kl, sum.top1, sum.ppl)
		}
	}
	t.Logf("\n%s", table)
}
