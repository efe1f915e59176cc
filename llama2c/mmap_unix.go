//go:build linux || darwin

package llama2c

import (
	"fmt"
	"os"
	"syscall"
)

// mapFile maps size bytes of fd read-only. The mapping outlives fd.
func mapFile(fd *os.File, size int) ([]byte, func() error, error) {
	b, err := syscall.Mmap(int(fd.Fd()), 0, size, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("mmap: %w", err)
	}
	return b, func() error { return syscall.Munmap(b) }, nil
}
