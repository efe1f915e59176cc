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
	// Plan every layout first and pack each straight into its place in
	// the shared allocation: no matrix is packed twice or copied.
	pks := make([]*packed, len(ms))
	total := 0
	for i, m := range ms {
		if atomic.LoadPointer(&m.pk[slot]) != nil {
			continue
		}
		m.mustValid()
		pks[i] = planPack(m, o.avx2)
		if pks[i] != noPack {
			total += align64(pks[i].size())
		}
	}
	buf, mem := allocWeights(total)
	off := 0
	for i, pk := range pks {
		if pk == nil {
			continue
		}
		if pk != noPack {
			n := pk.size()
			pk.data, pk.mem = buf[off:off+n:off+n], mem
			off += align64(n)
			fillPack(p, ms[i], pk)
		}
		atomic.StorePointer(&ms[i].pk[slot], unsafe.Pointer(pk))
	}
	settleWeights(buf)
}

func align64(n int) int { return (n + 63) &^ 63 }
