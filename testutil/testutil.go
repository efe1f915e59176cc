// Package testutil finds the shared test data (models, golden outputs) that
// lives beside the repository in ../shared.
package testutil

import (
	"os"
	"path/filepath"
	"testing"
)

// SharedDir returns the shared data folder: $PAGODA_SHARED, or the first
// "shared" folder found beside this module or one of its parents. Empty when
// absent.
func SharedDir() string {
	if d := os.Getenv("PAGODA_SHARED"); d != "" {
		return d
	}
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			cand := filepath.Join(filepath.Dir(dir), "shared")
			if st, err := os.Stat(cand); err == nil && st.IsDir() {
				return cand
			}
			return ""
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// Shared returns the path of rel inside the shared folder, skipping the test
// with a clear message when the folder or file is absent.
func Shared(t testing.TB, rel string) string {
	t.Helper()
	d := SharedDir()
	if d == "" {
		t.Skip("shared test data not found (set PAGODA_SHARED or place it at ../shared); skipping")
	}
	p := filepath.Join(d, rel)
	if _, err := os.Stat(p); err != nil {
		t.Skipf("shared test file %s not present: %v", rel, err)
	}
	return p
}
