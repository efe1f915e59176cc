package eagle

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"pagoda/gguf"
	"pagoda/hf"
	"pagoda/kernels"
	"pagoda/model"
	"pagoda/quant"
	"pagoda/safetensors"
	"pagoda/train"
)

// The side file is a GGUF of architecture "eagle": the draft's tensors
// under the llama names (eagle.fc.*, eagle.blk.0.*), its shape, the
// SHA-256 of the target it was trained for (model.FileChecksum) and the
// held-out accuracy per depth. Matrices are stored F16, vectors F32.
const (
	keyArch     = "general.architecture"
	keyTarget   = "eagle.target_sha256"
	keyD        = "eagle.embedding_length"
	keyHeads    = "eagle.attention.head_count"
	keyKVHeads  = "eagle.attention.head_count_kv"
	keyHeadDim  = "eagle.attention.key_length"
	keyFFN      = "eagle.feed_forward_length"
	keyVocab    = "eagle.vocab_size"
	keyAccuracy = "eagle.accuracy"
)

// SaveInfo is extra metadata a saved draft records.
type SaveInfo struct {
	Name        string
	TrainTokens int64
	Unigram     float64
}

// Save writes the draft as a GGUF side file.
func (d *Draft) Save(path string, info SaveInfo) error {
	w := gguf.NewWriter()
	s := d.Shape
	acc := make([]float32, len(d.Accuracy))
	for i, a := range d.Accuracy {
		acc[i] = float32(a)
	}
	name := info.Name
	if name == "" {
		name = "eagle draft"
	}
	for _, kv := range []struct {
		k string
		v any
	}{
		{keyArch, "eagle"}, {"general.name", name}, {keyTarget, d.targetSum},
		{keyD, uint32(s.D)}, {keyHeads, uint32(s.Heads)}, {keyKVHeads, uint32(s.KVHeads)},
		{keyHeadDim, uint32(s.HeadDim)}, {keyFFN, uint32(s.FFN)}, {keyVocab, uint32(s.Vocab)},
		{keyAccuracy, acc}, {"eagle.train_tokens", uint64(info.TrainTokens)},
		{"eagle.unigram_accuracy", float32(info.Unigram)},
	} {
		if err := w.Set(kv.k, kv.v); err != nil {
			return err
		}
	}
	for _, t := range s.tensors() {
		p := d.Params[t.off : t.off+t.size()]
		if !t.matrix {
			if err := w.AddTensor(t.name, quant.F32, []uint64{uint64(t.rows)}, train.F32Bytes(p)); err != nil {
				return err
			}
			continue
		}
		h := make([]uint16, len(p))
		kernels.F32ToF16Row(h, p)
		b := make([]byte, 2*len(h))
		for i, v := range h {
			b[2*i], b[2*i+1] = byte(v), byte(v>>8)
		}
		if err := w.AddTensor(t.name, quant.F16, []uint64{uint64(t.cols), uint64(t.rows)}, b); err != nil {
			return err
		}
	}
	return w.WriteFile(path)
}

// Load reads a draft for target, which was opened from targetPath: an
// EAGLE side file (GGUF) trained for exactly that file, or EAGLE's
// published draft layer as safetensors (a file, or a directory holding
// model.safetensors) whose shapes are the target's.
func Load(path string, target *model.Model, targetPath string) (*Draft, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("eagle: %w", err)
	}
	if st.IsDir() {
		for _, n := range []string{"model.safetensors", "pytorch_model.bin"} {
			if _, err := os.Stat(filepath.Join(path, n)); err == nil {
				return Load(filepath.Join(path, n), target, targetPath)
			}
		}
		return nil, fmt.Errorf("eagle: %s holds no model.safetensors", path)
	}
	switch {
	case strings.HasSuffix(path, ".bin") || strings.HasSuffix(path, ".pt") || strings.HasSuffix(path, ".pth"):
		return nil, fmt.Errorf("eagle: %s is a PyTorch pickle, which Pagoda does not read; convert it to safetensors first (e.g. safetensors.torch.save_file(torch.load(path), \"model.safetensors\"))", path)
	case strings.HasSuffix(path, ".safetensors"):
		return loadSafetensors(path, target)
	}
	sum, err := model.FileChecksum(targetPath)
	if err != nil {
		return nil, fmt.Errorf("eagle: target checksum: %w", err)
	}
	return loadGGUF(path, target, sum, targetPath)
}

func loadGGUF(path string, target *model.Model, sum, targetPath string) (*Draft, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("eagle: %s: %w", path, err)
	}
	defer f.Close()
	if a, _ := f.String(keyArch); a != "eagle" {
		return nil, fmt.Errorf("eagle: %s is a %q GGUF, not an EAGLE draft (general.architecture \"eagle\")", path, a)
	}
	want, _ := f.String(keyTarget)
	if want != sum {
		return nil, fmt.Errorf("eagle: %s was trained for the target with SHA-256 %.16s…, not %s (SHA-256 %.16s…)", path, want, targetPath, sum)
	}
	u := func(k string) int {
		v, ok := f.Uint(k)
		if !ok {
			err = fmt.Errorf("eagle: %s lacks %s", path, k)
		}
		return int(v)
	}
	s := Shape{D: u(keyD), Heads: u(keyHeads), KVHeads: u(keyKVHeads), HeadDim: u(keyHeadDim), FFN: u(keyFFN), Vocab: u(keyVocab)}
	if err != nil {
		return nil, err
	}
	if want := ShapeOf(&target.Config, s.FFN); s != want {
		return nil, fmt.Errorf("eagle: %s has shape (%v), target %s has (%v)", path, s, targetPath, want)
	}
	d, err := newDraft(s, target, sum)
	if err != nil {
		return nil, err
	}
	for _, t := range s.tensors() {
		ti := f.Tensor(t.name)
		if ti == nil {
			d.Close()
			return nil, fmt.Errorf("eagle: %s lacks tensor %s", path, t.name)
		}
		if err := fill(d.Params[t.off:t.off+t.size()], t, ti.Type, ti.Dims, ti.Data); err != nil {
			d.Close()
			return nil, fmt.Errorf("eagle: %s: %w", path, err)
		}
	}
	if acc, ok := f.Float32s(keyAccuracy); ok {
		for _, a := range acc {
			d.Accuracy = append(d.Accuracy, float64(a))
		}
	}
	return d, nil
}

// fill dequantizes a stored tensor of ggml dims into dst after checking it
// is t's shape.
func fill(dst []float32, t tensor, typ quant.Type, dims []uint64, data []byte) error {
	want := []uint64{uint64(t.rows)}
	if t.matrix {
		want = []uint64{uint64(t.cols), uint64(t.rows)}
	}
	if fmt.Sprint(dims) != fmt.Sprint(want) {
		return fmt.Errorf("tensor %s has dims %v, want %v", t.name, dims, want)
	}
	cols := t.cols
	if !t.matrix {
		cols = t.rows
	}
	rb, err := quant.RowSize(typ, cols)
	if err != nil {
		return fmt.Errorf("tensor %s: %v", t.name, err)
	}
	rows := len(dst) / cols
	if len(data) < rows*rb {
		return fmt.Errorf("tensor %s is truncated", t.name)
	}
	for r := range rows {
		if err := quant.Dequantize(typ, data[r*rb:(r+1)*rb], dst[r*cols:(r+1)*cols]); err != nil {
			return fmt.Errorf("tensor %s: %v", t.name, err)
		}
	}
	return nil
}

// publishedNames maps EAGLE's checkpoint names (its cnets.py Model: fc,
// then layers.0 without an input_layernorm) to the draft's tensors.
var publishedNames = map[string]string{
	"fc.weight":                                "eagle.fc.weight",
	"fc.bias":                                  "eagle.fc.bias",
	"layers.0.self_attn.q_proj.weight":         "eagle.blk.0.attn_q.weight",
	"layers.0.self_attn.k_proj.weight":         "eagle.blk.0.attn_k.weight",
	"layers.0.self_attn.v_proj.weight":         "eagle.blk.0.attn_v.weight",
	"layers.0.self_attn.o_proj.weight":         "eagle.blk.0.attn_output.weight",
	"layers.0.post_attention_layernorm.weight": "eagle.blk.0.ffn_norm.weight",
	"layers.0.mlp.gate_proj.weight":            "eagle.blk.0.ffn_gate.weight",
	"layers.0.mlp.up_proj.weight":              "eagle.blk.0.ffn_up.weight",
	"layers.0.mlp.down_proj.weight":            "eagle.blk.0.ffn_down.weight",
}

// loadSafetensors reads EAGLE's published draft layer. Its q and k rows
// are in Hugging Face's rotate-half order; for a target whose RoPE pairs
// adjacent elements (llama GGUF) they are permuted back, as the GGUF
// converters do for the target's own.
func loadSafetensors(path string, target *model.Model) (*Draft, error) {
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, fmt.Errorf("eagle: %s: %w", path, err)
	}
	defer f.Close()
	byName := map[string]*safetensors.Tensor{}
	for hn, gn := range publishedNames {
		t, ok := f.Tensor(hn)
		if !ok {
			t, ok = f.Tensor("model." + hn)
		}
		if !ok {
			return nil, fmt.Errorf("eagle: %s is not an EAGLE draft checkpoint: it lacks %s (has %s)", path, hn, strings.Join(first(f.Names(), 8), ", "))
		}
		byName[gn] = t
	}
	gate := byName["eagle.blk.0.ffn_gate.weight"]
	fc := byName["eagle.fc.weight"]
	c := &target.Config
	if len(gate.Shape) != 2 || len(fc.Shape) != 2 {
		return nil, fmt.Errorf("eagle: %s: fc.weight %v and gate_proj %v must be matrices", path, fc.Shape, gate.Shape)
	}
	s := ShapeOf(c, int(gate.Shape[0]))
	if fc.Shape[0] != int64(s.D) || fc.Shape[1] != int64(2*s.D) {
		return nil, fmt.Errorf("eagle: %s has fc.weight %v, a draft for hidden size %d; the target has hidden size %d (fc.weight [%d %d])",
			path, fc.Shape, fc.Shape[0], s.D, s.D, 2*s.D)
	}
	d, err := newDraft(s, target, "")
	if err != nil {
		return nil, err
	}
	for _, t := range s.tensors() {
		st := byName[t.name]
		want := []int64{int64(t.rows)}
		if t.matrix {
			want = []int64{int64(t.rows), int64(t.cols)}
		}
		if fmt.Sprint(st.Shape) != fmt.Sprint(want) {
			d.Close()
			return nil, fmt.Errorf("eagle: %s: %s has shape %v, the target needs %v (%v)", path, st.Name, st.Shape, want, s)
		}
		v, err := st.Float32()
		if err != nil {
			d.Close()
			return nil, fmt.Errorf("eagle: %s: %w", path, err)
		}
		if !c.RopeNeox && (t.name == "eagle.blk.0.attn_q.weight" || t.name == "eagle.blk.0.attn_k.weight") {
			heads := s.Heads
			if t.name == "eagle.blk.0.attn_k.weight" {
				heads = s.KVHeads
			}
			b := hf.Unpermute(train.F32Bytes(v), 4*t.cols, t.rows, heads)
			if b == nil {
				d.Close()
				return nil, fmt.Errorf("eagle: %s: cannot un-permute %s for %d heads", path, st.Name, heads)
			}
			copy(train.F32Bytes(v), b)
		}
		copy(d.Params[t.off:], v)
	}
	return d, nil
}

func first(s []string, n int) []string {
	if len(s) > n {
		return append(s[:n:n], "…")
	}
	return s
}
