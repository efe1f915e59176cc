//go:build amd64 && !purego

package kernels

func setSIMD(string) {}
