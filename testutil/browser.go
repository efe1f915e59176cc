package testutil

import (
	"os/exec"
	"testing"
)

// Browser returns a Chromium binary on PATH for headless browser tests,
// or skips the test.
func Browser(t testing.TB) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("no headless browser: none of chromium, chromium-browser, google-chrome on PATH (apt-get install chromium); skipping")
	return ""
}
