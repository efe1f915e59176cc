package model_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"pagoda/model"
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
	m, err := model.Open(dir, model.Options{Threads: 1})
	if err == nil {
		m.Close()
		t.Fatal("a 5-layer checkpoint loaded as 4 layers")
	}
	if !strings.Contains(err.Error(), "num_hidden_layers is 4 but the checkpoint has layer 4 (model.layers.4.") {
		t.Errorf("error %v", err)
	}
}

// TestGGUFSurplusLayers: a GGUF whose block_count is below the layers its
// tensors hold is refused, as llama.cpp refuses it (it used to load and
// run the first block_count layers).
func TestGGUFSurplusLayers(t *testing.T) {
	src := testutil.Shared(t, "models/gguf/stories260K.gguf")
	p := rewriteGGUF(t, src, filepath.Join(t.TempDir(), "four.gguf"), ggufEdit{set: map[string]any{"llama.block_count": uint32(4)}})
	m, err := model.Open(p, model.Options{Threads: 1})
	if err == nil {
		m.Close()
		t.Fatal("a 5-layer file loaded as 4 layers")
	}
	if !strings.Contains(err.Error(), "block_count is 4 but the file has a tensor of layer 4 (blk.4.") {
		t.Errorf("error %v", err)
	}
}
