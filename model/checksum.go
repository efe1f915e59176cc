package model

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
)

// FileChecksum is the hex SHA-256 identity of a model as stored: of the
// file's bytes, or, for a directory (a Hugging Face checkpoint), of each
// regular file's name and bytes in name order. Side files trained for one
// target (Medusa heads, an EAGLE draft layer) record it, so they are
// refused with any other target.
func FileChecksum(path string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	if !st.IsDir() {
		if err := hashFile(h, path); err != nil {
			return "", err
		}
		return hex.EncodeToString(h.Sum(nil)), nil
	}
	ents, err := os.ReadDir(path)
	if err != nil {
		return "", err
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		if e.Type().IsRegular() {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	for _, n := range names {
		fmt.Fprintf(h, "%d:%s", len(n), n)
		if err := hashFile(h, filepath.Join(path, n)); err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func hashFile(h io.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(h, f)
	return err
}
