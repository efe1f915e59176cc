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

// vnniPeakLoop runs n iterations of 16 independent VPDPBUSD (peak_amd64.s)
// and returns lane 0 of their sum (64·n) to keep them live.
//
//go:noescape
func vnniPeakLoop(n int) int32
