package engine

import (
	"strings"
	"testing"

	"pagoda/kvcache"
)

// TestQuantizedKVBudget: with a byte budget, a q8_0 or q4_0 cache costs
// 8.5/16 or 4.5/16 of f16's bytes a token and so holds that many more
// blocks in the same budget.
func TestQuantizedKVBudget(t *testing.T) {
	perTok := func(k, v kvcache.Format) (int64, int) {
		cfg := fakeConfig()
		cfg.NKVHead, cfg.HeadDim, cfg.KVBytes = 2, 64, 1<<20
		cfg.KVDType, cfg.KVFormatK, cfg.KVFormatV = kvcache.F16, k, v
		e, err := New(&fakeModel{}, newFakeTok(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		kc := e.kv.Config()
		return kc.BlockBytes() / int64(kc.BlockSize), e.kv.Pool().NumBlocks()
	}
	f16, n16 := perTok(nil, nil)
	for _, c := range []struct {
		k, v      kvcache.Format
		num, den  int64
		minBlocks int
	}{{kvcache.Q8_0, kvcache.Q8_0, 85, 160, n16 * 16 / 9}, {kvcache.Q4_0, kvcache.Q4_0, 45, 160, n16 * 3}, {kvcache.Q8_0, nil, 245, 320, n16 * 5 / 4}} {
		got, n := perTok(c.k, c.v)
		if want := f16 * c.num / c.den; got != want {
			t.Errorf("K %v V %v: %d bytes a token, want %d (f16 %d)", c.k, c.v, got, want, f16)
		}
		if n < c.minBlocks {
			t.Errorf("K %v V %v: %d blocks in the budget, f16 %d", c.k, c.v, n, n16)
		}
	}
}

// TestQuantizedKVHeadDim: stories260K's heads are 8 wide, so a 32-element
// block format cannot hold them; the engine says so at construction.
func TestQuantizedKVHeadDim(t *testing.T) {
	m := openStories(t)
	c := m.Config
	cfg := modelConfig(m)
	cfg.KVFormatK = kvcache.Q8_0
	_, err := New(m, m.Tokenizer(), cfg)
	if err == nil || !strings.Contains(err.Error(), "multiples of 32") {
		t.Fatalf("q8_0 keys with head dim %d: %v", c.HeadDim, err)
	}
}
