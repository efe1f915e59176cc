package kvcache

import "testing"

// TestDropCached: after DropCached no prefix is found, the blocks a
// sequence holds stay its own and the pool's invariants hold.
func TestDropCached(t *testing.T) {
	c, err := NewManager(Config{NLayer: 1, NKVHead: 1, HeadDim: 4, BlockSize: 4, NumBlocks: 16, PrefixCache: true})
	if err != nil {
		t.Fatal(err)
	}
	tokens := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for seq := int32(0); seq < 2; seq++ {
		if !c.Allocate(seq, nil, 0, len(tokens)) {
			t.Fatal("allocate")
		}
		c.Commit(seq, tokens, len(tokens), 0)
	}
	c.Free(0) // its two full blocks are the registered ones: free and cached
	if hit := c.Lookup(tokens, 0); len(hit) != 2 {
		t.Fatalf("before: %d blocks hit, want 2", len(hit))
	}
	if n := c.Pool().DropCached(); n != 2 {
		t.Fatalf("dropped %d blocks, want 2", n)
	}
	if hit := c.Lookup(tokens, 0); len(hit) != 0 {
		t.Fatalf("after: %d blocks hit, want 0", len(hit))
	}
	if err := c.Check(); err != nil {
		t.Fatal(err)
	}
	if u := c.Usage(); u.Used != 3 || u.CachedFree != 0 || c.Pool().NumCached() != 0 {
		t.Fatalf("usage after the drop: %+v, %d cached", u, c.Pool().NumCached())
	}
	c.Free(1)
	if err := c.Check(); err != nil {
		t.Fatal(err)
	}
	if u := c.Usage(); u.Free != 16 {
		t.Fatalf("usage after freeing: %+v", u)
	}
}
