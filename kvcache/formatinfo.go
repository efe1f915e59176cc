package kvcache

// grouped is a Format whose pages are quantization groups of a fixed
// number of tokens (KIVI's per-channel keys): the cache's block size must
// equal it.
type grouped interface{ GroupSize() int }

// FormatBlockSize is the block size a cache storing f should use: the
// format's group for a grouped format, DefaultBlockSize otherwise.
func FormatBlockSize(f Format) int {
	if g, ok := f.(grouped); ok {
		return g.GroupSize()
	}
	return DefaultBlockSize
}

// extraBytes is Pages that hold storage outside the block pool (KIVI's
// full-precision residual windows).
type extraBytes interface{ ExtraBytes() int64 }

// ExtraBytes is the KV storage held outside the block pool right now, over
// all layers: the full-precision residual rows of formats that keep the
// most recent tokens unquantized. Pool blocks times Config.BlockBytes plus
// this is everything the cache holds.
func (c *Cache) ExtraBytes() int64 {
	var n int64
	for _, ls := range c.layers {
		for _, p := range []Pages{ls.k, ls.v} {
			if e, ok := p.(extraBytes); ok {
				n += e.ExtraBytes()
			}
		}
	}
	return n
}
