package kvcache

import (
	"fmt"
	"math"
	"strings"
	"sync"

	"pagoda/kernels"
	"pagoda/model"
)

// DType is the element type K and V are stored in.
type DType uint8

const (
	F16 DType = iota // the default: half the bytes of f32, error ~1e-3 relative
	F32
	BF16
)

// Size is the bytes per element.
func (d DType) Size() int {
	if d == F32 {
		return 4
	}
	return 2
}

func (d DType) String() string {
	switch d {
	case F16:
		return "f16"
	case F32:
		return "f32"
	case BF16:
		return "bf16"
	}
	return fmt.Sprintf("DType(%d)", d)
}

// ParseDType reads "f16", "f32" or "bf16" (also "fp16", "float32", ...).
func ParseDType(s string) (DType, error) {
	switch strings.ToLower(s) {
	case "f16", "fp16", "float16", "half", "":
		return F16, nil
	case "f32", "fp32", "float32", "float":
		return F32, nil
	case "bf16", "bfloat16":
		return BF16, nil
	}
	return 0, fmt.Errorf("kvcache: unknown dtype %q (want f16, f32 or bf16)", s)
}

// DefaultBlockSize is the tokens per block when Config.BlockSize is 0.
const DefaultBlockSize = 16

// Config sizes a cache. Either NumBlocks or Bytes must be set; the storage
// is allocated once, up front, and never grows.
type Config struct {
	NLayer, NKVHead, HeadDim int
	BlockSize                int   // tokens per block; 0 = 16
	NumBlocks                int   // 0 = as many as Bytes holds
	Bytes                    int64 // budget for K and V of all layers
	DType                    DType
	PrefixCache              bool // register full blocks for reuse across requests
	// Window > 0 is the model's sliding window (Mistral): a block whose
	// positions no later token can attend to is released as soon as the
	// sequence has computed past it, so a sequence holds about
	// Window/BlockSize+1 blocks however long it grows.
	Window int
}

// BlockBytes is the storage of one block over all layers, K and V.
func (c Config) BlockBytes() int64 {
	bs := c.BlockSize
	if bs == 0 {
		bs = DefaultBlockSize
	}
	return 2 * int64(c.NLayer) * int64(bs) * int64(c.NKVHead) * int64(c.HeadDim) * int64(c.DType.Size())
}

// seqTable is one sequence's view of the pool.
type seqTable struct {
	// blocks maps logical block i to a physical block; the first dead
	// entries are released (released, -1) on a sliding-window cache, kept
	// as tombstones so logical positions stay where they were.
	blocks []int32
	hashes []uint64 // chain hashes of the leading full blocks
	filled int      // tokens the sequence has claimed slots for
	dead   int      // leading released blocks
}

// released marks a block table entry whose block a sliding window let go.
const released = -1

// Cache is the paged KV cache: block pool, block tables and storage. It is
// not safe for concurrent mutation: one goroutine (the engine's) allocates
// and frees. Store and Attend may run concurrently with each other during a
// forward pass, as long as no table changes meanwhile.
type Cache struct {
	cfg      Config
	bs       int
	rowLen   int // NKVHead·HeadDim
	blockLen int // bs·rowLen
	pool     *Pool
	tables   map[int32]*seqTable

	k32, v32 [][]float32 // per layer, F32
	k16, v16 [][]uint16  // per layer, F16 / BF16

	scratch sync.Pool
}

// New allocates the storage for cfg.
func New(cfg Config) (*Cache, error) {
	if cfg.NLayer <= 0 || cfg.NKVHead <= 0 || cfg.HeadDim <= 0 {
		return nil, fmt.Errorf("kvcache: bad shape: %d layers, %d kv heads, head dim %d", cfg.NLayer, cfg.NKVHead, cfg.HeadDim)
	}
	if cfg.BlockSize == 0 {
		cfg.BlockSize = DefaultBlockSize
	}
	if cfg.BlockSize < 0 {
		return nil, fmt.Errorf("kvcache: block size %d", cfg.BlockSize)
	}
	if cfg.DType > BF16 {
		return nil, fmt.Errorf("kvcache: unknown dtype %d", cfg.DType)
	}
	if cfg.NumBlocks == 0 {
		if cfg.Bytes <= 0 {
			return nil, fmt.Errorf("kvcache: neither a block count nor a byte budget given")
		}
		cfg.NumBlocks = int(cfg.Bytes / cfg.BlockBytes())
		if cfg.NumBlocks == 0 {
			return nil, fmt.Errorf("kvcache: budget %d bytes holds no block (a block takes %d bytes)", cfg.Bytes, cfg.BlockBytes())
		}
	}
	if cfg.NumBlocks < 0 {
		return nil, fmt.Errorf("kvcache: %d blocks", cfg.NumBlocks)
	}
	if cfg.Window < 0 {
		return nil, fmt.Errorf("kvcache: sliding window %d", cfg.Window)
	}
	c := &Cache{
		cfg:    cfg,
		bs:     cfg.BlockSize,
		rowLen: cfg.NKVHead * cfg.HeadDim,
		pool:   NewPool(cfg.NumBlocks),
		tables: map[int32]*seqTable{},
	}
	c.blockLen = c.bs * c.rowLen
	perLayer := cfg.NumBlocks * c.blockLen
	if int64(perLayer) > math.MaxInt32*8 {
		return nil, fmt.Errorf("kvcache: %d blocks of %d elements per layer is too large", cfg.NumBlocks, c.blockLen)
	}
	if cfg.DType == F32 {
		c.k32, c.v32 = make([][]float32, cfg.NLayer), make([][]float32, cfg.NLayer)
		for l := range c.k32 {
			c.k32[l], c.v32[l] = make([]float32, perLayer), make([]float32, perLayer)
		}
	} else {
		c.k16, c.v16 = make([][]uint16, cfg.NLayer), make([][]uint16, cfg.NLayer)
		for l := range c.k16 {
			c.k16[l], c.v16[l] = make([]uint16, perLayer), make([]uint16, perLayer)
		}
	}
	return c, nil
}

// Config is the configuration the cache was built with (defaults filled in).
func (c *Cache) Config() Config { return c.cfg }

// BlockSize is the tokens per block.
func (c *Cache) BlockSize() int { return c.bs }

// Pool is the block pool (for counters and invariant checks).
func (c *Cache) Pool() *Pool { return c.pool }

// blocksFor is the number of blocks n tokens take.
func (c *Cache) blocksFor(n int) int { return (n + c.bs - 1) / c.bs }

// deadBlocks is the number of leading blocks no token at position next or
// later can attend to: token p sees positions from p+1-Window on, so block
// i is dead once (i+1)·BlockSize <= next+1-Window.
func (c *Cache) deadBlocks(next int) int {
	if c.cfg.Window <= 0 || next+1-c.cfg.Window <= 0 {
		return 0
	}
	return (next + 1 - c.cfg.Window) / c.bs
}

// MaxSeqBlocks is the most blocks one sequence holds while computing a
// step of chunk tokens on a sliding-window cache (0 when there is no
// window: the bound is then the whole sequence). Live positions are
// [c+1-Window, c+chunk) for a step starting at c.
func (c *Cache) MaxSeqBlocks(chunk int) int {
	if c.cfg.Window <= 0 {
		return 0
	}
	return (c.cfg.Window+chunk-2)/c.bs + 2
}

// slide releases the blocks of t that no token at position next or later
// can attend to. A registered block released here stays in the prefix
// cache (at the tail of the free queue) for other requests to reuse.
func (c *Cache) slide(t *seqTable, next int) {
	k := min(c.deadBlocks(next), len(t.blocks))
	for ; t.dead < k; t.dead++ {
		c.pool.release(t.blocks[t.dead])
		t.blocks[t.dead] = released
	}
}

// Lookup returns the blocks of the longest cached prefix of tokens, whole
// blocks only, and at most len(tokens)-1 tokens: the last token is always
// recomputed so the model yields its logits. It changes nothing; pass the
// result to Allocate to claim the blocks.
func (c *Cache) Lookup(tokens []int32, extra uint64) []int32 {
	if !c.cfg.PrefixCache || len(tokens) < 2 {
		return nil
	}
	var hit []int32
	var h uint64
	for i := 0; (i+1)*c.bs <= len(tokens)-1; i++ {
		blk := tokens[i*c.bs : (i+1)*c.bs]
		h = BlockHash(h, blk, extra)
		id, ok := c.pool.lookup(h, blk, extra)
		if !ok {
			break
		}
		hit = append(hit, id)
	}
	return hit
}

// RecordPrefixQuery adds to the prefix cache hit-rate counters, in tokens.
// The engine calls it once per scheduled request, not per lookup attempt.
func (c *Cache) RecordPrefixQuery(queried, hit int) {
	c.pool.Queries += uint64(queried)
	c.pool.Hits += uint64(hit)
}

// CanAllocate reports whether Allocate(seq, hit, from, upto) would succeed.
func (c *Cache) CanAllocate(seq int32, hit []int32, from, upto int) bool {
	return c.pool.numFree >= c.need(seq, hit, from, upto)
}

// need is the count of free blocks Allocate would consume: new blocks,
// copies of shared blocks written into, and cached blocks revived from the
// free queue.
func (c *Cache) need(seq int32, hit []int32, from, upto int) int {
	t := c.tables[seq]
	have := 0
	var cow int
	if t != nil {
		have = len(t.blocks)
		for i := from / c.bs; i < len(t.blocks) && i*c.bs < upto; i++ {
			if id := t.blocks[i]; id != released && c.pool.blocks[id].ref > 1 {
				cow++
			}
		}
	}
	n := c.blocksFor(upto) - have - len(hit)
	if n < 0 {
		n = 0
	}
	dead := c.deadBlocks(from)
	for i, id := range hit {
		if i >= dead && c.pool.blocks[id].ref == 0 {
			n++
		}
	}
	return n + cow
}

// Allocate makes seq own slots for tokens [0, upto): it claims the prefix
// blocks hit (from Lookup, only for a sequence without blocks yet), copies
// any block shared with another sequence that tokens [from, upto) will be
// written into (copy-on-write), and appends fresh blocks. It returns false
// and changes nothing when the pool cannot supply enough blocks. On a
// sliding-window cache, hit blocks that no token from position from on can
// see are recorded as released without being claimed.
func (c *Cache) Allocate(seq int32, hit []int32, from, upto int) bool {
	t := c.tables[seq]
	if len(hit) > 0 && t != nil && len(t.blocks) > 0 {
		panic("kvcache: prefix blocks offered to a sequence that already has blocks")
	}
	if c.pool.numFree < c.need(seq, hit, from, upto) {
		return false
	}
	if t == nil {
		t = &seqTable{}
		c.tables[seq] = t
	}
	dead := c.deadBlocks(from)
	for i, id := range hit {
		t.hashes = append(t.hashes, c.pool.blocks[id].hash)
		if i < dead {
			t.blocks = append(t.blocks, released)
			t.dead++
			continue
		}
		c.pool.touch(id)
		t.blocks = append(t.blocks, id)
	}
	for i := from / c.bs; i < len(t.blocks) && i*c.bs < upto; i++ {
		old := t.blocks[i]
		if old == released || c.pool.blocks[old].ref <= 1 {
			continue
		}
		nb := c.pool.alloc()
		c.copyBlock(nb, old)
		c.pool.release(old)
		t.blocks[i] = nb
	}
	for len(t.blocks) < c.blocksFor(upto) {
		t.blocks = append(t.blocks, c.pool.alloc())
	}
	if upto > t.filled {
		t.filled = upto
	}
	return true
}

// Commit says seq's first computed tokens are in the cache: it registers
// the full blocks among them in the prefix cache (when prefix caching is
// on) and then, on a sliding-window cache, releases the blocks no later
// token can attend to. Registration comes first, so a released block
// stays reusable by other requests.
func (c *Cache) Commit(seq int32, tokens []int32, computed int, extra uint64) {
	t := c.tables[seq]
	if t == nil {
		return
	}
	if c.cfg.PrefixCache {
		n := min(computed, len(tokens))
		for i := len(t.hashes); (i+1)*c.bs <= n && i < len(t.blocks); i++ {
			var parent uint64
			if i > 0 {
				parent = t.hashes[i-1]
			}
			blk := tokens[i*c.bs : (i+1)*c.bs]
			h := BlockHash(parent, blk, extra)
			t.hashes = append(t.hashes, h)
			// A block released before it was registered (a prefix hit
			// beyond the window) still extends the chain.
			if id := t.blocks[i]; id != released {
				c.pool.register(id, h, blk, extra)
			}
		}
	}
	c.slide(t, computed)
}

// Free releases all of seq's blocks. The tail blocks go back to the free
// queue first, so a cached prefix outlives its own continuation.
func (c *Cache) Free(seq int32) {
	t := c.tables[seq]
	if t == nil {
		return
	}
	for i := len(t.blocks) - 1; i >= t.dead; i-- {
		c.pool.release(t.blocks[i])
	}
	delete(c.tables, seq)
}

// Fork gives child the same blocks as parent (shared, reference-counted);
// the first write into a shared block copies it.
func (c *Cache) Fork(parent, child int32) error {
	p := c.tables[parent]
	if p == nil {
		return fmt.Errorf("kvcache: fork of unknown sequence %d", parent)
	}
	if ct := c.tables[child]; ct != nil && len(ct.blocks) > 0 {
		return fmt.Errorf("kvcache: fork into sequence %d that already has blocks", child)
	}
	t := &seqTable{
		blocks: append([]int32(nil), p.blocks...),
		hashes: append([]uint64(nil), p.hashes...),
		filled: p.filled,
		dead:   p.dead,
	}
	for _, id := range t.blocks[t.dead:] {
		c.pool.touch(id)
	}
	c.tables[child] = t
	return nil
}

// Table returns seq's block ids (shared; do not modify); released entries
// of a sliding-window cache are -1.
func (c *Cache) Table(seq int32) []int32 {
	if t := c.tables[seq]; t != nil {
		return t.blocks
	}
	return nil
}

// NumSeqs is the number of sequences holding blocks.
func (c *Cache) NumSeqs() int { return len(c.tables) }

func (c *Cache) copyBlock(dst, src int32) {
	d, s := int(dst)*c.blockLen, int(src)*c.blockLen
	for l := 0; l < c.cfg.NLayer; l++ {
		if c.k32 != nil {
			copy(c.k32[l][d:d+c.blockLen], c.k32[l][s:s+c.blockLen])
			copy(c.v32[l][d:d+c.blockLen], c.v32[l][s:s+c.blockLen])
		} else {
			copy(c.k16[l][d:d+c.blockLen], c.k16[l][s:s+c.blockLen])
			copy(c.v16[l][d:d+c.blockLen], c.v16[l][s:s+c.blockLen])
		}
	}
}

// Usage is a snapshot of how the cache is used.
type Usage struct {
	Blocks     int // in the pool
	Used       int // referenced by some sequence
	Free       int // unreferenced, cached ones included
	Cached     int // registered in the prefix cache (used or free)
	CachedFree int // free but still holding a reusable prefix
	Seqs       int
	BlockSize  int

	// In token slots of held blocks, summed per sequence (a shared block
	// counts for each sequence using it).
	Filled       int // tokens sequences have claimed, less released blocks
	Reserved     int // slots allocated beyond the claimed tokens
	InternalFrag int // unfilled tail of each sequence's last block
	// ExternalFrag is free slots that cannot serve a request. Any free block
	// can extend any sequence, so it is 0 by construction; Check verifies
	// the premise (every unreferenced block is in the free queue).
	ExternalFrag int
}

// UsedFrac is the fraction of blocks in use (vLLM's kv_cache_usage_perc).
func (u Usage) UsedFrac() float64 {
	if u.Blocks == 0 {
		return 0
	}
	return float64(u.Used) / float64(u.Blocks)
}

// Usage measures the cache.
func (c *Cache) Usage() Usage {
	u := Usage{
		Blocks:    c.pool.NumBlocks(),
		Free:      c.pool.numFree,
		Cached:    len(c.pool.cached),
		Seqs:      len(c.tables),
		BlockSize: c.bs,
	}
	u.Used = u.Blocks - u.Free
	u.CachedFree = c.pool.cachedFree
	for _, t := range c.tables {
		u.Filled += t.filled - t.dead*c.bs
		slots := len(t.blocks) * c.bs
		u.Reserved += slots - t.filled
		if t.filled > 0 {
			u.InternalFrag += slots - t.filled
		}
	}
	// Every free block sits in the one free queue that allocation draws
	// from (Check walks it), so no free slot is unusable: ExternalFrag
	// stays 0. Walking the queue here would cost O(blocks) per step.
	return u
}

// Check verifies the pool invariants and that the reference counts equal
// the number of block-table entries pointing at each block.
func (c *Cache) Check() error {
	if err := c.pool.Check(); err != nil {
		return err
	}
	refs := make([]int32, c.pool.NumBlocks())
	for seq, t := range c.tables {
		if t.dead > c.deadBlocks(t.filled) {
			return fmt.Errorf("kvcache: sequence %d released %d blocks, but at %d tokens only %d are outside the window %d",
				seq, t.dead, t.filled, c.deadBlocks(t.filled), c.cfg.Window)
		}
		for i, id := range t.blocks {
			if (i < t.dead) != (id == released) {
				return fmt.Errorf("kvcache: sequence %d block %d is %d with %d leading blocks released", seq, i, id, t.dead)
			}
			if id == released {
				continue
			}
			if id < 0 || int(id) >= len(refs) {
				return fmt.Errorf("kvcache: sequence %d holds bad block %d", seq, id)
			}
			refs[id]++
		}
		if len(t.blocks) != c.blocksFor(t.filled) {
			return fmt.Errorf("kvcache: sequence %d holds %d blocks for %d tokens", seq, len(t.blocks), t.filled)
		}
	}
	for id, r := range refs {
		if got := c.pool.blocks[id].ref; got != r {
			return fmt.Errorf("kvcache: block %d has ref %d but %d table entries", id, got, r)
		}
	}
	return nil
}

// slot is the element offset of token pos of seq in a layer array.
func (c *Cache) slot(seq, pos int32) int {
	t := c.tables[seq]
	if t == nil {
		panic(fmt.Sprintf("kvcache: sequence %d has no blocks", seq))
	}
	b := int(pos) / c.bs
	if pos < 0 || b >= len(t.blocks) {
		panic(fmt.Sprintf("kvcache: sequence %d position %d outside its %d blocks", seq, pos, len(t.blocks)))
	}
	if b < t.dead {
		panic(fmt.Sprintf("kvcache: sequence %d position %d is in a block released by the sliding window", seq, pos))
	}
	return (int(t.blocks[b])*c.bs + int(pos)%c.bs) * c.rowLen
}

// CheckPos reports an error when position pos of seq has no slot (the
// engine allocated none, or the window released it), so the model fails
// the forward pass instead of Store panicking.
func (c *Cache) CheckPos(seq, pos int32) error {
	t := c.tables[seq]
	if t == nil {
		return fmt.Errorf("kvcache: sequence %d has no blocks", seq)
	}
	b := int(pos) / c.bs
	if pos < 0 || b >= len(t.blocks) {
		return fmt.Errorf("kvcache: sequence %d position %d outside its %d blocks", seq, pos, len(t.blocks))
	}
	if b < t.dead {
		return fmt.Errorf("kvcache: sequence %d position %d is in a block released by the sliding window %d", seq, pos, c.cfg.Window)
	}
	return nil
}

// Store implements model.KVCache.
func (c *Cache) Store(layer int, seq, pos int32, k, v []float32) {
	off := c.slot(seq, pos)
	n := c.rowLen
	switch c.cfg.DType {
	case F32:
		copy(c.k32[layer][off:off+n], k[:n])
		copy(c.v32[layer][off:off+n], v[:n])
	case F16:
		kernels.F32ToF16Row(c.k16[layer][off:off+n], k[:n])
		kernels.F32ToF16Row(c.v16[layer][off:off+n], v[:n])
	case BF16:
		kernels.F32ToBF16Row(c.k16[layer][off:off+n], k[:n])
		kernels.F32ToBF16Row(c.v16[layer][off:off+n], v[:n])
	}
}

// Attend implements model.KVCache with a two-pass softmax: the scores of
// all visible positions, then the weighted sum of values, each position's
// K and V row found through the block table. Query heads sharing a KV head
// read its rows once.
func (c *Cache) Attend(layer int, seq, n int32, q, out []float32, p model.AttnParams) {
	t := c.tables[seq]
	if t == nil {
		panic(fmt.Sprintf("kvcache: attend on sequence %d without blocks", seq))
	}
	lo := 0
	if p.Window > 0 && int(n) > p.Window {
		lo = int(n) - p.Window
	}
	L := int(n) - lo
	D := p.HeadDim
	group := p.NHead / p.NKVHead
	if L <= 0 {
		clear(out[:p.NHead*D])
		return
	}
	sp, _ := c.scratch.Get().(*[]float32)
	if sp == nil {
		sp = new([]float32)
	}
	if cap(*sp) < p.NHead*L {
		*sp = make([]float32, p.NHead*L)
	}
	scores := (*sp)[:p.NHead*L]

	if c.blocksFor(int(n)) > len(t.blocks) {
		panic(fmt.Sprintf("kvcache: attend over %d positions of sequence %d with %d blocks", n, seq, len(t.blocks)))
	}
	// A window narrower than the model's (or none) would read blocks the
	// cache has already handed to someone else: wrong output, silently.
	if lo/c.bs < t.dead {
		panic(fmt.Sprintf("kvcache: attend from position %d of sequence %d with window %d reads position %d, released by the cache window %d",
			n-1, seq, p.Window, lo, c.cfg.Window))
	}
	// base is the element offset of position pos through the block table.
	base := func(pos int) int { return (int(t.blocks[pos/c.bs])*c.bs + pos%c.bs) * c.rowLen }
	for i := 0; i < L; i++ {
		base := base(lo + i)
		for kh := 0; kh < p.NKVHead; kh++ {
			off := base + kh*D
			for g := 0; g < group; g++ {
				h := kh*group + g
				qh := q[h*D : (h+1)*D]
				var s float32
				switch c.cfg.DType {
				case F32:
					s = kernels.DotF32(qh, c.k32[layer][off:off+D])
				case F16:
					s = kernels.DotF16(qh, c.k16[layer][off:off+D])
				default:
					s = kernels.DotBF16(qh, c.k16[layer][off:off+D])
				}
				scores[h*L+i] = s * p.Scale
			}
		}
	}
	for h := 0; h < p.NHead; h++ {
		kernels.Softmax(scores[h*L : (h+1)*L])
	}
	clear(out[:p.NHead*D])
	for i := 0; i < L; i++ {
		base := base(lo + i)
		for kh := 0; kh < p.NKVHead; kh++ {
			off := base + kh*D
			for g := 0; g < group; g++ {
				h := kh*group + g
				oh := out[h*D : (h+1)*D]
				w := scores[h*L+i]
				switch c.cfg.DType {
				case F32:
					kernels.AxpyF32(oh, w, c.v32[layer][off:off+D])
				case F16:
					kernels.AxpyF16(oh, w, c.v16[layer][off:off+D])
				default:
					kernels.AxpyBF16(oh, w, c.v16[layer][off:off+D])
				}
			}
		}
	}
	c.scratch.Put(sp)
}

var _ model.KVCache = (*Cache)(nil)

// ParallelAttend tells the model that Attend may run concurrently for
// different tokens once their K/V are stored: it reads the block tables
// and storage only, and its scratch comes from a sync.Pool.
func (c *Cache) ParallelAttend() bool { return true }

// Truncate shrinks seq to slots for its first n tokens: blocks wholly past n
// go back to the pool and hashes of blocks not wholly inside n are dropped.
// Speculative decoding uses it to roll back rejected draft tokens before
// Commit hashes them. Growing is Allocate's job; n beyond what seq holds
// changes nothing.
func (c *Cache) Truncate(seq int32, n int) {
	t := c.tables[seq]
	if t == nil || n >= t.filled {
		return
	}
	if n < 0 {
		n = 0
	}
	keep := max(c.blocksFor(n), t.dead)
	for i := len(t.blocks) - 1; i >= keep; i-- {
		c.pool.release(t.blocks[i])
	}
	t.blocks = t.blocks[:keep]
	if h := n / c.bs; len(t.hashes) > h {
		// The partly kept block h was registered with content that is now
		// rolled back: it will be rewritten, so it must leave the prefix
		// cache (a shared one is copied on write by Allocate instead).
		if h < len(t.blocks) && n%c.bs != 0 {
			if id := t.blocks[h]; id != released && c.pool.blocks[id].ref == 1 {
				c.pool.uncache(id)
			}
		}
		t.hashes = t.hashes[:h]
	}
	t.filled = n
}
