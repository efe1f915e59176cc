package mmapfile

import (
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Release drops the whole pages inside b, a part of a mapping from Map,
// from the process's resident memory: the kernel's page cache keeps them
// and the mapping stays valid, so a later read faults them back in from
// the file. Loaders call it once they have copied a tensor elsewhere (a
// repacked layout), so that the file's bytes are not resident twice. The
// partial pages at either end, shared with neighbouring data, stay.
func Release(b []byte) {
	if len(b) == 0 {
		return
	}
	ps := uintptr(os.Getpagesize())
	start := uintptr(unsafe.Pointer(&b[0]))
	lo := (start + ps - 1) &^ (ps - 1)
	hi := (start + uintptr(len(b))) &^ (ps - 1)
	if hi <= lo {
		return
	}
	_ = unix.Madvise(b[lo-start:hi-start], unix.MADV_DONTNEED)
}
