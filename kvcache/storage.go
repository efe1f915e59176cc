package kvcache

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"

	"pagoda/kernels"
	"pagoda/model"
)

// Storage is the worker's half of the KV cache: every layer's pages in
// their formats, Store and Attend over a step whose rows its plan laid out
// (plan.go), the policies' attention hooks, and export/import of pages
// (export.go). It keeps no block tables and allocates nothing: which page
// holds what is the KV manager's business (Cache), and reaches the storage
// only through the step's plan, so a storage on another process runs the
// same steps.
type Storage struct {
	bs     int
	npages int
	groups []GroupSpec
	layers []layerStore
	ops    *kernels.Ops
	rope   *Rotary

	step step // the batch Begin prepared
	// written counts, per page, the steps and copies that wrote into it:
	// what a page's derived data (Quest's key bounds) is stamped with,
	// on whichever side of a process boundary the storage is.
	written []uint32
	scratch sync.Pool

	// route is the policy a sequence runs in a layer group, for the hooks
	// attention calls (score observers, page selectors, query shifters),
	// and whether it drops positions on purpose; nil: the group's own. In
	// one process the manager routes sequences bound to policies of their
	// own.
	route func(gi int, seq int32) (Policy, bool)

	mem     *PageMem // the pages' memory, outside the Go heap (pagemem.go)
	cleanup runtime.Cleanup
	closed  bool
}

// NewStorage allocates storage alone for cfg: a worker's, which runs the
// steps a KV manager elsewhere planned (Begin refuses a batch without a
// plan). Policies that keep state need their manager in this process.
func NewStorage(cfg Config) (*Storage, error) {
	cfg, groups, layers, err := prepare(cfg)
	if err != nil {
		return nil, err
	}
	kv := new(Storage)
	if err := kv.init(cfg, groups, layers); err != nil {
		return nil, err
	}
	return kv, nil
}

// init allocates the pages of every layer: the one place the storage's
// memory comes from.
func (kv *Storage) init(cfg Config, groups []GroupSpec, layers int) error {
	kv.bs, kv.npages, kv.groups, kv.rope, kv.ops = cfg.BlockSize, cfg.NumBlocks, groups, cfg.Rope, cfg.Ops
	if kv.ops == nil {
		kv.ops = kernels.Best()
	}
	kv.layers = make([]layerStore, layers)
	if layers == 0 { // a KV manager alone (NewManager)
		return nil
	}
	kv.written = make([]uint32, cfg.NumBlocks)
	for _, g := range groups {
		if int64(cfg.NumBlocks)*int64(kv.bs*g.NKVHead*max(g.KDim, g.VDim)) > math.MaxInt32*8 {
			return fmt.Errorf("kvcache: %d blocks of %d tokens × %d kv heads × %d per layer is too large", cfg.NumBlocks, kv.bs, g.NKVHead, max(g.KDim, g.VDim))
		}
	}
	kv.newPageMem()
	for gi, g := range groups {
		for _, l := range g.Layers {
			ls := &kv.layers[l]
			ls.group = gi
			ls.k = g.KFormat.NewPages(cfg.NumBlocks, kv.bs, g.NKVHead, g.KDim, kv.ops, kv.mem)
			if g.VDim > 0 {
				ls.v = g.VFormat.NewPages(cfg.NumBlocks, kv.bs, g.NKVHead, g.VDim, kv.ops, kv.mem)
			}
		}
	}
	if err := kv.mem.Err(); err != nil {
		kv.Close()
		return fmt.Errorf("kvcache: %d blocks of KV pages: %w", cfg.NumBlocks, err)
	}
	return nil
}

// Begin implements model.KVCache for a batch that carries its plan.
func (kv *Storage) Begin(b *model.Batch) error {
	if b.KV == nil {
		return errors.New("kvcache: a step without a KV plan reached storage with no KV manager")
	}
	if len(b.KV.Notes) > 0 {
		return errors.New("kvcache: a plan with notes (page copies, policy state) reached storage that does not follow its manager (use NewFollower)")
	}
	return kv.load(b, b.KV)
}

// policyOf is the policy seq runs in group gi.
func (kv *Storage) policyOf(gi int, seq int32) Policy {
	if kv.route != nil {
		p, _ := kv.route(gi, seq)
		return p
	}
	return kv.groups[gi].Policy
}

// lossyOf reports whether seq's policy in group gi drops positions on
// purpose.
func (kv *Storage) lossyOf(gi int, seq int32) bool {
	if kv.route != nil {
		_, lossy := kv.route(gi, seq)
		return lossy
	}
	l, ok := kv.groups[gi].Policy.(Lossy)
	return ok && l.Lossy()
}

// copyBlock copies page src over page dst in every layer (copy-on-write).
func (kv *Storage) copyBlock(dst, src int32) {
	if kv.written == nil { // a manager alone: the Follower copies
		return
	}
	kv.written[dst]++
	for _, ls := range kv.layers {
		ls.k.CopyPage(int(dst), int(src))
		if ls.v != nil {
			ls.v.CopyPage(int(dst), int(src))
		}
	}
}
