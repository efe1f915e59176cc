package kernels

import (
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

const hugePage = 2 << 20

// weightMem owns an allocation of packed weights made outside the Go heap;
// the mapping is released when the last packed layout in it (each holds
// the owner) is unreachable.
type weightMem struct{ n int }

// allocWeights returns n zero bytes for packed weights and the allocation's
// owner, which the packed layouts using the bytes must keep alive.
//
// Layouts of 2 MB and more are mapped outside the Go heap, on a 2 MB
// boundary and advised to use 2 MB pages where the kernel allows: batch-1
// products stream every weight byte once per token, and with 4 KB pages
// each page costs a TLB miss and a restart of the hardware prefetcher
// (which stops at 4 KB boundaries). Outside the heap, the weights neither
// raise the garbage collector's heap goal (with GOGC=100 a heap holding
// 600 MB of live weights lets 600 MB of garbage build up before a
// collection) nor need zeroing by the runtime. Small matrices are not worth
// the up-to-2 MB of address space and stay in the heap.
func allocWeights(n int) ([]byte, *weightMem) {
	if n < hugePage {
		return make([]byte, n), nil
	}
	full, err := unix.Mmap(-1, 0, n+hugePage, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		// Out of address space or a mapping limit: the heap may still
		// manage, and fails loudly if not.
		return heapWeights(n), nil
	}
	off := (hugePage - int(uintptr(unsafe.Pointer(&full[0]))%hugePage)) % hugePage
	data := full[off : off+n : off+n]
	// Errors only mean 4 KB pages (THP disabled, old kernel). The slack
	// before and after data is never touched, so it costs no memory.
	_ = unix.Madvise(data[:n/hugePage*hugePage], unix.MADV_HUGEPAGE)
	mem := &weightMem{n: len(full)}
	runtime.AddCleanup(mem, func(b []byte) { _ = unix.Munmap(b) }, full)
	return data, mem
}

// heapWeights is allocWeights in the Go heap, over-allocated to start on a
// 2 MB boundary.
func heapWeights(n int) []byte {
	buf := make([]byte, n+hugePage)
	off := (hugePage - int(uintptr(unsafe.Pointer(&buf[0]))%hugePage)) % hugePage
	data := buf[off : off+n : off+n]
	_ = unix.Madvise(data[:n/hugePage*hugePage], unix.MADV_HUGEPAGE)
	return data
}

// settleWeights asks the kernel to back data (from allocWeights, now
// written) with huge pages at once rather than when khugepaged gets to it:
// pages written before the advice took effect (or the Go heap's reused
// memory) may be 4 KB ones.
func settleWeights(data []byte) {
	if len(data) < hugePage || uintptr(unsafe.Pointer(&data[0]))%hugePage != 0 {
		return
	}
	_ = unix.Madvise(data[:len(data)/hugePage*hugePage], unix.MADV_COLLAPSE)
}
