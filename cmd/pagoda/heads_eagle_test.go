package main

import (
	"path/filepath"
	"strings"
	"testing"

	"pagoda/eagle"
	"pagoda/model"
	"pagoda/testutil"
)

// TestHeadsEagle trains a (tiny) EAGLE draft through the CLI and loads the
// side file it writes; bad invocations fail with clear errors.
func TestHeadsEagle(t *testing.T) {
	target := testutil.Shared(t, "models/gguf/stories260K.gguf")
	dir := t.TempDir()
	out, svg := filepath.Join(dir, "d.eagle.gguf"), filepath.Join(dir, "loss.svg")
	code, _, stderr := pagoda(t, "heads", "train", "--kind", "eagle", "-m", target, "-o", out, "--svg", svg,
		"--samples", "4", "--heldout", "2", "--len", "32", "--steps", "6", "--batch", "2", "--warmup", "2", "--threads", "1")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, stderr)
	}
	for _, want := range []string{"held-out top-1 agreement", "depth 1", "unigram baseline", "wrote"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	m, err := model.Open(target, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	d, err := eagle.Load(out, m, target)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if len(d.Accuracy) != 5 {
		t.Errorf("the side file records accuracy %v, want 5 depths", d.Accuracy)
	}
	for _, c := range []struct{ args, want string }{
		{"heads train --kind eagle -m " + target, "-m TARGET and -o OUT.gguf are required"},
		{"heads train --kind eagle -m " + target + " -o x.gguf --steps 0", "-steps 0 is out of range"},
		{"heads train --kind eagle -m " + filepath.Join(dir, "none.gguf") + " -o x.gguf", "none.gguf"},
	} {
		code, _, stderr := pagoda(t, strings.Fields(c.args)...)
		if code != 1 || !strings.Contains(stderr, c.want) {
			t.Errorf("pagoda %s: exit %d, want 1 and %q:\n%s", c.args, code, c.want, stderr)
		}
	}
}
