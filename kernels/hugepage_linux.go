package kernels

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

const hugePage = 2 << 20

// allocWeights returns n zero bytes for packed weights, backed by 2 MB
// pages where the kernel allows: batch-1 products stream every weight byte
// once per token, and with 4 KB pages each page costs a TLB miss and a
// restart of the hardware prefetcher (which stops at 4 KB boundaries).
// Small matrices are not worth the up-to-2 MB of padding.
func allocWeights(n int) []byte {
	if n < hugePage {
		return make([]byte, n)
	}
	buf := make([]byte, n+hugePage)
	off := (hugePage - int(uintptr(unsafe.Pointer(&buf[0]))%hugePage)) % hugePage
	data := buf[off : off+n : off+n]
	// Errors only mean 4 KB pages (THP disabled, old kernel).
	_ = unix.Madvise(data[:n/hugePage*hugePage], unix.MADV_HUGEPAGE)
	return data
}

// settleWeights asks the kernel to back data (from allocWeights, now
// written) with huge pages at once rather than when khugepaged gets to it:
// the Go heap may have zeroed reused memory, faulting in 4 KB pages, before
// allocWeights could advise.
func settleWeights(data []byte) {
	if len(data) < hugePage || uintptr(unsafe.Pointer(&data[0]))%hugePage != 0 {
		return
	}
	_ = unix.Madvise(data[:len(data)/hugePage*hugePage], unix.MADV_COLLAPSE)
}
