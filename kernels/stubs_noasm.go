//go:build !amd64 || purego

package kernels

import "unsafe"

// availableISAs is the generic set alone: this build has no assembly.
func availableISAs() []*Ops { return []*Ops{newGeneric()} }

func spinPause() {}

func quantRowFast(pk *packed, row []float32, q []int8, st []float32, n, nt int) bool { return false }

func prefetchRows(p unsafe.Pointer, n, stride, lines int) {}
