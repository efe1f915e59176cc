package medusa

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"

	"pagoda/gguf"
	"pagoda/model"
	"pagoda/quant"
	"pagoda/safetensors"
)

// Side-file keys. Tensors are medusa.K.res.weight (D×D), medusa.K.res.bias
// (D) and, unless medusa.shared_output, medusa.K.output.weight (V×D), K
// counting heads from 0.
const (
	keyHeads    = "medusa.num_heads"
	keyEmbd     = "medusa.embedding_length"
	keyVocab    = "medusa.vocab_size"
	keyChecksum = "medusa.target_sha256"
	keyShared   = "medusa.shared_output"
	keyTopK     = "medusa.top_k"
	keyRankAcc  = "medusa.rank_accuracy"
	keyParent   = "medusa.tree.parent"
	keyRank     = "medusa.tree.rank"
)

// maxDim bounds the sizes a side file may claim before anything is
// allocated for them.
const maxDim = 1 << 20

func tname(k int, part string) string { return fmt.Sprintf("medusa.%d.%s", k, part) }

// Save writes h as a GGUF side file.
func (h *Heads) Save(path string) error {
	if h.Tree.Len() == 0 || len(h.RankAcc) != h.K*h.TopK {
		return fmt.Errorf("medusa: heads have no tree or accuracies to save (train or measure them first)")
	}
	w := gguf.NewWriter()
	i := h.Info
	sets := []struct {
		k string
		v any
	}{
		{"general.architecture", "medusa"},
		{"general.name", "pagoda medusa heads"},
		{keyHeads, uint32(h.K)}, {keyEmbd, uint32(h.D)}, {keyVocab, uint32(h.V)},
		{keyChecksum, h.Checksum}, {keyShared, h.Shared}, {keyTopK, uint32(h.TopK)},
		{keyRankAcc, f32s(h.RankAcc)}, {keyParent, h.Tree.Parent}, {keyRank, h.Tree.Rank},
		{"medusa.train.steps", uint32(i.Steps)}, {"medusa.train.positions", uint64(i.Positions)},
		{"medusa.train.seconds", i.Seconds}, {"medusa.heldout.positions", uint32(i.HeldOut)},
		{"medusa.heldout.top1", f32s(i.Top1)}, {"medusa.heldout.topk", f32s(i.TopK)},
		{"medusa.heldout.unigram_top1", float32(i.UnigramTop1)},
	}
	for _, s := range sets {
		if err := w.Set(s.k, s.v); err != nil {
			return err
		}
	}
	d, v := uint64(h.D), uint64(h.V)
	for k := range h.K {
		if err := w.AddTensor(tname(k, "res.weight"), quant.F32, []uint64{d, d}, f32Bytes(h.W[k*h.D*h.D:(k+1)*h.D*h.D])); err != nil {
			return err
		}
		if err := w.AddTensor(tname(k, "res.bias"), quant.F32, []uint64{d}, f32Bytes(h.B[k*h.D:(k+1)*h.D])); err != nil {
			return err
		}
		if !h.Shared {
			if err := w.AddTensor(tname(k, "output.weight"), quant.F32, []uint64{d, v}, f32Bytes(h.out(k))); err != nil {
				return err
			}
		}
	}
	return w.WriteFile(path)
}

func f32s(x []float64) []float32 {
	out := make([]float32, len(x))
	for i, v := range x {
		out[i] = float32(v)
	}
	return out
}

func f32Bytes(x []float32) []byte {
	b := make([]byte, 4*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

// Load reads heads for target (loaded from targetPath): a GGUF side file
// written by Save, refused unless it was trained for exactly this target
// file, or Medusa's published medusa_lm_head.safetensors (the file, or a
// directory holding it), accepted when its shapes match the target's since
// it records no identity to check.
func Load(path string, target *model.Model, targetPath string) (*Heads, error) {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		path = filepath.Join(path, "medusa_lm_head.safetensors")
	}
	if strings.HasSuffix(path, ".safetensors") {
		return LoadSafetensors(path, target)
	}
	f, err := gguf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("medusa: heads %s: %w", path, err)
	}
	defer f.Close()
	h, err := FromGGUF(f)
	if err != nil {
		return nil, fmt.Errorf("medusa: heads %s: %w", path, err)
	}
	sum, err := model.FileChecksum(targetPath)
	if err != nil {
		return nil, fmt.Errorf("medusa: checksum of target %s: %w", targetPath, err)
	}
	if sum != h.Checksum {
		return nil, fmt.Errorf("medusa: heads %s were trained for the target with SHA-256 %s, but %s has SHA-256 %s", path, h.Checksum, targetPath, sum)
	}
	if err := h.bind(target); err != nil {
		return nil, fmt.Errorf("medusa: heads %s: %w", path, err)
	}
	return h, nil
}

// bind checks h's shapes against target's and gives shared heads the
// target's output matrix.
func (h *Heads) bind(target *model.Model) error {
	c := target.Config
	if h.D != c.NEmbd || h.V != c.VocabSize {
		return fmt.Errorf("heads read %d-wide features over %d tokens; the target has embedding %d and vocabulary %d", h.D, h.V, c.NEmbd, c.VocabSize)
	}
	if h.Shared {
		out, err := TargetOutput(target)
		if err != nil {
			return err
		}
		h.target = out
	}
	return nil
}

// FromGGUF decodes a side file's heads, checking it is whole and
// consistent; Load then binds them to a target.
func FromGGUF(f *gguf.File) (*Heads, error) {
	if a, _ := f.String("general.architecture"); a != "medusa" {
		return nil, fmt.Errorf("general.architecture is %q, not \"medusa\": not a Medusa head file", a)
	}
	var dims [4]uint64
	for i, key := range []string{keyHeads, keyEmbd, keyVocab, keyTopK} {
		v, ok := f.Uint(key)
		if !ok || v < 1 || v > maxDim {
			return nil, fmt.Errorf("%s missing or out of range", key)
		}
		dims[i] = v
	}
	k, d, v, topK := int(dims[0]), int(dims[1]), int(dims[2]), int(dims[3])
	if k > 64 || topK > 64 || d*d > 1<<28 || v*d > 1<<30 {
		return nil, fmt.Errorf("%d heads × top-%d of %d×%d are too large", k, topK, v, d)
	}
	sum, _ := f.String(keyChecksum)
	shared, _ := f.Bool(keyShared)
	acc, ok := f.Float32s(keyRankAcc)
	if !ok || len(acc) != k*topK {
		return nil, fmt.Errorf("%s: %d values, want %d heads × %d ranks", keyRankAcc, len(acc), k, topK)
	}
	parent, ok1 := f.Int32s(keyParent)
	rank, ok2 := f.Int32s(keyRank)
	if !ok1 || !ok2 || len(parent) == 0 {
		return nil, fmt.Errorf("the static tree (%s, %s) is missing", keyParent, keyRank)
	}
	// Every tensor must be there with its dims before anything is
	// allocated, so that a file's claims cost no more memory than the
	// data it holds.
	for i := range k {
		want := map[string][]uint64{tname(i, "res.weight"): {uint64(d), uint64(d)}, tname(i, "res.bias"): {uint64(d)}}
		if !shared {
			want[tname(i, "output.weight")] = []uint64{uint64(d), uint64(v)}
		}
		for name, dims := range want {
			t := f.Tensor(name)
			if t == nil {
				return nil, fmt.Errorf("tensor %s is missing", name)
			}
			if fmt.Sprint(t.Dims) != fmt.Sprint(dims) {
				return nil, fmt.Errorf("tensor %s has dims %v, want %v", name, t.Dims, dims)
			}
		}
	}
	h := &Heads{K: k, D: d, V: v, Shared: shared}
	n := k*d*d + k*d
	if !shared {
		n += k * v * d
	}
	h.Params = make([]float32, n)
	h.split()
	h.Checksum, h.TopK = sum, topK
	for _, a := range acc {
		h.RankAcc = append(h.RankAcc, float64(a))
	}
	h.Tree = Tree{Parent: append([]int32(nil), parent...), Rank: append([]int32(nil), rank...)}
	if err := h.Tree.finish(k, topK); err != nil {
		return nil, err
	}
	for i := range k {
		parts := []struct {
			name string
			dims []uint64
			dst  []float32
		}{
			{tname(i, "res.weight"), []uint64{uint64(d), uint64(d)}, h.W[i*d*d : (i+1)*d*d]},
			{tname(i, "res.bias"), []uint64{uint64(d)}, h.B[i*d : (i+1)*d]},
		}
		if !shared {
			parts = append(parts, struct {
				name string
				dims []uint64
				dst  []float32
			}{tname(i, "output.weight"), []uint64{uint64(d), uint64(v)}, h.Out[i*v*d : (i+1)*v*d]})
		}
		for _, p := range parts {
			if err := readTensor(f, p.name, p.dims, p.dst); err != nil {
				return nil, err
			}
		}
	}
	readInfo(f, h)
	return h, nil
}

func readTensor(f *gguf.File, name string, dims []uint64, dst []float32) error {
	t := f.Tensor(name)
	if t == nil {
		return fmt.Errorf("tensor %s is missing", name)
	}
	if fmt.Sprint(t.Dims) != fmt.Sprint(dims) {
		return fmt.Errorf("tensor %s has dims %v, want %v", name, t.Dims, dims)
	}
	if err := quant.Dequantize(t.Type, t.Data, dst); err != nil {
		return fmt.Errorf("tensor %s: %w", name, err)
	}
	for _, x := range dst {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return fmt.Errorf("tensor %s holds %v", name, x)
		}
	}
	return nil
}

// readInfo takes what training recorded, for reports; absent keys leave
// zeros.
func readInfo(f *gguf.File, h *Heads) {
	i := &h.Info
	if v, ok := f.Uint("medusa.train.steps"); ok {
		i.Steps = int(v)
	}
	if v, ok := f.Uint("medusa.train.positions"); ok {
		i.Positions = int64(v)
	}
	i.Seconds, _ = f.Float("medusa.train.seconds")
	if v, ok := f.Uint("medusa.heldout.positions"); ok {
		i.HeldOut = int(v)
	}
	for _, kv := range []struct {
		key string
		dst *[]float64
	}{{"medusa.heldout.top1", &i.Top1}, {"medusa.heldout.topk", &i.TopK}} {
		a, _ := f.Float32s(kv.key)
		for _, x := range a {
			*kv.dst = append(*kv.dst, float64(x))
		}
	}
	i.UnigramTop1, _ = f.Float("medusa.heldout.unigram_top1")
}

// DefaultTreeNodes is the node budget of the tree built for a published
// checkpoint (Medusa's own default trees have 63 or 64 nodes).
const DefaultTreeNodes = 64

// LoadSafetensors reads Medusa's published head layout
// (medusa_lm_head.safetensors: {k}.0.linear.weight [D,D], {k}.0.linear.bias
// [D], {k}.1.weight [V,D] for heads k = 0…K−1, one residual block each).
// It names no target, so only its shapes are checked; it carries no
// accuracies either, so its tree is built from a prior (priorAcc).
func LoadSafetensors(path string, target *model.Model) (*Heads, error) {
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, fmt.Errorf("medusa: %w", err)
	}
	defer f.Close()
	c := target.Config
	d, v := c.NEmbd, c.VocabSize
	k := 0
	for ; k < 64; k++ {
		if _, ok := f.Tensor(fmt.Sprintf("%d.0.linear.weight", k)); !ok {
			break
		}
	}
	if k == 0 {
		return nil, fmt.Errorf("medusa: %s has no tensor 0.0.linear.weight: not a medusa_lm_head checkpoint", path)
	}
	if _, ok := f.Tensor("0.1.linear.weight"); ok {
		return nil, fmt.Errorf("medusa: %s has heads of more than one residual block (medusa_num_layers > 1), which are not supported", path)
	}
	h, err := New(k, d, v, make([]float32, v*d), false)
	if err != nil {
		return nil, err
	}
	h.target = nil
	for i := range k {
		for _, p := range []struct {
			name  string
			shape []int64
			dst   []float32
		}{
			{fmt.Sprintf("%d.0.linear.weight", i), []int64{int64(d), int64(d)}, h.W[i*d*d : (i+1)*d*d]},
			{fmt.Sprintf("%d.0.linear.bias", i), []int64{int64(d)}, h.B[i*d : (i+1)*d]},
			{fmt.Sprintf("%d.1.weight", i), []int64{int64(v), int64(d)}, h.Out[i*v*d : (i+1)*v*d]},
		} {
			t, ok := f.Tensor(p.name)
			if !ok {
				return nil, fmt.Errorf("medusa: %s: head %d has no tensor %s", path, i, p.name)
			}
			if fmt.Sprint(t.Shape) != fmt.Sprint(p.shape) {
				return nil, fmt.Errorf("medusa: %s: tensor %s has shape %v, but the target (embedding %d, vocabulary %d) needs %v", path, p.name, t.Shape, d, v, p.shape)
			}
			x, err := t.Float32()
			if err != nil {
				return nil, fmt.Errorf("medusa: %s: %w", path, err)
			}
			copy(p.dst, x)
		}
	}
	h.TopK = 10
	h.RankAcc = priorAcc(k, h.TopK)
	if h.Tree, err = BuildTree(h.RankAcc, k, h.TopK, DefaultTreeNodes); err != nil {
		return nil, err
	}
	return h, nil
}
