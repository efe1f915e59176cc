package engine

import (
	"context"
	"sync"
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
	// The request must still be running when the map is taken: every
	// pass after the first waits for the test, which lets them through
	// one by one only while Blocks waits for the loop to answer.
	gm := &gatedModel{fakeModel: fakeModel{check: true}, gate: make(chan struct{})}
	e, err := New(gm, newFakeTok(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.Start()
	var open sync.Once
	release := func() { open.Do(func() { close(gm.gate) }) }
	t.Cleanup(func() { release(); e.Stop(context.Background()) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := e.Submit(ctx, &Request{Prompt: []int32{4, 5, 6, 7, 8, 9, 10, 11, 12}, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	if ev, ok := <-ch; !ok || ev.Finish != FinishNone {
		t.Fatalf("first event %+v (open %v)", ev, ok)
	}
	bctx, bcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer bcancel()
	type blocksResult struct {
		m   kvcache.BlockMap
		err error
	}
	got := make(chan blocksResult, 1)
	go func() {
		m, err := e.Blocks(bctx)
		got <- blocksResult{m, err}
	}()
	// Blocks is answered after the step following the one during which
	// it was asked; let passes through one at a time until it is.
	var r blocksResult
wait:
	for {
		select {
		case r = <-got:
			break wait
		case gm.gate <- struct{}{}:
		}
	}
	m, err := r.m, r.err
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
	release()
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
