package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDistillCommand trains a toy target, distils a smaller draft from
// its samples, and runs speculative decoding with it: the greedy output
// is token-identical to plain decoding and the draft agrees with the
// target on most held-out sampled positions.
func TestDistillCommand(t *testing.T) {
	dir := t.TempDir()
	text := strings.Repeat("the cat sat on the mat. the dog sat on the log. a bird sang in the tree. ", 40)
	data := filepath.Join(dir, "train.txt")
	if err := os.WriteFile(data, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	target, draft := filepath.Join(dir, "target.gguf"), filepath.Join(dir, "draft.gguf")
	code, _, stderr := pagoda(t, "train", "-data", data, "-o", target, "-vocab", "300", "-dim", "64", "-layers", "2",
		"-heads", "2", "-kv-heads", "1", "-head-dim", "32", "-ffn", "128", "-ctx", "64", "-batch", "4", "-lr", "1e-2",
		"-min-lr", "1e-3", "-warmup", "5", "-steps", "120", "-threads", "1")
	if code != 0 {
		t.Fatalf("train: exit %d: %s", code, stderr)
	}
	code, _, stderr = pagoda(t, "distill", "-m", target, "-o", draft, "-samples", "40", "-len", "40", "-dim", "32",
		"-layers", "1", "-heads", "1", "-kv-heads", "1", "-head-dim", "32", "-ffn", "64", "-steps", "150", "-batch", "4",
		"-seq", "32", "-lr", "1e-2", "-min-lr", "1e-3", "-warmup", "5", "-threads", "1")
	if code != 0 {
		t.Fatalf("distill: exit %d: %s", code, stderr)
	}
	var agree float64
	if i := strings.Index(stderr, "greedy agreement with the target: "); i < 0 {
		t.Fatalf("no agreement line:\n%s", stderr)
	} else if _, err := fmt.Sscanf(stderr[i:], "greedy agreement with the target: %g%%", &agree); err != nil {
		t.Fatal(err)
	}
	t.Logf("draft agrees with the target on %.1f%% of held-out positions", agree)
	if agree < 60 {
		t.Errorf("distilled draft agrees with its target on only %.1f%% of positions", agree)
	}
	args := []string{"run", "-m", target, "-p", "the dog sat on the", "-n", "30", "-temp", "0"}
	code, plain, stderr := pagoda(t, args...)
	if code != 0 {
		t.Fatalf("run: exit %d: %s", code, stderr)
	}
	code, spec, stderr := pagoda(t, append(args, "-draft", draft, "-spec-fixed")...)
	if code != 0 {
		t.Fatalf("run -draft: exit %d: %s", code, stderr)
	}
	if spec != plain {
		t.Errorf("speculative output differs from plain decoding:\n%q\n%q", spec, plain)
	}
	if !strings.Contains(stderr, "accepted") {
		t.Errorf("no acceptance summary: %s", stderr)
	}
	t.Logf("%s", strings.TrimSpace(stderr))
}
