package engine

import (
	"context"
	"testing"
	"time"

	"pagoda/kvcache"
)

// TestBlocks takes the block map while a request runs (the loop answers
// between steps) and after Stop (read directly), and checks it against
// the KV usage the engine publishes.
func TestBlocks(t *testing.T) {
	cfg := fakeConfig()
	cfg.KVBlocks = 32
	e := startEngine(t, &fakeModel{check: true}, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := e.Submit(ctx, &Request{Prompt: []int32{4, 5, 6, 7, 8, 9, 10, 11, 12}, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	<-ch
	bctx, bcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer bcancel()
	m, err := e.Blocks(bctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.State) != 32 || len(m.Owner) != 32 || m.BlockSize != e.kv.BlockSize() {
		t.Fatalf("map of %d/%d blocks, block size %d", len(m.State), len(m.Owner), m.BlockSize)
	}
	held, owners := 0, map[int32]bool{}
	for i, s := range m.State {
		if s == kvcache.BlockUsed || s == kvcache.BlockShared {
			held++
			owners[m.Owner[i]] = true
		}
	}
	if held == 0 || len(owners) != 1 || owners[-1] {
		t.Fatalf("running request: %d held blocks, owners %v", held, owners)
	}
	cancel()
	for range ch {
	}
	if err := e.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	m, err = e.Blocks(bctx)
	if err != nil {
		t.Fatal(err)
	}
	st := e.Stats()
	free := 0
	for _, s := range m.State {
		if s == kvcache.BlockFree || s == kvcache.BlockCached {
			free++
		}
	}
	if free != st.KV.Free || free != 32 {
		t.Fatalf("after stop: %d free in the map, stats say %d", free, st.KV.Free)
	}
}
