package kvcache

import "fmt"

// slotCopier is Pages whose rows copy as stored, bit for bit: a slot move
// then loses nothing (a Get/Put round trip would requantize).
type slotCopier interface {
	CopySlot(dstPage, dstSlot, srcPage, srcSlot int)
}

func (p *floatPages[E]) CopySlot(dp, ds, sp, ss int) {
	d, s := dp*p.pageLen+ds*p.rowLen, sp*p.pageLen+ss*p.rowLen
	copy(p.data[d:d+p.rowLen], p.data[s:s+p.rowLen])
}

func (p *blockPages) CopySlot(dp, ds, sp, ss int) {
	d, s := dp*p.pageBytes+ds*p.rowBytes, sp*p.pageBytes+ss*p.rowBytes
	copy(p.data[d:d+p.rowBytes], p.data[s:s+p.rowBytes])
}

// ExactSlotMoves reports whether the storage cfg describes copies every
// layer's rows exactly when a step moves slots: true for float and ggml
// block formats, false for formats that keep per-page or per-sequence
// state (KIVI's groups, merged layers, channel statistics), which a moved
// row would leave stale. Whoever plans trees asks before planning one.
func (cfg Config) ExactSlotMoves() bool {
	ok := func(f Format) bool {
		switch f.(type) {
		case nil, DType, BlockFormat:
			return true
		}
		return false
	}
	return ok(cfg.KFormat) && ok(cfg.VFormat)
}

// exactMoves reports whether every layer's pages copy rows exactly.
func exactMoves(layers []layerStore) bool {
	for _, ls := range layers {
		if _, ok := ls.k.(slotCopier); !ok {
			return false
		}
		if _, ok := ls.v.(slotCopier); ls.v != nil && !ok {
			return false
		}
	}
	return true
}

// MoveSlots copies, in every layer, the K/V rows of slot pairs[2i] over
// slot pairs[2i+1] (slots are page·BlockSize + offset), in order: how a
// verified speculation tree's accepted path is compacted into the
// positions that follow the sequence. It implements executor.SlotMover.
func (kv *Storage) MoveSlots(pairs []int32) error {
	if kv.closed {
		return ErrClosed
	}
	if len(pairs)%2 != 0 {
		return fmt.Errorf("kvcache: %d slot-move entries are not pairs", len(pairs))
	}
	if !exactMoves(kv.layers) {
		return fmt.Errorf("kvcache: this KV format cannot move slots exactly")
	}
	n := int32(kv.npages) * int32(kv.bs)
	for i := 0; i < len(pairs); i += 2 {
		if s, d := pairs[i], pairs[i+1]; s < 0 || d < 0 || s >= n || d >= n {
			return fmt.Errorf("kvcache: slot move %d → %d outside %d slots", s, d, n)
		}
	}
	bs := int32(kv.bs)
	for i := 0; i < len(pairs); i += 2 {
		s, d := pairs[i], pairs[i+1]
		kv.written[d/bs]++
		for _, ls := range kv.layers {
			ls.k.(slotCopier).CopySlot(int(d/bs), int(d%bs), int(s/bs), int(s%bs))
			if ls.v != nil {
				ls.v.(slotCopier).CopySlot(int(d/bs), int(d%bs), int(s/bs), int(s%bs))
			}
		}
	}
	return nil
}
