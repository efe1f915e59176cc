//go:build !amd64 || purego

package kernels

func setSIMD(string) {}

func usesPacked() bool { return false }

func spinPause() {}
