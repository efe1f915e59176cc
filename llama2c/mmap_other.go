//go:build !linux && !darwin

package llama2c

import (
	"fmt"
	"io"
	"os"
)

// mapFile reads the file into memory where mmap is not wired up.
func mapFile(fd *os.File, size int) ([]byte, func() error, error) {
	b := make([]byte, size)
	if _, err := io.ReadFull(fd, b); err != nil {
		return nil, nil, fmt.Errorf("read: %w", err)
	}
	return b, func() error { return nil }, nil
}
