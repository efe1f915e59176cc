//go:build !linux && !darwin

// Package mmapfile maps model files read-only, so weights are paged in on
// demand instead of copied; the checkpoint readers (gguf, safetensors,
// llama2c) share it. It also maps the anonymous memory the KV cache's
// pages live in, outside the Go heap (Anon).
package mmapfile

import (
	"fmt"
	"io"
	"os"
)

// Map reads the file into memory where mmap is not wired up.
func Map(fd *os.File, size int) ([]byte, func() error, error) {
	b := make([]byte, size)
	if _, err := io.ReadFull(fd, b); err != nil {
		return nil, nil, fmt.Errorf("read: %w", err)
	}
	return b, func() error { return nil }, nil
}

// Anon allocates size zero bytes on the Go heap where anonymous mappings
// are not wired up; the returned function only drops nothing.
func Anon(size int) ([]byte, func() error, error) {
	if size <= 0 {
		return nil, func() error { return nil }, nil
	}
	return make([]byte, size), func() error { return nil }, nil
}
