package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"pagoda/gguf"
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

// TestTrainFineTuneBOS: a run trained on plain windows is fine-tuned on
// BOS-anchored ones (-resume -finetune -bos): it continues from its step
// with the schedule restarted, and the checkpoint tells loaders to start
// prompts with BOS. Plain -resume refuses to change the windows.
func TestTrainFineTuneBOS(t *testing.T) {
	dir := t.TempDir()
	text := strings.Repeat("the cat sat on the mat. the dog sat on the log. ", 30)
	data := filepath.Join(dir, "train.txt")
	if err := os.WriteFile(data, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "m.gguf")
	common := []string{"train", "-data", data, "-heldout", data, "-o", out, "-vocab", "270", "-dim", "16", "-layers", "1",
		"-heads", "2", "-kv-heads", "1", "-head-dim", "8", "-ffn", "32", "-ctx", "16", "-batch", "2", "-warmup", "3",
		"-eval-every", "0", "-threads", "1"}
	if code, _, stderr := pagoda(t, append(common, "-steps", "6")...); code != 0 {
		t.Fatalf("train: exit %d: %s", code, stderr)
	}
	if addBOS(t, out) {
		t.Error("a model trained on plain windows asks for BOS")
	}
	if code, _, stderr := pagoda(t, append(common, "-steps", "8", "-resume", "-bos")...); code == 0 || !strings.Contains(stderr, "fine-tune") {
		t.Errorf("plain resume changing -bos: exit %d: %s", code, stderr)
	}
	code, _, stderr := pagoda(t, append(common, "-steps", "4", "-resume", "-finetune", "-bos")...)
	if code != 0 {
		t.Fatalf("fine-tune: exit %d: %s", code, stderr)
	}
	for _, want := range []string{"BOS-anchored windows true", "from step 6 (schedule from step 6)", "(step 10)", "held-out loss"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("fine-tune output lacks %q:\n%s", want, stderr)
		}
	}
	if !addBOS(t, out) {
		t.Error("the BOS-fine-tuned checkpoint does not ask loaders for BOS")
	}
	if code, _, stderr := pagoda(t, "train", "-data", data, "-o", out, "-steps", "1", "-finetune"); code == 0 || !strings.Contains(stderr, "-resume") {
		t.Errorf("-finetune without -resume: exit %d: %s", code, stderr)
	}
}

func addBOS(t *testing.T, path string) bool {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	v, ok := f.Bool("tokenizer.ggml.add_bos_token")
	if !ok {
		t.Fatalf("%s has no tokenizer.ggml.add_bos_token", path)
	}
	return v
}
