//go:build linux || darwin

// Package mmapfile maps model files read-only, so weights are paged in on
// demand instead of copied; the checkpoint readers (gguf, safetensors,
// llama2c) share it.
package mmapfile

import (
	"fmt"
	"os"
	"syscall"
)

// Map maps size bytes of fd read-only and returns the bytes and the function
// that unmaps them. The mapping outlives fd.
func Map(fd *os.File, size int) ([]byte, func() error, error) {
	b, err := syscall.Mmap(int(fd.Fd()), 0, size, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("mmap: %w", err)
	}
	return b, func() error { return syscall.Munmap(b) }, nil
}
