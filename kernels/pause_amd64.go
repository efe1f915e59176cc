//go:build amd64 && !purego

package kernels

// spinPause is the PAUSE hint for spin-wait loops.
func spinPause()
