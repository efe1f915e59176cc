//go:build amd64 && !purego

package kernels

import "unsafe"

// spinPause is the PAUSE hint for spin-wait loops.
func spinPause()

// prefetchRows asks for the first lines cache lines of each of n rows,
// stride bytes apart from p, to be brought towards the core (L2). A
// prefetch never faults, so rows past an allocation are harmless, but p
// itself must lie inside one.
//
//go:noescape
func prefetchRows(p unsafe.Pointer, n, stride, lines int)
