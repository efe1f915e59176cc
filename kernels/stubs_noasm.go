//go:build !amd64 || purego

package kernels

func setSIMD(string) {}

func init() { applyEnvISA() }

func usesPacked() bool { return false }

func spinPause() {}

func quantRowFast(pk *packed, row []float32, q []int8, st []float32, n, nt int) bool { return false }
