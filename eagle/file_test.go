package eagle

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"pagoda/model"
	"pagoda/safetensors"
	"pagoda/testutil"
	"pagoda/train"
)

// f16Close: matrices are stored F16.
func f16Close(a, b []float32) (int, bool) {
	for i := range a {
		d := a[i] - b[i]
		if d < 0 {
			d = -d
		}
		m := a[i]
		if m < 0 {
			m = -m
		}
		if d > 1e-3*m+1e-6 {
			return i, false
		}
	}
	return 0, true
}

// TestSideFileRoundTrip: a saved draft loads back for its target, and is
// refused, with both named, for another target file, for a target of
// another shape, and when corrupt.
func TestSideFileRoundTrip(t *testing.T) {
	d := randomDraft(t, 5)
	sum, err := model.FileChecksum(d.targetPathForTest(t))
	if err != nil {
		t.Fatal(err)
	}
	d.targetSum = sum
	d.Accuracy = []float64{0.5, 0.25}
	dir := t.TempDir()
	path := filepath.Join(dir, "s.eagle.gguf")
	if err := d.Save(path, SaveInfo{TrainTokens: 123}); err != nil {
		t.Fatal(err)
	}
	e, err := Load(path, d.target, d.targetPathForTest(t))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if i, ok := f16Close(d.Params, e.Params); !ok {
		t.Fatalf("parameter %d: saved %v, loaded %v", i, d.Params[i], e.Params[i])
	}
	if len(e.Accuracy) != 2 || e.Accuracy[1] != 0.25 || e.TargetChecksum() != sum {
		t.Errorf("metadata: accuracy %v, target %s", e.Accuracy, e.TargetChecksum())
	}

	// Another target file: the KJV model of this repository.
	kjvPath := "../models/kjv3m.q8_0.gguf"
	kjv, err := model.Open(kjvPath, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer kjv.Close()
	_, err = Load(path, kjv, kjvPath)
	if err == nil || !strings.Contains(err.Error(), "kjv3m") || !strings.Contains(err.Error(), sum[:16]) {
		t.Errorf("a draft for stories260K loaded for the KJV model: %v", err)
	}
	// The right checksum but the wrong shape (a file claiming to be for
	// the KJV model, with stories260K's shapes).
	kjvSum, err := model.FileChecksum(kjvPath)
	if err != nil {
		t.Fatal(err)
	}
	d.targetSum = kjvSum
	bad := filepath.Join(dir, "shape.eagle.gguf")
	if err := d.Save(bad, SaveInfo{}); err != nil {
		t.Fatal(err)
	}
	_, err = Load(bad, kjv, kjvPath)
	if err == nil || !strings.Contains(err.Error(), "d 64") || !strings.Contains(err.Error(), "d 256") {
		t.Errorf("a draft of shape d 64 loaded for a d 256 target: %v", err)
	}
	// Corrupt: truncated.
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cut := filepath.Join(dir, "cut.eagle.gguf")
	if err := os.WriteFile(cut, b[:len(b)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(cut, d.target, d.targetPathForTest(t)); err == nil {
		t.Error("a truncated side file loaded")
	}
	// Not an EAGLE file at all: the target itself.
	if _, err := Load(d.targetPathForTest(t), d.target, d.targetPathForTest(t)); err == nil || !strings.Contains(err.Error(), "not an EAGLE draft") {
		t.Errorf("the target model loaded as a draft: %v", err)
	}
}

func (d *Draft) targetPathForTest(t *testing.T) string {
	return testutil.Shared(t, "models/gguf/stories260K.gguf")
}

// hfPermute is the Hugging Face rotate-half row order of a llama q/k
// matrix (the inverse of hf.Unpermute).
func hfPermute(w []float32, rows, cols, heads int) []float32 {
	out := make([]float32, len(w))
	hd := rows / heads
	for h := range heads {
		for i := range hd / 2 {
			for j := range 2 {
				src := h*hd + 2*i + j
				dst := h*hd + j*(hd/2) + i
				copy(out[dst*cols:(dst+1)*cols], w[src*cols:(src+1)*cols])
			}
		}
	}
	return out
}

func writePublished(t *testing.T, path string, d *Draft, skip string, reshape func(name string, shape []int64) []int64) {
	t.Helper()
	var ts []*safetensors.Tensor
	byGGUF := map[string]string{}
	for hn, gn := range publishedNames {
		byGGUF[gn] = hn
	}
	for _, tt := range d.Shape.tensors() {
		hn := byGGUF[tt.name]
		if hn == skip {
			continue
		}
		v := append([]float32(nil), d.Params[tt.off:tt.off+tt.size()]...)
		shape := []int64{int64(tt.rows)}
		if tt.matrix {
			shape = []int64{int64(tt.rows), int64(tt.cols)}
		}
		switch tt.name {
		case "eagle.blk.0.attn_q.weight":
			v = hfPermute(v, tt.rows, tt.cols, d.Shape.Heads)
		case "eagle.blk.0.attn_k.weight":
			v = hfPermute(v, tt.rows, tt.cols, d.Shape.KVHeads)
		}
		if reshape != nil {
			shape = reshape(hn, shape)
			n := int64(1)
			for _, x := range shape {
				n *= x
			}
			v = v[:min(int(n), len(v))]
		}
		ts = append(ts, &safetensors.Tensor{Name: hn, DType: "F32", Shape: shape, Data: train.F32Bytes(v)})
	}
	// EAGLE's checkpoints also carry the (frozen) embedding: ignored.
	ts = append(ts, &safetensors.Tensor{Name: "embed_tokens.weight", DType: "F32", Shape: []int64{2}, Data: train.F32Bytes([]float32{1, 2})})
	if err := safetensors.Write(path, ts); err != nil {
		t.Fatal(err)
	}
}

// TestPublishedLayout loads EAGLE's published safetensors layout (q and k
// in rotate-half order, undone for this adjacent-pair RoPE target) and
// refuses other shapes, missing tensors and pickles with clear errors.
func TestPublishedLayout(t *testing.T) {
	d := randomDraft(t, 8)
	dir := t.TempDir()
	path := filepath.Join(dir, "model.safetensors")
	writePublished(t, path, d, "", nil)
	e, err := Load(dir, d.target, d.targetPathForTest(t))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for i := range d.Params {
		if d.Params[i] != e.Params[i] {
			t.Fatalf("parameter %d: %v written, %v loaded", i, d.Params[i], e.Params[i])
		}
	}
	other := filepath.Join(dir, "wide.safetensors")
	writePublished(t, other, d, "", func(name string, shape []int64) []int64 {
		if name == "fc.weight" {
			return []int64{32, 64}
		}
		return shape
	})
	if _, err := Load(other, d.target, d.targetPathForTest(t)); err == nil || !strings.Contains(err.Error(), "hidden size 32") || !strings.Contains(err.Error(), "hidden size 64") {
		t.Errorf("a draft for hidden size 32: %v", err)
	}
	missing := filepath.Join(dir, "missing.safetensors")
	writePublished(t, missing, d, "layers.0.mlp.up_proj.weight", nil)
	if _, err := Load(missing, d.target, d.targetPathForTest(t)); err == nil || !strings.Contains(err.Error(), "up_proj") {
		t.Errorf("a checkpoint without up_proj: %v", err)
	}
	pickle := filepath.Join(dir, "pytorch_model.bin")
	if err := os.WriteFile(pickle, []byte("PK\x03\x04"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(pickle, d.target, d.targetPathForTest(t)); err == nil || !strings.Contains(err.Error(), "safetensors") {
		t.Errorf("a pickle: %v", err)
	}
}
