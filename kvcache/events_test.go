package kvcache

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestNamespaceFromSettings: a position-driven policy's hash namespace is
// a function of its settings alone (pinned: replicas and restarts must
// agree, so a change here is a change of the wire format), and settings
// that differ get namespaces that differ.
func TestNamespaceFromSettings(t *testing.T) {
	names := []string{"streaming:sinks=4,window=64", "streaming:sinks=4,window=32", "streaming:sinks=0,window=64",
		"streaming:sinks=4,window=64,pos=shift,ctx=128", "streaming:sinks=4,window=64,pos=shift,ctx=256"}
	seen := map[uint64]string{}
	for _, name := range names {
		p, err := ParsePolicy(name)
		if err != nil {
			t.Fatal(err)
		}
		ns := namespace(policyKey(p))
		if ns == 0 || ns&1 == 0 {
			t.Fatalf("%s: namespace %#x must be odd", name, ns)
		}
		if other, ok := seen[ns]; ok {
			t.Fatalf("%s and %s share namespace %#x", name, other, ns)
		}
		seen[ns] = name
	}
	p, _ := ParsePolicy(names[0])
	if k := policyKey(p); k != "kvcache.StreamingPolicy:streaming:sinks=4,window=64" {
		t.Fatalf("policy key %q", k)
	}
	if ns, want := namespace(policyKey(p)), uint64(0x5ffea5e966bf6d4d); ns != want {
		t.Fatalf("namespace of %s is %#x, pinned %#x", names[0], ns, want)
	}
	if h, want := BlockHash(0, []int32{1, 2, 3, 4}, 0), uint64(0x11e171f1e7e78706); h != want {
		t.Fatalf("BlockHash of [1 2 3 4] is %#x, pinned %#x", h, want)
	}
}

// TestNamespaceSeparatesBlocks: two fresh caches agree on every block
// hash of a streaming sequence; another streaming setting agrees on the
// blocks both compute over the full history and on none after.
func TestNamespaceSeparatesBlocks(t *testing.T) {
	toks := simTokens(5, 40, 40)
	hashes := func(policy string) []uint64 {
		c, err := NewManager(Config{NLayer: 1, NKVHead: simNKV, HeadDim: simHD, BlockSize: simBS, NumBlocks: 32, PrefixCache: true, Rope: simRope()})
		if err != nil {
			t.Fatal(err)
		}
		p, err := ParsePolicy(policy)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Policies.Bind(1, p); err != nil {
			t.Fatal(err)
		}
		if !c.Allocate(1, nil, 0, len(toks)) {
			t.Fatal("allocate")
		}
		c.Commit(1, toks, len(toks), 0)
		return slices.Clone(c.tables[1].hashes)
	}
	a, b := hashes("streaming:sinks=4,window=8"), hashes("streaming:sinks=4,window=8")
	if len(a) != 10 || !slices.Equal(a, b) {
		t.Fatalf("two caches hash the same streaming sequence differently:\n%x\n%x", a, b)
	}
	c := hashes("streaming:sinks=4,window=16")
	// sinks+window = 12 and 20: blocks 0-2 are exact under both.
	for i := range a {
		if same := a[i] == c[i]; same != (i < 3) {
			t.Fatalf("block %d: equal hashes %v under different windows (want equal only below position 12)", i, same)
		}
	}
}

// replay applies batches to an index of block hashes, as a router does,
// and checks what a consumer may rely on: numbers without gaps, full
// blocks, removals of stored hashes only.
func replay(t *testing.T, idx map[uint64]bool, next *uint64, bs int, batches []EventBatch) {
	t.Helper()
	for _, b := range batches {
		if b.Seq != *next {
			t.Fatalf("batch %d after %d: a gap with nobody slow", b.Seq, *next-1)
		}
		*next = b.Seq + 1
		for _, e := range b.Events {
			switch e.Kind {
			case BlockStored:
				if len(e.Tokens) != bs || idx[e.Hash] {
					t.Fatalf("stored %x: %d tokens (block size %d), already indexed %v", e.Hash, len(e.Tokens), bs, idx[e.Hash])
				}
				idx[e.Hash] = true
			case BlockRemoved:
				if !idx[e.Hash] {
					t.Fatalf("removed %x, never stored", e.Hash)
				}
				delete(idx, e.Hash)
			case AllBlocksCleared:
				clear(idx)
			default:
				t.Fatalf("event kind %d", e.Kind)
			}
		}
	}
}

// mixedWorkload drives c through steps of admissions (prompts that share
// prefixes, some under a streaming policy), decodes, rollbacks and aborts
// in a pool too small for all of it, flushing log after each step.
func mixedWorkload(t *testing.T, c *Cache, log *EventLog, steps int) {
	t.Helper()
	r := rand.New(rand.NewPCG(7, 11))
	stream, _ := ParsePolicy("streaming:sinks=4,window=8")
	bs := c.BlockSize()
	live := map[int32][]int32{}
	next := int32(0)
	for step := 0; step < steps; step++ {
		if len(live) < 5 && r.IntN(2) == 0 {
			fam := r.IntN(4)
			p := make([]int32, 2*bs+r.IntN(3*bs))
			for i := range p {
				p[i] = int32(fam*100 + i)
				if i >= 2*bs {
					p[i] = r.Int32N(500)
				}
			}
			if r.IntN(4) == 0 {
				if err := c.Policies.Bind(next, stream); err != nil {
					t.Fatal(err)
				}
			}
			hit := c.LookupSeq(next, p, 0)
			if c.Allocate(next, hit, len(hit)*bs, len(p)) {
				c.Commit(next, p, len(p), 0)
				live[next] = p
			} else {
				c.Free(next)
			}
			next++
		}
		for _, id := range slices.Sorted(mapKeys(live)) {
			toks := live[id]
			switch k := r.IntN(20); {
			case k == 0 || len(toks) > 12*bs: // abort, or done
				c.Free(id)
				delete(live, id)
				continue
			case k == 1 && len(toks) > bs: // rejected drafts roll back
				n := len(toks) - 1 - r.IntN(3)
				c.Truncate(id, n)
				toks = toks[:n]
			}
			toks = append(toks, r.Int32N(500))
			if !c.Allocate(id, nil, len(toks)-1, len(toks)) {
				c.Free(id) // preempted
				delete(live, id)
				continue
			}
			c.Commit(id, toks, len(toks), 0)
			live[id] = toks
		}
		log.Flush()
	}
	for id := range live {
		c.Free(id)
	}
	log.Flush()
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// TestEventsReplayMatchesPool: the events of a mixed workload with
// evictions, prefix hits, rollbacks and aborts, replayed into an index,
// give exactly the hashes the pool holds, checked every step by a reader
// on another goroutine too (the race detector watches the ring).
func TestEventsReplayMatchesPool(t *testing.T) {
	log := NewEventLog(1 << 12)
	c, err := NewManager(Config{NLayer: 1, NKVHead: 1, HeadDim: simHD, BlockSize: 4, NumBlocks: 24, PrefixCache: true, Rope: simRope(), Events: log})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewManager(Config{NLayer: 1, NKVHead: 1, HeadDim: 1, NumBlocks: 4, Events: log}); err == nil {
		t.Fatal("one event log attached to two caches")
	}
	done := make(chan struct{})
	read := make(chan int)
	go func() { // a live follower, reading while the workload runs
		var got []EventBatch
		from := uint64(0)
		for {
			var wake <-chan struct{}
			got, wake = log.Read(from, got[:0])
			if len(got) > 0 {
				from = got[len(got)-1].Seq + 1
				continue
			}
			select {
			case <-wake:
			case <-done:
				read <- int(from)
				return
			}
		}
	}()
	mixedWorkload(t, c, log, 600)
	close(done)
	followed := <-read

	idx, next := map[uint64]bool{}, uint64(0)
	for {
		batches, _ := log.Read(next, nil)
		if len(batches) == 0 {
			break
		}
		if len(batches) > readMax {
			t.Fatalf("one read copied %d batches", len(batches))
		}
		replay(t, idx, &next, c.BlockSize(), batches)
	}
	want := c.Pool().Hashes(nil)
	if len(idx) != len(want) {
		t.Fatalf("replayed index holds %d hashes, the pool %d", len(idx), len(want))
	}
	for _, h := range want {
		if !idx[h] {
			t.Fatalf("pool holds %x, the events never stored it", h)
		}
	}
	if err := c.Check(); err != nil {
		t.Fatal(err)
	}
	p := c.Pool()
	if p.Evictions < 20 || p.Hits == 0 && p.NumCached() == 0 || len(want) == 0 {
		t.Fatalf("workload too tame: %d evictions, %d cached at the end", p.Evictions, len(want))
	}
	if uint64(followed) > next {
		t.Fatalf("follower read to %d, the log has %d", followed, next)
	}
	t.Logf("%d batches, %d evictions, %d hashes held", next, p.Evictions, len(want))
}

// TestEventsRing: a reader further behind than the ring holds skips to
// the oldest batch kept and sees the gap; one at the head waits for the
// next flush; one from another process's numbering starts over.
func TestEventsRing(t *testing.T) {
	log := NewEventLog(2)
	log.attach(4)
	for i := range 5 {
		log.removed(uint64(i))
		log.Flush()
	}
	log.Flush() // nothing pending: no batch
	if log.Next() != 5 {
		t.Fatalf("next %d, want 5", log.Next())
	}
	got, _ := log.Read(0, nil)
	if len(got) != 2 || got[0].Seq != 3 || got[1].Seq != 4 || got[1].Events[0].Hash != 4 {
		t.Fatalf("read from 0 of a 2-batch ring: %+v", got)
	}
	got[0].Events[0].Hash = 99 // a copy: the ring keeps its own
	if again, _ := log.Read(3, nil); again[0].Events[0].Hash != 3 {
		t.Fatal("a reader's copy aliases the ring")
	}
	if got, _ := log.Read(9, nil); len(got) != 2 || got[0].Seq != 3 {
		t.Fatalf("read from past the head: %+v", got)
	}
	got, wake := log.Read(5, nil)
	if len(got) != 0 || wake == nil {
		t.Fatal("a reader at the head got batches or nothing to wait on")
	}
	select {
	case <-wake:
		t.Fatal("woken before a flush")
	default:
	}
	log.stored(7, 6, true, []int32{1, 2, 3, 4})
	log.Flush()
	select {
	case <-wake:
	case <-time.After(5 * time.Second):
		t.Fatal("not woken by the flush")
	}
	if got, _ := log.Read(5, nil); len(got) != 1 || got[0].Events[0].Kind != BlockStored {
		t.Fatalf("after the flush: %+v", got)
	}
}
