package kvcache

import "testing"

// TestBlocksStates walks a block through used → shared → cached and checks
// that the map agrees with Usage's counts at each point.
func TestBlocksStates(t *testing.T) {
	c := newTestCache(t, 8, F32, true)
	toks := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9}
	if !c.Allocate(1, nil, 0, len(toks)) {
		t.Fatal("allocate")
	}
	c.Commit(1, toks, len(toks), 0)
	if !c.Allocate(2, nil, 0, 3) {
		t.Fatal("allocate")
	}
	var m BlockMap
	c.Blocks(&m)
	count := func() map[BlockState]int {
		n := map[BlockState]int{}
		for _, s := range m.State {
			n[s]++
		}
		return n
	}
	n := count()
	// seq 1: two full registered blocks + a partial one; seq 2: one block.
	if n[BlockShared] != 2 || n[BlockUsed] != 2 || n[BlockFree] != 4 || m.BlockSize != 4 || len(m.Owner) != 8 {
		t.Fatalf("states %v, block size %d", n, m.BlockSize)
	}
	for _, id := range c.Table(1) {
		if m.Owner[id] != 1 {
			t.Errorf("block %d owner %d, want 1", id, m.Owner[id])
		}
	}
	if id := c.Table(2)[0]; m.Owner[id] != 2 || m.State[id] != BlockUsed {
		t.Errorf("seq 2's block %d: owner %d state %d", id, m.Owner[id], m.State[id])
	}
	c.Free(1)
	c.Blocks(&m)
	n = count()
	u := c.Usage()
	if n[BlockCached] != u.CachedFree || n[BlockCached] != 2 || n[BlockUsed] != u.Used || n[BlockFree] != u.Free-u.CachedFree {
		t.Fatalf("after free: states %v, usage %+v", n, u)
	}
	for i, o := range m.Owner {
		if m.State[i] != BlockUsed && o != -1 {
			t.Errorf("free block %d has owner %d", i, o)
		}
	}
}
