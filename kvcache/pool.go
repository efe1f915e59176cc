// Package kvcache is the paged key/value cache of the serving engine: a pool
// of fixed-size physical blocks with reference counts, per-sequence block
// tables, a hash-chained prefix cache, and the K/V storage itself, which
// implements model.KVCache so the model reads and writes through the block
// tables.
package kvcache

import "fmt"

// none marks the absence of a block in the intrusive free list.
const none = -1

// blockMeta is the bookkeeping of one physical block. The free queue links
// live inside it so that taking a cached block back out of the queue on a
// prefix hit is O(1).
type blockMeta struct {
	ref        int32
	prev, next int32
	inFree     bool
	hashed     bool   // registered in the prefix cache under hash
	hash       uint64 // chain hash of the block's content
	extra      uint64 // the chain's extra key, checked on lookup with the tokens
	tokens     []int32
	gen        uint32 // allocations so far: content computed for this block is stale once it moves on
}

// Pool is the set of physical blocks. Blocks with no references sit in one
// free queue that is also the LRU of cached blocks: uncached blocks are kept
// at the head and taken first, cached ones are appended at the tail when
// released, so a cached prefix is evicted only when no plain free block is
// left, and then the least recently released first.
type Pool struct {
	blocks     []blockMeta
	head, tail int32
	numFree    int
	cachedFree int              // free blocks still holding registered content
	cached     map[uint64]int32 // chain hash → block holding that content

	// Prefix cache counters, in tokens (vLLM counts queries and hits in
	// tokens too).
	Queries, Hits uint64
	Evictions     uint64

	events *EventLog // nil: nobody listens
}

// NewPool makes n free blocks.
func NewPool(n int) *Pool {
	p := &Pool{blocks: make([]blockMeta, n), head: none, tail: none, cached: map[uint64]int32{}}
	for i := range p.blocks {
		p.blocks[i].prev, p.blocks[i].next = none, none
		p.pushBack(int32(i))
	}
	return p
}

// NumBlocks is the pool size.
func (p *Pool) NumBlocks() int { return len(p.blocks) }

// NumFree counts blocks without references, cached ones included: all of
// them can be handed out.
func (p *Pool) NumFree() int { return p.numFree }

// NumCached counts blocks registered in the prefix cache (in use or not).
func (p *Pool) NumCached() int { return len(p.cached) }

// Ref is the reference count of block id.
func (p *Pool) Ref(id int32) int32 { return p.blocks[id].ref }

func (p *Pool) pushBack(id int32) {
	b := &p.blocks[id]
	b.prev, b.next, b.inFree = p.tail, none, true
	if p.tail != none {
		p.blocks[p.tail].next = id
	} else {
		p.head = id
	}
	p.tail = id
	p.numFree++
}

func (p *Pool) pushFront(id int32) {
	b := &p.blocks[id]
	b.prev, b.next, b.inFree = none, p.head, true
	if p.head != none {
		p.blocks[p.head].prev = id
	} else {
		p.tail = id
	}
	p.head = id
	p.numFree++
}

func (p *Pool) unlink(id int32) {
	b := &p.blocks[id]
	if b.prev != none {
		p.blocks[b.prev].next = b.next
	} else {
		p.head = b.next
	}
	if b.next != none {
		p.blocks[b.next].prev = b.prev
	} else {
		p.tail = b.prev
	}
	b.prev, b.next, b.inFree = none, none, false
	p.numFree--
}

// alloc takes the block at the head of the free queue, evicting its cached
// content if it has any. It returns none when the pool is exhausted.
func (p *Pool) alloc() int32 {
	id := p.head
	if id == none {
		return none
	}
	p.unlink(id)
	if p.blocks[id].hashed {
		p.cachedFree--
	}
	p.uncache(id)
	p.blocks[id].ref = 1
	p.blocks[id].gen++
	return id
}

// uncache drops block id from the prefix cache.
func (p *Pool) uncache(id int32) {
	b := &p.blocks[id]
	if !b.hashed {
		return
	}
	if p.cached[b.hash] == id {
		delete(p.cached, b.hash)
	}
	if p.events != nil {
		p.events.removed(b.hash)
	}
	b.hashed, b.hash, b.extra, b.tokens = false, 0, 0, nil
	p.Evictions++
}

// touch adds a reference to a block found in the prefix cache, taking it
// out of the free queue if nobody held it.
func (p *Pool) touch(id int32) {
	b := &p.blocks[id]
	if b.inFree {
		p.unlink(id)
		if b.hashed {
			p.cachedFree--
		}
	}
	b.ref++
}

// release drops one reference; a block nobody holds goes back to the free
// queue, at the tail when it holds cached content (most recently used), at
// the head otherwise.
func (p *Pool) release(id int32) {
	b := &p.blocks[id]
	if b.ref <= 0 {
		panic(fmt.Sprintf("kvcache: release of block %d with ref %d", id, b.ref))
	}
	b.ref--
	if b.ref > 0 {
		return
	}
	if b.hashed {
		p.pushBack(id)
		p.cachedFree++
	} else {
		p.pushFront(id)
	}
}

// register records that block id holds the full-block content tokens whose
// chain hash is h, following the block hashed parent when hasParent. When
// another block already holds the same content the first one stays the
// canonical copy.
func (p *Pool) register(id int32, h, parent uint64, hasParent bool, tokens []int32, extra uint64) {
	b := &p.blocks[id]
	if b.hashed {
		return
	}
	if _, ok := p.cached[h]; ok {
		return
	}
	b.hashed, b.hash, b.extra = true, h, extra
	b.tokens = append([]int32(nil), tokens...)
	p.cached[h] = id
	if p.events != nil {
		p.events.stored(h, parent, hasParent, b.tokens)
	}
}

// Hashes appends the chain hashes of the blocks registered in the prefix
// cache, in block order: what a replica holds, as its KV events tell it.
func (p *Pool) Hashes(dst []uint64) []uint64 {
	for i := range p.blocks {
		if p.blocks[i].hashed {
			dst = append(dst, p.blocks[i].hash)
		}
	}
	return dst
}

// lookup finds the block caching content tokens under chain hash h,
// checking the token ids and the extra key so a hash collision is a miss,
// not wrong output or a block shared across cache salts.
func (p *Pool) lookup(h uint64, tokens []int32, extra uint64) (int32, bool) {
	id, ok := p.cached[h]
	if !ok {
		return none, false
	}
	b := &p.blocks[id]
	if b.extra != extra || len(b.tokens) != len(tokens) {
		return none, false
	}
	for i, t := range tokens {
		if b.tokens[i] != t {
			return none, false
		}
	}
	return id, true
}

// Check verifies the pool's invariants: the free queue holds exactly the
// blocks with no references, its links are consistent, and every cache
// entry points at a block that is registered under that hash.
func (p *Pool) Check() error {
	seen := 0
	prev := int32(none)
	for id := p.head; id != none; id = p.blocks[id].next {
		b := &p.blocks[id]
		if !b.inFree {
			return fmt.Errorf("kvcache: block %d in free queue but not marked free", id)
		}
		if b.ref != 0 {
			return fmt.Errorf("kvcache: block %d both free and referenced (ref %d)", id, b.ref)
		}
		if b.prev != prev {
			return fmt.Errorf("kvcache: block %d: broken free-queue link", id)
		}
		prev = id
		seen++
		if seen > len(p.blocks) {
			return fmt.Errorf("kvcache: free queue has a cycle")
		}
	}
	if prev != p.tail {
		return fmt.Errorf("kvcache: free queue tail %d, walked to %d", p.tail, prev)
	}
	if seen != p.numFree {
		return fmt.Errorf("kvcache: free queue holds %d blocks, counter says %d", seen, p.numFree)
	}
	cf := 0
	for i := range p.blocks {
		if p.blocks[i].inFree && p.blocks[i].hashed {
			cf++
		}
	}
	if cf != p.cachedFree {
		return fmt.Errorf("kvcache: %d cached free blocks, counter says %d", cf, p.cachedFree)
	}
	for i := range p.blocks {
		b := &p.blocks[i]
		if b.ref < 0 {
			return fmt.Errorf("kvcache: block %d has ref %d", i, b.ref)
		}
		if b.ref == 0 && !b.inFree {
			return fmt.Errorf("kvcache: block %d leaked: no references and not free", i)
		}
		if b.ref > 0 && b.inFree {
			return fmt.Errorf("kvcache: block %d both free and referenced", i)
		}
	}
	for h, id := range p.cached {
		b := &p.blocks[id]
		if !b.hashed || b.hash != h {
			return fmt.Errorf("kvcache: cache entry %x points at block %d that is not registered under it", h, id)
		}
	}
	return nil
}

// HitRate is prefix-cache hits over queries, in tokens (0 before any query).
func (p *Pool) HitRate() float64 {
	if p.Queries == 0 {
		return 0
	}
	return float64(p.Hits) / float64(p.Queries)
}
