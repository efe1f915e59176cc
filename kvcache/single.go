package kvcache

import (
	"fmt"

	"pagoda/model"
)

// Single is a paged cache holding one sequence (id 0) for the single-user
// paths (run, score, bench): it claims blocks as positions arrive, so any
// KV format can stand in for the flat f32 cache.
type Single struct {
	*Cache
	done int // positions computed by the passes so far
}

// NewSingle sizes a cache for one sequence of up to maxLen tokens of a
// model of config c, storing keys in k and values in v (nil: f16), with
// the format's block size.
func NewSingle(c *model.Config, k, v Format, maxLen int) (*Single, error) {
	if k == nil {
		k = F16
	}
	if v == nil {
		v = F16
	}
	bs := max(FormatBlockSize(k), FormatBlockSize(v))
	cache, err := New(Config{NLayer: c.NLayer, NKVHead: c.NKVHead, HeadDim: c.HeadDim, BlockSize: bs,
		NumBlocks: (maxLen+bs-1)/bs + 1, KFormat: k, VFormat: v, Window: c.SlidingWindow})
	if err != nil {
		return nil, err
	}
	return &Single{Cache: cache}, nil
}

// Begin implements model.KVCache: it claims blocks up to the batch's last
// position and lets a sliding window release what the last pass left.
func (s *Single) Begin(b *model.Batch) error {
	if s.done > 0 {
		s.Commit(0, nil, s.done, 0)
	}
	hi := 0
	for i, p := range b.Pos {
		if b.Seq[i] != 0 {
			return fmt.Errorf("kvcache: single-sequence cache given sequence %d", b.Seq[i])
		}
		hi = max(hi, int(p)+1)
	}
	if hi > 0 && !s.Allocate(0, nil, min(s.done, hi), hi) {
		return fmt.Errorf("kvcache: no room for position %d (%d blocks of %d)", hi-1, s.pool.NumBlocks(), s.bs)
	}
	if err := s.Cache.Begin(b); err != nil {
		return err
	}
	s.done = max(s.done, hi)
	return nil
}

// HeldBytes is the KV storage the sequence holds now: its blocks and any
// residual rows beside the pool.
func (s *Single) HeldBytes() int64 {
	return int64(s.Usage().Used)*s.cfg.BlockBytes() + s.ExtraBytes()
}
