//go:build amd64 && !purego

package kernels

func setFloatAVX2() {}
