package kvcache

// BlockState is what a physical block is doing, for pictures of the pool.
type BlockState uint8

const (
	BlockFree   BlockState = iota // unreferenced, nothing reusable in it
	BlockCached                   // unreferenced but holding a reusable prefix
	BlockUsed                     // referenced by one or more sequences
	BlockShared                   // referenced and registered in the prefix cache (shareable)
)

// BlockMap is a copy of the pool's block states: State[i] and Owner[i]
// describe physical block i. Owner is the lowest sequence id holding the
// block (the same block may back several sequences), -1 when none does.
type BlockMap struct {
	BlockSize int
	State     []BlockState
	Owner     []int32
	// Hashes are the chain hashes of the blocks in the prefix cache (the
	// BlockCached and BlockShared ones, in block order): what the KV
	// events say this cache holds.
	Hashes []uint64
}

// Blocks copies the block states, reusing m's slices. It costs O(blocks +
// block-table entries), so callers take it on demand, not every step.
func (c *Cache) Blocks(m *BlockMap) {
	n := len(c.pool.blocks)
	m.BlockSize = c.bs
	m.State = resize(m.State, n)
	m.Owner = resize(m.Owner, n)
	m.Hashes = c.pool.Hashes(m.Hashes[:0])
	for i := range c.pool.blocks {
		b := &c.pool.blocks[i]
		switch {
		case b.ref > 0 && b.hashed:
			m.State[i] = BlockShared
		case b.ref > 0:
			m.State[i] = BlockUsed
		case b.hashed:
			m.State[i] = BlockCached
		default:
			m.State[i] = BlockFree
		}
		m.Owner[i] = -1
	}
	for seq, t := range c.tables {
		for _, id := range t.blocks {
			if id != released && (m.Owner[id] < 0 || seq < m.Owner[id]) {
				m.Owner[id] = seq
			}
		}
	}
}

func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}
