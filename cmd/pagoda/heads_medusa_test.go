package main

import (
	"path/filepath"
	"strings"
	"testing"

	"pagoda/medusa"
	"pagoda/model"
	"pagoda/testutil"
)

// TestHeadsTrainMedusa runs `pagoda heads train --kind medusa` briefly on
// stories260K: the side file loads for its target with a valid tree, the
// accuracy table and curve are written, and bad budgets are refused.
func TestHeadsTrainMedusa(t *testing.T) {
	target := testutil.Shared(t, "models/gguf/stories260K.gguf")
	abs, err := filepath.Abs(target)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	out := filepath.Join(dir, "h.gguf")
	code, _, stderr := pagoda(t, "heads", "train", "--kind", "medusa", "-m", abs, "-o", out, "--heads", "2",
		"--samples", "12", "--len", "48", "--steps", "40", "--batch", "16", "--lr", "1e-2", "--tree", "8", "--threads", "1")
	if code != 0 {
		t.Fatalf("heads train: exit %d: %s", code, stderr)
	}
	for _, want := range []string{"head  guesses", "t+2", "t+3", "static tree: 8 nodes", "h.svg"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("output lacks %q:\n%s", want, stderr)
		}
	}
	m, err := model.Open(abs, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	h, err := medusa.Load(out, m, abs)
	if err != nil {
		t.Fatal(err)
	}
	if h.K != 2 || h.Tree.Len() != 8 || len(h.Info.Top1) != 2 {
		t.Errorf("loaded %d heads, tree of %d, %d accuracies", h.K, h.Tree.Len(), len(h.Info.Top1))
	}
	for _, bad := range [][]string{{"--tree", "0"}, {"--tree", "1000000"}, {"--heads", "0"}} {
		code, _, stderr := pagoda(t, append([]string{"heads", "train", "--kind", "medusa", "-m", abs, "-o", out}, bad...)...)
		if code == 0 || !strings.Contains(stderr, strings.TrimPrefix(bad[0], "--")) {
			t.Errorf("%v: exit %d: %s", bad, code, stderr)
		}
	}
	if code, _, stderr := pagoda(t, "heads", "train", "--kind", "medusa", "-o", out); code == 0 || !strings.Contains(stderr, "-m") {
		t.Errorf("no target: exit %d: %s", code, stderr)
	}
}
