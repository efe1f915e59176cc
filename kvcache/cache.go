package kvcache

import (
	"fmt"
	"math"
	"strings"

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
//
// NLayer, NKVHead, HeadDim, DType and Window describe the usual single
// layer group (every layer alike); Groups, when set, replaces the shape
// with one spec per layer group, DType then being the default format.
type Config struct {
	NLayer, NKVHead, HeadDim int
	BlockSize                int   // tokens per block; 0 = 16
	NumBlocks                int   // 0 = as many as Bytes holds
	Bytes                    int64 // budget for K and V of all layers
	DType                    DType
	// KFormat and VFormat, when set, override DType for keys and values
	// of every group that names none: q8_0 keys with f16 values, say.
	KFormat, VFormat Format
	PrefixCache      bool // register full blocks for reuse across requests
	// Window > 0 is the model's sliding window (Mistral): a block whose
	// positions no later token can attend to is released as soon as the
	// sequence has computed past it, so a sequence holds about
	// Window/BlockSize+1 blocks however long it grows.
	Window int
	// Policy is the cache policy of every group that names none (nil: a
	// WindowPolicy for Window > 0, else FullPolicy).
	Policy Policy
	// Rope is the model's rotary embedding, needed by policies that move
	// positions (StreamingPolicy).
	Rope   *Rotary
	Groups []GroupSpec
	// Ops computes the attention (nil: kernels.Best()); kernels.Generic()
	// keeps a reference run in plain Go through the cache too.
	Ops *kernels.Ops
	// Events, when set, records the blocks that enter and leave the
	// prefix cache (events.go); the cache's owner flushes it each step.
	// A log serves one cache.
	Events *EventLog
	// FirstLayer is the model's layer index of this storage's layer 0:
	// a pipeline stage holds layers from there, and a policy that treats
	// layers by index (Quest's dense leading layers) counts the model's.
	FirstLayer int
}

// BlockBytes is the storage of one block over all layers, K and V.
func (c Config) BlockBytes() int64 {
	bs := c.BlockSize
	if bs == 0 {
		bs = DefaultBlockSize
	}
	var n int64
	for _, g := range c.groups() {
		n += g.blockBytes(bs)
		if m, ok := g.Policy.(policyBlockMeta); ok {
			n += m.blockMetaBytes(&g)
		}
	}
	return n
}

// policyBlockMeta is a policy that keeps data per physical block (Quest's key
// bounds): its bytes count in a block's size, so a byte budget holds
// fewer blocks rather than more memory than asked.
type policyBlockMeta interface{ blockMetaBytes(g *GroupSpec) int64 }

// seqTable is one sequence's view of the pool.
type seqTable struct {
	// blocks maps logical block i to a physical block; entries a policy
	// let go are released (-1), kept as holes so logical positions stay
	// where they were. Holes need not be a prefix: sinks keep block 0.
	blocks []int32
	hashes []uint64 // chain hashes of the leading full blocks
	filled int      // tokens the sequence has claimed slots for
	holes  int      // released entries of blocks
}

// released marks a block table entry whose block a policy let go.
const released = -1

// layerStore is one layer's K and V pages (V nil when K serves as both).
type layerStore struct {
	k, v  Pages
	group int
}

// Cache is the paged KV cache as one process runs it: the KV manager
// (block pool, block tables, prefix hashes, the policies' decisions) over
// its Storage (the pages, Store and Attend), which it embeds. The two meet
// only in the step's plan (plan.go): Plan on the manager's side writes
// where each row lives and what it sees, the storage loads that plan.
// It is not safe for concurrent mutation: one goroutine (the engine's)
// allocates and frees. Store and Attend may run concurrently with each
// other during a forward pass, as long as no table changes meanwhile.
type Cache struct {
	Storage
	cfg    Config
	pool   *Pool
	tables map[int32]*seqTable
	lossy  []bool       // per group: its policy drops positions on purpose
	own    model.KVPlan // the plan Begin makes for a batch that carries none

	// Policies is which policy each sequence runs (seqpolicy.go).
	Policies *SeqPolicies
	// Link, in a manager without storage, carries page copies and what
	// stateful policies must hear to the storage's side in each plan,
	// and takes their reports back (link.go); nil with the storage here.
	Link *Link
}

// New makes a KV manager over storage allocated for cfg.
func New(cfg Config) (*Cache, error) { return newCache(cfg, true) }

// NewManager makes the KV manager alone, with no pages: a scheduler whose
// storage is on other processes (they get each step's Plan). It allocates,
// shares, forks and plans as New's cache does; Begin fails. Policies fed
// by attention (H2O, SnapKV, Quest) run on the storage's side (a
// Follower), told through Link.
func NewManager(cfg Config) (*Cache, error) { return newCache(cfg, false) }

func newCache(cfg Config, storage bool) (*Cache, error) {
	cfg, groups, layers, err := prepare(cfg)
	if err != nil {
		return nil, err
	}
	c := &Cache{
		cfg:    cfg,
		pool:   NewPool(cfg.NumBlocks),
		tables: map[int32]*seqTable{},
		lossy:  make([]bool, len(groups)),
	}
	for gi, g := range groups {
		if l, ok := g.Policy.(Lossy); ok && l.Lossy() {
			c.lossy[gi] = true
		}
		if ck, ok := g.Policy.(interface{ Check() error }); ok {
			if err := ck.Check(); err != nil {
				return nil, err
			}
		}
		if _, ok := g.Policy.(QueryShifter); ok && (cfg.Rope == nil || cfg.Rope.HeadDim != g.KDim || 2*len(cfg.Rope.Freqs) > g.KDim) {
			return nil, fmt.Errorf("kvcache: policy %v moves positions and needs the model's rotary embedding for head dim %d (Config.Rope)", g.Policy, g.KDim)
		}
	}
	if !storage {
		layers = 0
		c.Link = &Link{c: c}
	}
	if err := c.Storage.init(cfg, groups, layers); err != nil {
		return nil, err
	}
	// Attention's hooks (observers, selectors, shifters) run the policy
	// each sequence is bound to.
	c.Policies = &SeqPolicies{c: c}
	c.Storage.route = func(gi int, seq int32) (Policy, bool) { return c.Policies.of(gi, seq), c.Policies.lossyOf(gi, seq) }
	for gi, g := range groups {
		if c.Link != nil {
			c.groups[gi].Policy = c.Link.stand(g.Policy)
		} else if a, ok := g.Policy.(attacher); ok {
			bound, err := a.attach(c, gi)
			if err != nil {
				return nil, err
			}
			c.groups[gi].Policy = bound
		}
	}
	c.Policies.init()
	if l := cfg.Events; l != nil {
		if l.BlockSize() != 0 {
			return nil, fmt.Errorf("kvcache: the event log already serves another cache")
		}
		l.attach(cfg.BlockSize)
		c.pool.events = l
	}
	return c, nil
}

// prepare checks cfg and fills its defaults (the block size, the block
// count from a byte budget), returning the layer groups and the number of
// layers.
func prepare(cfg Config) (Config, []GroupSpec, int, error) {
	if len(cfg.Groups) == 0 && (cfg.NLayer <= 0 || cfg.NKVHead <= 0 || cfg.HeadDim <= 0) {
		return cfg, nil, 0, fmt.Errorf("kvcache: bad shape: %d layers, %d kv heads, head dim %d", cfg.NLayer, cfg.NKVHead, cfg.HeadDim)
	}
	if cfg.BlockSize == 0 {
		cfg.BlockSize = DefaultBlockSize
	}
	if cfg.BlockSize < 0 {
		return cfg, nil, 0, fmt.Errorf("kvcache: block size %d", cfg.BlockSize)
	}
	if cfg.DType > BF16 {
		return cfg, nil, 0, fmt.Errorf("kvcache: unknown dtype %d", cfg.DType)
	}
	if cfg.Window < 0 {
		return cfg, nil, 0, fmt.Errorf("kvcache: sliding window %d", cfg.Window)
	}
	groups := cfg.groups()
	layerGroup, err := checkGroups(groups)
	if err != nil {
		return cfg, nil, 0, err
	}
	for _, g := range groups {
		if err := checkBlock(g.KFormat, cfg.BlockSize); err != nil {
			return cfg, nil, 0, err
		}
		if err := checkBlock(g.VFormat, cfg.BlockSize); g.VDim > 0 && err != nil {
			return cfg, nil, 0, err
		}
	}
	if cfg.NumBlocks == 0 {
		if cfg.Bytes <= 0 {
			return cfg, nil, 0, fmt.Errorf("kvcache: neither a block count nor a byte budget given")
		}
		cfg.NumBlocks = int(cfg.Bytes / cfg.BlockBytes())
		if cfg.NumBlocks == 0 {
			return cfg, nil, 0, fmt.Errorf("kvcache: budget %d bytes holds no block (a block takes %d bytes)", cfg.Bytes, cfg.BlockBytes())
		}
	}
	if cfg.NumBlocks < 0 {
		return cfg, nil, 0, fmt.Errorf("kvcache: %d blocks", cfg.NumBlocks)
	}
	return cfg, groups, len(layerGroup), nil
}

// Policy is the policy of layer group gi as the cache runs it: a copy
// bound to this cache for policies that keep state.
func (c *Cache) Policy(gi int) Policy { return c.groups[gi].Policy }

// NotePrompt tells the policies that seq's prompt is its first n tokens
// (SnapKV compresses the prompt when it has been computed), under the
// policy seq is bound to. The engine calls it at each admission of a
// sequence, after Bind; Free forgets it.
func (c *Cache) NotePrompt(seq int32, n int) {
	if c.Link != nil && c.Link.follows(seq) {
		c.Link.note(model.NotePrompt, seq, int32(n))
	}
	for gi := range c.groups {
		if p, ok := c.Policies.of(gi, seq).(prompter); ok {
			p.notePrompt(seq, n)
		}
	}
}

// PositionLimit is the largest position plus one the cache lets a model
// compute at: 0 (the model's context decides) unless every group's policy
// keeps relative distances bounded (Unbounded), then math.MaxInt32.
func (c *Cache) PositionLimit() int {
	for _, g := range c.groups {
		if u, ok := g.Policy.(Unbounded); !ok || !u.Unbounded() {
			return 0
		}
	}
	return math.MaxInt32
}

// Config is the configuration the cache was built with (defaults filled in).
func (c *Cache) Config() Config { return c.cfg }

// BlockSize is the tokens per block.
func (c *Cache) BlockSize() int { return c.bs }

// Pool is the block pool (for counters and invariant checks).
func (c *Cache) Pool() *Pool { return c.pool }

// blocksFor is the number of blocks n tokens take.
func (c *Cache) blocksFor(n int) int { return (n + c.bs - 1) / c.bs }

// dead is the logical blocks of seq that no query at position next or
// later attends in any layer group: what every group's policy releases.
func (c *Cache) dead(seq int32, next int) []Span {
	d := c.Policies.of(0, seq).Release(seq, next, c.bs, nil)
	for gi := 1; gi < len(c.groups); gi++ {
		if len(d) == 0 {
			break
		}
		d = intersect(d, c.Policies.of(gi, seq).Release(seq, next, c.bs, nil))
	}
	return d
}

// isDead reports whether logical block i is inside the spans d.
func isDead(d []Span, i int) bool {
	for _, s := range d {
		if i >= s.From && i < s.To {
			return true
		}
	}
	return false
}

// MaxSeqBlocks is the most blocks one sequence holds while computing a
// step of chunk tokens when the policies release blocks (0 when one of
// them releases none: the bound is then the whole sequence). With several
// groups the bounds add up, an overestimate: a block is held while any
// group still needs it.
func (c *Cache) MaxSeqBlocks(chunk int) int {
	n := 0
	for _, g := range c.groups {
		m := g.Policy.MaxBlocks(chunk, c.bs)
		if m <= 0 {
			return 0
		}
		n += m
	}
	return n
}

// slide releases the blocks of t that no token at position next or later
// can attend to. A registered block released here stays in the prefix
// cache (at the tail of the free queue) for other requests to reuse.
func (c *Cache) slide(seq int32, t *seqTable, next int) {
	for _, s := range c.dead(seq, next) {
		for i := max(s.From, 0); i < min(s.To, len(t.blocks)); i++ {
			if t.blocks[i] != released {
				c.pool.release(t.blocks[i])
				t.blocks[i] = released
				t.holes++
			}
		}
	}
}

// Lookup returns the blocks of the longest cached prefix of tokens, whole
// blocks only, and at most len(tokens)-1 tokens: the last token is always
// recomputed so the model yields its logits. It changes nothing; pass the
// result to Allocate to claim the blocks.
func (c *Cache) Lookup(tokens []int32, extra uint64) []int32 {
	return c.LookupSeq(-1, tokens, extra)
}

// LookupSeq is Lookup for sequence seq, under the policy it is bound to
// (Bind): its hit limit and its hash namespace. seq -1 (or any unbound
// sequence) looks up under the default policy.
func (c *Cache) LookupSeq(seq int32, tokens []int32, extra uint64) []int32 {
	if !c.cfg.PrefixCache || len(tokens) < 2 {
		return nil
	}
	var hit []int32
	var h uint64
	limit := len(tokens) - 1
	for gi := range c.groups {
		if l, ok := c.Policies.of(gi, seq).(hitLimiter); ok {
			limit = min(limit, l.hitLimit(len(tokens)))
		}
	}
	for i := 0; (i+1)*c.bs <= limit; i++ {
		blk := tokens[i*c.bs : (i+1)*c.bs]
		x := c.Policies.blockExtra(seq, i, extra)
		h = BlockHash(h, blk, x)
		id, ok := c.pool.lookup(h, blk, x)
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
	var dead []Span
	if len(hit) > 0 {
		dead = c.dead(seq, from)
	}
	for i, id := range hit {
		if !isDead(dead, i) && c.pool.blocks[id].ref == 0 {
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
	var dead []Span
	if len(hit) > 0 {
		dead = c.dead(seq, from)
	}
	for i, id := range hit {
		t.hashes = append(t.hashes, c.pool.blocks[id].hash)
		if isDead(dead, i) {
			t.blocks = append(t.blocks, released)
			t.holes++
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
		if c.Link != nil {
			c.Link.note(model.NoteCopy, nb, old)
		}
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
// on) and then releases the blocks the policies say no later token
// attends (a sliding window, sinks). Registration comes first, so a released block
// stays reusable by other requests.
func (c *Cache) Commit(seq int32, tokens []int32, computed int, extra uint64) {
	t := c.tables[seq]
	if t == nil {
		return
	}
	if c.Link != nil {
		c.Link.committed(seq, computed)
	}
	for gi := range c.groups {
		if tr, ok := c.Policies.of(gi, seq).(Tracker); ok {
			tr.Committed(seq, computed)
		}
	}
	if c.cfg.PrefixCache {
		n := min(computed, len(tokens))
		for gi := range c.groups {
			if s, ok := c.Policies.of(gi, seq).(Sealer); ok {
				n = min(n, s.Sealed(seq))
			}
		}
		for i := len(t.hashes); (i+1)*c.bs <= n && i < len(t.blocks); i++ {
			var parent uint64
			if i > 0 {
				parent = t.hashes[i-1]
			}
			blk := tokens[i*c.bs : (i+1)*c.bs]
			x := c.Policies.blockExtra(seq, i, extra)
			h := BlockHash(parent, blk, x)
			t.hashes = append(t.hashes, h)
			// A block released before it was registered (a prefix hit
			// beyond the window) still extends the chain.
			if id := t.blocks[i]; id != released {
				c.pool.register(id, h, parent, i > 0, blk, x)
			}
		}
	}
	c.slide(seq, t, computed)
}

// Free releases all of seq's blocks. The tail blocks go back to the free
// queue first, so a cached prefix outlives its own continuation.
// Its policy state and its binding to a policy (Bind) go too.
func (c *Cache) Free(seq int32) {
	if c.Link != nil {
		c.Link.truncated(seq, 0)
	}
	c.track(seq, func(tr Tracker) { tr.Truncated(seq, 0) })
	c.Policies.unbind(seq)
	t := c.tables[seq]
	if t == nil {
		return
	}
	for i := len(t.blocks) - 1; i >= 0; i-- {
		if t.blocks[i] != released {
			c.pool.release(t.blocks[i])
		}
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
		holes:  p.holes,
	}
	for _, id := range t.blocks {
		if id != released {
			c.pool.touch(id)
		}
	}
	c.tables[child] = t
	c.Policies.forkBinding(parent, child)
	c.track(parent, func(tr Tracker) { tr.Forked(parent, child) })
	if c.Link != nil {
		c.Link.forked(parent, child)
	}
	return nil
}

// track calls fn for every group policy of seq that keeps per-sequence state.
func (c *Cache) track(seq int32, fn func(Tracker)) {
	for gi := range c.groups {
		if tr, ok := c.Policies.of(gi, seq).(Tracker); ok {
			fn(tr)
		}
	}
}

// Table returns seq's block ids (shared; do not modify); entries a policy
// released are -1.
func (c *Cache) Table(seq int32) []int32 {
	if t := c.tables[seq]; t != nil {
		return t.blocks
	}
	return nil
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
		u.Filled += t.filled - t.holes*c.bs
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
		dead := c.dead(seq, t.filled)
		holes := 0
		for i, id := range t.blocks {
			if id == released {
				if !isDead(dead, i) {
					return fmt.Errorf("kvcache: sequence %d released block %d, which its policy still attends at %d tokens", seq, i, t.filled)
				}
				holes++
				continue
			}
			if id < 0 || int(id) >= len(refs) {
				return fmt.Errorf("kvcache: sequence %d holds bad block %d", seq, id)
			}
			refs[id]++
		}
		if holes != t.holes {
			return fmt.Errorf("kvcache: sequence %d has %d released blocks, counter says %d", seq, holes, t.holes)
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
	c.track(seq, func(tr Tracker) { tr.Truncated(seq, n) })
	if c.Link != nil {
		c.Link.truncated(seq, n)
	}
	keep := c.blocksFor(n)
	for i := len(t.blocks) - 1; i >= keep; i-- {
		if t.blocks[i] == released {
			t.holes--
		} else {
			c.pool.release(t.blocks[i])
		}
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

// MapKeys rewrites the stored keys of positions [from, to) of seq in every
// layer: fn edits each key row (all KV heads, as float32) in place and the
// format stores it back, requantizing where it quantizes. Keys are stored
// with RoPE applied, so this is how kept keys move to new positions
// (llama.cpp's context shift: RoPE at p-d is RoPE by -d of RoPE at p).
// Released positions are skipped. Call it between forward passes; a block
// shared with another sequence or registered in the prefix cache is
// rewritten for every holder, so the caller must own it alone.
func (c *Cache) MapKeys(seq int32, from, to int, fn func(layer, pos int, k []float32)) error {
	t := c.tables[seq]
	if t == nil {
		return fmt.Errorf("kvcache: sequence %d has no blocks", seq)
	}
	if from < 0 || to > t.filled || from > to {
		return fmt.Errorf("kvcache: positions [%d, %d) outside the %d of sequence %d", from, to, t.filled, seq)
	}
	for l := range c.layers {
		if _, ok := c.layers[l].k.(*mergedPages); ok {
			return fmt.Errorf("kvcache: layer %d's keys are merged with another layer's (MiniCache): they cannot be rewritten one layer at a time", l)
		}
	}
	var row []float32
	for l := range c.layers {
		ls := &c.layers[l]
		g := &c.groups[ls.group]
		row = append(row[:0], make([]float32, g.NKVHead*g.KDim)...)
		for pos := from; pos < to; pos++ {
			id := t.blocks[pos/c.bs]
			if id == released {
				continue
			}
			ls.k.Get(int(id), pos%c.bs, row)
			fn(l, pos, row)
			ls.k.Put(int(id), pos%c.bs, row)
		}
	}
	return nil
}
