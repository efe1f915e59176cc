//go:build !linux

package mmapfile

// Release is a no-op where the pages of a mapping are not released
// explicitly (or Map read the file into memory).
func Release(b []byte) {}
