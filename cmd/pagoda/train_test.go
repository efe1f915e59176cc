package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTrainCommand trains a toy model for a few steps on a repeated
// sentence, resumes it for more, and generates from the checkpoint with
// `pagoda run`: the run learns the text (greedy output continues it).
func TestTrainCommand(t *testing.T) {
	dir := t.TempDir()
	text := strings.Repeat("the cat sat on the mat. the dog sat on the log. ", 60)
	data, held := filepath.Join(dir, "train.txt"), filepath.Join(dir, "held.txt")
	if err := os.WriteFile(data, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(held, []byte(text[:400]), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "m.gguf")
	common := []string{"train", "-data", data, "-heldout", held, "-o", out, "-vocab", "280", "-dim", "32", "-layers", "1",
		"-heads", "2", "-kv-heads", "1", "-head-dim", "16", "-ffn", "64", "-ctx", "32", "-batch", "4", "-lr", "1e-2",
		"-min-lr", "1e-3", "-warmup", "5", "-eval-every", "20", "-threads", "1"}
	code, _, stderr := pagoda(t, append(common, "-steps", "40")...)
	if code != 0 {
		t.Fatalf("train: exit %d: %s", code, stderr)
	}
	for _, want := range []string{"held-out loss", "checkpoint: " + out + " (step 40)"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("train output lacks %q:\n%s", want, stderr)
		}
	}
	code, _, stderr = pagoda(t, append(common, "-steps", "150", "-resume")...)
	if code != 0 || !strings.Contains(stderr, "from step 40") || !strings.Contains(stderr, "(step 150)") {
		t.Fatalf("resume: exit %d: %s", code, stderr)
	}
	for _, f := range []string{"m.state", "m.svg"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s not written: %v", f, err)
		}
	}
	// The final held-out loss (all windows) is far below ln(280) = 5.6.
	var loss float64
	if i := strings.LastIndex(stderr, "held-out loss "); i < 0 {
		t.Fatalf("no final held-out loss:\n%s", stderr)
	} else if _, err := fmt.Sscanf(stderr[i:], "held-out loss %g", &loss); err != nil || loss > 1 {
		t.Errorf("final held-out loss %v (%v), want < 1 nat/token on the repeated text", loss, err)
	}
	code, stdout, stderr := pagoda(t, "run", "-m", out, "-p", "the dog sat on the log. the cat", "-n", "8", "-temp", "0")
	if code != 0 {
		t.Fatalf("run: exit %d: %s", code, stderr)
	}
	if !strings.HasPrefix(stdout, "the dog sat on the log. the cat sat ") {
		t.Errorf("greedy continuation of the trained text: %q", stdout)
	}
	if code, _, stderr := pagoda(t, "train", "-data", data, "-o", out, "-steps", "1", "-seq", "64", "-ctx", "32"); code == 0 {
		t.Errorf("a sequence longer than the context was accepted")
	} else if !strings.Contains(stderr, "exceeds the context") {
		t.Errorf("unclear error for -seq > -ctx: %s", stderr)
	}
}
