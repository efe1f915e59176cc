package model

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"pagoda/testutil"
)

// TestHFSurplusLayers: an HF directory whose num_hidden_layers is below
// the layers its tensors hold is refused naming the setting (it used to
// load and run the first layers only, a truncated model, silently).
func TestHFSurplusLayers(t *testing.T) {
	src := testutil.Shared(t, "models/derived/stories260K-hf")
	dir := t.TempDir()
	if err := os.Symlink(filepath.Join(src, "model.safetensors"), filepath.Join(dir, "model.safetensors")); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.Replace(string(b), `"num_hidden_layers": 5`, `"num_hidden_layers": 4`, 1)
	if cfg == string(b) {
		t.Fatal("config.json has no num_hidden_layers 5 to edit")
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := Open(dir, Options{Threads: 1})
	if err == nil {
		m.Close()
		t.Fatal("a 5-layer checkpoint loaded as 4 layers")
	}
	if !strings.Contains(err.Error(), "num_hidden_layers is 4 but the checkpoint has layer 4 (model.layers.4.") {
		t.Errorf("error %v", err)
	}
}
