package engine

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"pagoda/kvcache"
	"pagoda/model"
	"pagoda/testutil"
)

// TestMLAAndMoEModels serves the MLA + MoE and the MoE golden models
// through the engine (paged latent-only cache for MLA, chunked prefill,
// several requests at once) and gets the flat cache's greedy tokens; the
// MLA model's pool holds kv_lora_rank + rope values per token and layer.
func TestMLAAndMoEModels(t *testing.T) {
	dir := testutil.Shared(t, "golden")
	for _, name := range []string{"g-deepseek2.F32.gguf", "g-qwen2moe.F32.gguf"} {
		t.Run(name, func(t *testing.T) {
			m, err := model.Open(filepath.Join(dir, "models", name), model.Options{Threads: 2})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			cfg := ModelConfig(m, name)
			cfg.KVDType, cfg.BlockSize, cfg.KVBlocks, cfg.MaxNumBatchedTokens = kvcache.F32, 8, 64, 10
			if m.Config.MLA {
				// Sinks would rotate the whole latent row as one head.
				sc := cfg
				sc.KVPolicy = kvcache.StreamingPolicy{Sinks: 4, Window: 16}
				if _, err := New(m, m.Tokenizer(), sc); err == nil || !strings.Contains(err.Error(), "rotary") {
					t.Errorf("streaming over MLA's latent cache: %v", err)
				}
			}
			e, err := New(m, m.Tokenizer(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			c := &m.Config
			perTok := e.kv.Config().BlockBytes() / 8
			if c.MLA {
				if want := int64(c.NLayer * (c.KVLoRA + c.QKRope) * 4); !cfg.KVLatent || perTok != want {
					t.Errorf("MLA pool: %d bytes per token (latent %v), want %d", perTok, cfg.KVLatent, want)
				}
			} else if want := int64(c.NLayer * 2 * c.NKVHead * c.HeadDim * 4); cfg.KVLatent || perTok != want {
				t.Errorf("pool: %d bytes per token, want %d", perTok, want)
			}
			e.Start()
			defer e.Stop(context.Background())
			prompts := [][]int32{{1, 45, 67, 89, 120, 33, 250, 17, 9, 301, 77, 5}, {1, 400, 401, 402}, {1, 45, 67, 89, 120, 33, 12}}
			// All submitted before any is read: they share steps (events
			// wait in each request's outbox meanwhile).
			var chs []<-chan Event
			for _, p := range prompts {
				ch, err := e.Submit(context.Background(), &Request{Prompt: p, MaxTokens: 12, IgnoreEOS: true})
				if err != nil {
					t.Fatal(err)
				}
				chs = append(chs, ch)
			}
			res := make([]result, len(prompts))
			for i, ch := range chs {
				res[i] = collect(t, ch, 1)
			}
			for i, p := range prompts {
				if want := flatGreedy(t, m, p, 12); fmt.Sprint(want) != fmt.Sprint(res[i].tokens[0]) {
					t.Errorf("request %d: engine %v, flat cache %v", i, res[i].tokens[0], want)
				}
			}
		})
	}
}
