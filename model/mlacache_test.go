package model_test

import (
	"math"
	"path/filepath"
	"runtime"
	"testing"

	"pagoda/kvcache"
	"pagoda/model"
	"pagoda/testutil"
)

// TestMLALatentCache runs the MLA golden model through the paged cache set
// up as the engine sets it up for MLA (one group, K row = latent + rope
// key, no V pages) and checks that (1) the pool's storage, measured as the
// heap it allocates, is NLayer × (kv_lora_rank + qk_rope) values per
// token, half of what the same rows stored as K and V would take and far
// below the MHA equivalent, and (2) prefill plus decode through it give the
// flat cache's logits.
func TestMLALatentCache(t *testing.T) {
	dir := testutil.Shared(t, "golden")
	m, err := model.Open(filepath.Join(dir, "models", "g-deepseek2.F32.gguf"), model.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	c := &m.Config
	nkv, kd, vd := c.KVShape()
	if nkv != 1 || kd != 80 || vd != 0 {
		t.Fatalf("KVShape = %d, %d, %d; want 1, 80 (kv_lora 64 + rope 16), 0", nkv, kd, vd)
	}
	layers := make([]int, c.NLayer)
	for i := range layers {
		layers[i] = i
	}
	cfg := kvcache.Config{NLayer: c.NLayer, BlockSize: 16, NumBlocks: 2048, DType: kvcache.F32, Ops: m.Ops(),
		Groups: []kvcache.GroupSpec{{Layers: layers, NKVHead: nkv, KDim: kd}}}
	formula := int64(c.NLayer * (c.KVLoRA + c.QKRope) * 4)
	if got := cfg.BlockBytes() / 16; got != formula {
		t.Errorf("block bytes per token %d, want %d", got, formula)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	kv, err := kvcache.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	defer kv.Close()
	// The pages are mapped outside the Go heap; what the heap gained is
	// the bookkeeping.
	perToken := float64(int64(after.HeapAlloc-before.HeapAlloc)+kv.MappedBytes()) / float64(cfg.NumBlocks*16)
	mha := float64(c.NLayer * c.NHead * (c.QKNope + c.QKRope + c.VHeadDim) * 4)
	t.Logf("measured %.1f bytes/token (formula %d; K+V rows %d; MHA equivalent %.0f)", perToken, formula, 2*formula, mha)
	if math.Abs(perToken-float64(formula)) > 0.03*float64(formula) {
		t.Errorf("pool holds %.1f bytes per token, want %d (latent + rope key only)", perToken, formula)
	}

	g := readGolden(t, filepath.Join(dir, "g-deepseek2.F32.p0.json.gz"))
	toks := g.Tokens[:30]
	want := teacherForced(t, m, toks)
	const prefill = 20
	if !kv.Allocate(0, nil, 0, prefill) {
		t.Fatal("no room")
	}
	b := &model.Batch{Tokens: toks[:prefill], Pos: make([]int32, prefill), Seq: make([]int32, prefill), Logits: make([]bool, prefill)}
	for i := range b.Pos {
		b.Pos[i], b.Logits[i] = int32(i), true
	}
	got, err := m.Forward(b, kv)
	if err != nil {
		t.Fatal(err)
	}
	V := c.VocabSize
	check := func(pos int, row []float32) {
		for j, v := range row {
			if math.Abs(float64(v-want[pos][j])) > 1e-4 {
				t.Fatalf("position %d logit %d: paged %g, flat %g", pos, j, v, want[pos][j])
			}
		}
	}
	for i := 0; i < prefill; i++ {
		check(i, got[i*V:(i+1)*V])
	}
	for p := prefill; p < len(toks); p++ {
		if !kv.Allocate(0, nil, p, p+1) {
			t.Fatal("no room")
		}
		got, err := m.Forward(&model.Batch{Tokens: toks[p : p+1], Pos: []int32{int32(p)}, Seq: []int32{0}}, kv)
		if err != nil {
			t.Fatal(err)
		}
		check(p, got)
	}
}
