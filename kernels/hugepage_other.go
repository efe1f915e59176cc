//go:build !linux

package kernels

// weightMem owns an allocation of packed weights; elsewhere than Linux
// they live in the Go heap and it owns nothing.
type weightMem struct{}

func allocWeights(n int) ([]byte, *weightMem) { return make([]byte, n), nil }

func settleWeights([]byte) {}
