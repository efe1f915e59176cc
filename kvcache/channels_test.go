package kvcache

import (
	"fmt"
	"math/rand/v2"
	"os"
	"testing"

	"pagoda/model"
)

// TestChannelFormatMatchesReference: attention through pruned keys equals
// dense attention over keys with the pruned channels zeroed (the query's
// then contribute nothing), keeping every channel is the base format bit
// for bit, and a block takes r/dim of the key bytes.
func TestChannelFormatMatchesReference(t *testing.T) {
	const bs, hd, nkv, nh, n = 4, 8, 2, 4, 30
	p := model.AttnParams{NHead: nh, NKVHead: nkv, HeadDim: hd, Scale: 0.3}
	for _, keep := range [][][]int{{{0, 1, 2, 3, 4, 5, 6, 7}, {0, 1, 2, 3, 4, 5, 6, 7}}, {{1, 4, 6}, {0, 2, 7}}, {{5}, {3}}} {
		f := &ChannelFormat{Base: F32, Keep: keep}
		c, err := New(Config{NLayer: 1, NKVHead: nkv, HeadDim: hd, BlockSize: bs, NumBlocks: 10, KFormat: f, VFormat: F32})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := c.Config().BlockBytes(), int64(bs*nkv*(len(keep[0])+hd)*4); got != want {
			t.Fatalf("%v: block of %d bytes, want %d", f, got, want)
		}
		r := rand.New(rand.NewPCG(3, uint64(len(keep[0]))))
		var keys, vals [][]float32
		c.Allocate(0, nil, 0, n)
		for pos := 0; pos < n; pos++ {
			k, v := randRow(r, nkv*hd), randRow(r, nkv*hd)
			storeTok(c, 0, 0, int32(pos), k, v)
			z := make([]float32, nkv*hd)
			for h := range keep {
				for _, ch := range keep[h] {
					z[h*hd+ch] = k[h*hd+ch]
				}
			}
			back := make([]float32, nkv*hd)
			c.layers[0].k.Get(int(c.Table(0)[pos/bs]), pos%bs, back)
			closeTo(t, "get", back, z, 0)
			keys, vals = append(keys, z), append(vals, v)
			q := randRow(r, nh*hd)
			got := make([]float32, nh*hd)
			attendTok(c, 0, 0, int32(pos+1), q, got, p)
			idx := make([]int, pos+1)
			for i := range idx {
				idx[i] = i
			}
			closeTo(t, f.String(), got, refAttend(keys, vals, idx, q, nh, nkv, hd, hd, p.Scale), 1e-5)
		}
	}
	if _, err := New(Config{NLayer: 1, NKVHead: 1, HeadDim: 8, NumBlocks: 2, KFormat: &ChannelFormat{Base: F32, Keep: [][]int{{3, 1}}}}); err == nil {
		t.Fatal("unsorted channels accepted")
	}
}

// TestChannelReductionQuality calibrates the kept key channels of
// stories260K on one sampled text (ThinK's ‖Q_i‖·‖K_i‖ per layer and KV
// head) and measures others against the full cache, by channels kept.
func TestChannelReductionQuality(t *testing.T) {
	if os.Getenv("PAGODA_KVPOL_QUALITY") == "" {
		t.Skip("the quality table runs with PAGODA_KVPOL_QUALITY=1")
	}
	m := openStories(t)
	c := &m.Config
	calib := sampleCorpus(t, m, 512, 100)
	stats := NewChannelStats(c.NLayer, c.NKVHead, c.HeadDim)
	cache, err := New(storiesConfig(m, 512, stats))
	if err != nil {
		t.Fatal(err)
	}
	cache.Allocate(0, nil, 0, 512)
	b := &model.Batch{}
	for i, tok := range calib {
		b.Tokens, b.Pos, b.Seq = append(b.Tokens, tok), append(b.Pos, int32(i)), append(b.Seq, 0)
	}
	if _, err := m.Forward(b, cache); err != nil {
		t.Fatal(err)
	}
	if err := stats.Keys(cache, 0, 512); err != nil {
		t.Fatal(err)
	}
	var corpora [][]int32
	for s := range 3 {
		corpora = append(corpora, sampleCorpus(t, m, 512, uint64(s)))
	}
	table := fmt.Sprintf("%-28s %9s %8s %7s %8s\n", "key channels (of 8 per head)", "K+V bytes", "KL", "top-1", "ppl")
	for _, r := range []int{8, 6, 4, 2} {
		keep := stats.Keep(r)
		var sum quality
		var bytes int64
		for _, toks := range corpora {
			cfg := storiesConfig(m, len(toks), nil)
			for l := 0; l < c.NLayer; l++ {
				cfg.Groups = append(cfg.Groups, GroupSpec{Layers: []int{l}, NKVHead: c.NKVHead, KDim: c.HeadDim, VDim: c.HeadDim,
					KFormat: &ChannelFormat{Base: F32, Keep: keep[l]}})
			}
			bytes = cfg.BlockBytes()
			full := teacherForced(t, m, FullPolicy{}, toks, 1)
			q := compareRows(full, teacherForcedConfig(t, m, cfg, toks, 1), toks, 1)
			sum.kl, sum.top1, sum.ppl = sum.kl+q.kl/3, sum.top1+q.top1/3, sum.ppl+q.ppl/3
		}
		full := storiesConfig(m, 512, nil).BlockBytes()
		table += fmt.Sprintf("%-28d %8.0f%% %8.4f %7.3f %8.3f\n", r, 100*float64(bytes)/float64(full), sum.kl, sum.top1, sum.ppl)
		if r == c.HeadDim && sum.kl > 1e-9 {
			t.Errorf("keeping every channel changes the logits: KL %g", sum.kl)
		}
	}
	t.Logf("\n%s", table)
}
