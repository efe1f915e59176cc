package kernels

import (
	"sync/atomic"
	"unsafe"
)

// PrepackStack is Prepack for a stack of matrices read together, such as
// one layer's mixture-of-experts tensor (a 3-D tensor's slices): their
// packed layouts share one allocation, backed by 2 MB pages where the
// kernel allows. One expert's matrix is often under 2 MB, too small for
// Prepack to give it huge pages, and a decode step streams a few of them
// per layer: with 4 KB pages each page costs a TLB miss and a restart of
// the prefetcher. Matrices already packed are left as they are.
func (o *Ops) PrepackStack(p *Pool, ms []*Matrix) {
	if !o.packed || len(ms) == 0 {
		return
	}
	slot := packSlot(o.avx2)
	pks := make([]*packed, len(ms))
	total := 0
	for i, m := range ms {
		if atomic.LoadPointer(&m.pk[slot]) != nil {
			continue
		}
		m.mustValid()
		pks[i] = pack(p, m, o.avx2)
		if pks[i] != noPack {
			total += align64(len(pks[i].data))
		}
	}
	buf := allocWeights(total)
	off := 0
	for i, pk := range pks {
		if pk == nil {
			continue
		}
		if pk != noPack {
			n := len(pk.data)
			copy(buf[off:off+n], pk.data)
			pk.data = buf[off : off+n : off+n]
			off += align64(n)
		}
		atomic.StorePointer(&ms[i].pk[slot], unsafe.Pointer(pk))
	}
	settleWeights(buf)
}

func align64(n int) int { return (n + 63) &^ 63 }
