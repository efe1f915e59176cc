//go:build linux || darwin

// Package mmapfile maps model files read-only, so weights are paged in on
// demand instead of copied; the checkpoint readers (gguf, safetensors,
// llama2c) share it. It also maps the anonymous memory the KV cache's
// pages live in, outside the Go heap (Anon).
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

// Anon maps size bytes of private anonymous memory, read-write, outside
// the Go heap: the garbage collector neither scans it nor counts it in its
// goal, and the kernel commits a page only when it is first written, so
// resident memory follows use rather than the reservation. The bytes read
// as zero. The caller must store no Go pointers in it and must not touch
// it after calling the returned function, which unmaps it.
func Anon(size int) ([]byte, func() error, error) {
	if size <= 0 {
		return nil, func() error { return nil }, nil
	}
	b, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return nil, nil, fmt.Errorf("mmap %d anonymous bytes: %w", size, err)
	}
	return b, func() error { return syscall.Munmap(b) }, nil
}
