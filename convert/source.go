package convert

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"pagoda/arch"
	"pagoda/gguf"
	"pagoda/hf"
	"pagoda/llama2c"
	"pagoda/model"
	"pagoda/quant"
	"pagoda/safetensors"
)

// srcTensor is one tensor of an input model under its GGUF name.
type srcTensor struct {
	name string
	typ  quant.Type
	dims []uint64
	// data returns the stored bytes; called once, when the tensor is
	// written, so permuted or widened copies live one tensor at a time.
	data func() ([]byte, error)
}

func (t *srcTensor) rows() int {
	r := 1
	for _, d := range t.dims[1:] {
		r *= int(d)
	}
	return r
}

// source is an opened input model: GGUF metadata and tensors, whatever the
// file format.
type source struct {
	kv      []gguf.KV
	tensors []*srcTensor
	closers []io.Closer
	// warnings for the caller to pass on (a tokenizer left out, …).
	warnings []string
}

func (s *source) Close() error {
	var errs []error
	for _, c := range s.closers {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

func (s *source) get(key string) (gguf.Value, bool) {
	for _, kv := range s.kv {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return gguf.Value{}, false
}

// uintKey reads an integer key; per-layer arrays give their first element,
// as llama.cpp's hparams accessors for layer 0 do.
func (s *source) uintKey(key string) int {
	v, ok := s.get(key)
	if !ok {
		return 0
	}
	if v.Type == gguf.Array {
		if arr, ok := v.V.([]int32); ok && len(arr) > 0 && arr[0] > 0 {
			return int(arr[0])
		}
		if arr, ok := v.V.([]uint32); ok && len(arr) > 0 {
			return int(min(arr[0], 1<<30))
		}
		return 0
	}
	u, ok := v.Uint()
	if !ok {
		return 0
	}
	return int(min(u, 1<<30))
}

func (s *source) hparams() hparams {
	var h hparams
	if v, ok := s.get("general.architecture"); ok {
		h.arch, _ = v.V.(string)
	}
	a := h.arch + "."
	h.nLayer = s.uintKey(a + "block_count")
	h.nHead = s.uintKey(a + "attention.head_count")
	h.nHeadKV = s.uintKey(a + "attention.head_count_kv")
	if h.nHeadKV == 0 {
		h.nHeadKV = h.nHead
	}
	h.nExpert = s.uintKey(a + "expert_count")
	return h
}

// setKV adds or replaces a metadata entry.
func (s *source) setKV(key string, v any) error {
	val, err := gguf.ToValue(v)
	if err != nil {
		return fmt.Errorf("metadata %s: %w", key, err)
	}
	for i := range s.kv {
		if s.kv[i].Key == key {
			s.kv[i].Value = val
			return nil
		}
	}
	s.kv = append(s.kv, gguf.KV{Key: key, Value: val})
	return nil
}

// useTokenizer replaces the tokenizer.* metadata with that of file tok.
func (s *source) useTokenizer(tok string) error {
	kv, err := tokenizerKV(tok)
	if err != nil {
		return fmt.Errorf("tokenizer %s: %w", tok, err)
	}
	out := s.kv[:0:0]
	for _, e := range s.kv {
		if !strings.HasPrefix(e.Key, "tokenizer.") {
			out = append(out, e)
		}
	}
	s.kv = append(out, kv...)
	return nil
}

// openSource opens a GGUF file, a llama2.c checkpoint or a Hugging Face
// directory. tok, when set, names a tokenizer file whose vocabulary
// replaces the model's own.
func openSource(path, tok string) (*source, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	var s *source
	switch {
	case st.IsDir():
		s, err = openHF(path)
	case gguf.IsGGUF(path):
		s, err = openGGUF(path)
	default:
		s, err = openLlama2C(path)
	}
	if err != nil {
		return nil, err
	}
	if tok != "" {
		if err := s.useTokenizer(tok); err != nil {
			s.Close()
			return nil, err
		}
	} else if st.IsDir() {
		// An HF checkpoint usually carries its tokenizer.json; use it when
		// it converts, and say why not otherwise.
		for _, name := range []string{"tokenizer.json", "tokenizer.json.gz"} {
			if _, err := os.Stat(filepath.Join(path, name)); err != nil {
				continue
			}
			if err := s.useTokenizer(path); err != nil {
				s.warnings = append(s.warnings, fmt.Sprintf("no tokenizer metadata written (%v); load the model with a separate tokenizer", err))
			}
			break
		}
	}
	return s, nil
}

func openGGUF(path string) (*source, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	if n, ok := f.Uint("split.count"); ok && n > 1 {
		f.Close()
		return nil, fmt.Errorf("a shard of a %d-file split model; merge it first (llama-gguf-split --merge)", n)
	}
	s := &source{kv: f.KV, closers: []io.Closer{f}}
	for _, t := range f.Tensors {
		t := t
		s.tensors = append(s.tensors, &srcTensor{name: t.Name, typ: t.Type, dims: t.Dims,
			data: func() ([]byte, error) { return t.Data, nil }})
	}
	return s, nil
}

func baseName(path string) string {
	b := filepath.Base(filepath.Clean(path))
	return strings.TrimSuffix(b, filepath.Ext(b))
}

// --- llama2.c ---

func openLlama2C(path string) (*source, error) {
	c, err := llama2c.Open(path)
	if err != nil {
		return nil, err
	}
	lc := c.Config
	s := &source{closers: []io.Closer{c}}
	hd := lc.HeadDim()
	a := llama2c.Arch().Name + "."
	for _, e := range []struct {
		k string
		v any
	}{
		{"general.architecture", llama2c.Arch().Name},
		{"general.name", baseName(path)},
		{a + "vocab_size", uint32(lc.VocabSize)},
		{a + "context_length", uint32(lc.SeqLen)},
		{a + "embedding_length", uint32(lc.Dim)},
		{a + "block_count", uint32(lc.NLayers)},
		{a + "feed_forward_length", uint32(lc.HiddenDim)},
		{a + "attention.head_count", uint32(lc.NHeads)},
		{a + "attention.head_count_kv", uint32(lc.NKVHeads)},
		{a + "rope.dimension_count", uint32(hd)},
		// run.c hard-codes both.
		{a + "rope.freq_base", float32(10000)},
		{a + "attention.layer_norm_rms_epsilon", float32(1e-5)},
	} {
		if err := s.setKV(e.k, e.v); err != nil {
			c.Close()
			return nil, err
		}
	}
	for _, t := range c.Tensors {
		t := t
		s.tensors = append(s.tensors, &srcTensor{name: t.Name, typ: t.Type, dims: t.Dims,
			data: func() ([]byte, error) { return t.Data, nil }})
	}
	sortCanonical(s.tensors, llama2c.Arch())
	return s, nil
}

// --- Hugging Face ---

// canonicalRank orders tensors as the GGUF converters write them:
// embeddings and rope_freqs, then the blocks (in the order the architecture
// declares them), then the output head.
func canonicalRank(name string, a *arch.Arch) (int, int, int) {
	switch name {
	case "token_embd.weight":
		return 0, 0, 0
	case "rope_freqs.weight":
		return 0, 0, 1
	case "output_norm.weight":
		return 2, 0, 0
	case "output.weight":
		return 2, 0, 1
	}
	l := layerOf(name)
	if l < 0 {
		return 3, 0, 0
	}
	rest := name[strings.IndexByte(name[4:], '.')+5:]
	return 1, l, a.BlockOrder(rest)
}

func sortCanonical(ts []*srcTensor, a *arch.Arch) {
	sort.SliceStable(ts, func(i, j int) bool {
		a0, a1, a2 := canonicalRank(ts[i].name, a)
		b0, b1, b2 := canonicalRank(ts[j].name, a)
		if a0 != b0 {
			return a0 < b0
		}
		if a1 != b1 {
			return a1 < b1
		}
		if a2 != b2 {
			return a2 < b2
		}
		return ts[i].name < ts[j].name
	})
}

func openHF(dir string) (*source, error) {
	hc, err := hf.ReadConfig(dir)
	if err != nil {
		return nil, err
	}
	archName := hc.Arch
	if hc.NumLayers <= 0 || hc.HiddenSize <= 0 || hc.NumHeads <= 0 || hc.IntermediateSize <= 0 {
		return nil, fmt.Errorf("config.json: num_hidden_layers, hidden_size, num_attention_heads and intermediate_size must be positive")
	}
	kvHeads, headDim, theta, eps := hc.NumKVHeads, hc.HeadDim, hc.RopeTheta, hc.RMSEps
	ctx := hc.MaxPositionEmbeddings
	if ctx <= 0 {
		ctx = 2048
	}

	set, err := safetensors.OpenDir(dir)
	if err != nil {
		return nil, err
	}
	s := &source{closers: []io.Closer{set}}
	fail := func(err error) (*source, error) {
		set.Close()
		return nil, err
	}
	vocab := hc.VocabSize
	if t, ok := set.Tensor("model.embed_tokens.weight"); ok && len(t.Shape) == 2 {
		vocab = int(t.Shape[0])
	}
	a := archName + "."
	meta := []struct {
		k string
		v any
	}{
		{"general.architecture", archName},
		{"general.name", baseName(dir)},
		{a + "vocab_size", uint32(vocab)},
		{a + "context_length", uint32(ctx)},
		{a + "embedding_length", uint32(hc.HiddenSize)},
		{a + "block_count", uint32(hc.NumLayers)},
		{a + "feed_forward_length", uint32(hc.IntermediateSize)},
		{a + "attention.head_count", uint32(hc.NumHeads)},
		{a + "attention.head_count_kv", uint32(kvHeads)},
		{a + "attention.key_length", uint32(headDim)},
		{a + "attention.value_length", uint32(headDim)},
		{a + "rope.dimension_count", uint32(headDim)},
		{a + "rope.freq_base", float32(theta)},
		{a + "attention.layer_norm_rms_epsilon", float32(eps)},
	}
	var ropeFreqs []float32
	switch rs := hc.RopeScaling; rs.Kind {
	case "llama3":
		// llama.cpp's converter bakes Llama-3.1 scaling into a
		// rope_freqs tensor; the loaders read it from there.
		ropeFreqs = model.Llama3RopeFreqs(headDim, theta, rs.Factor, rs.LowFreqFactor, rs.HighFreqFactor, rs.OriginalMaxPos)
	case "linear":
		meta = append(meta, struct {
			k string
			v any
		}{a + "rope.scaling.type", "linear"}, struct {
			k string
			v any
		}{a + "rope.scaling.factor", float32(rs.Factor)})
	}
	for _, e := range meta {
		if err := s.setKV(e.k, e.v); err != nil {
			return fail(err)
		}
	}
	_, hasHead := set.Tensor("lm_head.weight")
	if _, ok := set.Tensor("lm_head.qweight"); ok && hc.Quant != nil {
		hasHead = true // a quantized lm_head (lm_head: true)
	}
	tied := hc.TieWordEmbeddings || !hasHead
	for _, hn := range set.Names() {
		if strings.HasSuffix(hn, "rotary_emb.inv_freq") {
			continue // recomputed from rope_theta
		}
		if hc.IsQuantPart(set, hn) {
			continue // read with its qweight
		}
		stored := hn
		if base, ok := strings.CutSuffix(hn, ".qweight"); ok && hc.Quant != nil {
			hn = base + ".weight" // a GPTQ/AWQ layer in place of this weight
		}
		name, ok := hc.GGUFName(hn)
		if !ok {
			return fail(fmt.Errorf("tensor %q: no GGUF name for it in the %s layout", stored, hc.ModelType))
		}
		if name == "output.weight" && tied {
			continue
		}
		heads, permute := hc.PermutedHeads(name)
		var st *srcTensor
		if stored != hn {
			st, err = hfQuantTensor(hc, set, hn, name, permute, heads)
		} else {
			t, _ := set.Tensor(hn)
			st, err = hfTensor(name, t, permute, heads)
		}
		if err != nil {
			return fail(fmt.Errorf("tensor %q: %w", stored, err))
		}
		s.tensors = append(s.tensors, st)
	}
	d := arch.Dims{Embd: hc.HiddenSize, Heads: hc.NumHeads, KVHeads: kvHeads, HeadDim: headDim, FFN: hc.IntermediateSize,
		Vocab: vocab, Bias: hc.AttentionBias, Tied: tied}
	if err := checkHFShapes(hc, d, s.tensors); err != nil {
		return fail(err)
	}
	if ropeFreqs != nil {
		data := f32Bytes(ropeFreqs)
		s.tensors = append(s.tensors, &srcTensor{name: "rope_freqs.weight", typ: quant.F32,
			dims: []uint64{uint64(len(ropeFreqs))}, data: func() ([]byte, error) { return data, nil }})
	}
	sortCanonical(s.tensors, hc.Decl)
	return s, nil
}

func f32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return b
}

// hfTensor wraps one safetensors tensor: dims reversed to ggml order, 1-D
// tensors widened to F32 (as llama.cpp's converter stores norms and
// biases), and, when permute is set, llama q/k rows taken out of the
// rotate-half order HF uses.
func hfTensor(name string, t *safetensors.Tensor, permute bool, heads int) (*srcTensor, error) {
	typ, ok := hf.TensorType(t.DType)
	if !ok {
		return nil, fmt.Errorf("dtype %s not supported (F32, F16, BF16)", t.DType)
	}
	if len(t.Shape) == 0 || len(t.Shape) > 4 {
		return nil, fmt.Errorf("%d dimensions", len(t.Shape))
	}
	dims := make([]uint64, len(t.Shape))
	for i, d := range t.Shape {
		if d <= 0 {
			return nil, fmt.Errorf("shape %v", t.Shape)
		}
		dims[len(t.Shape)-1-i] = uint64(d)
	}
	st := &srcTensor{name: name, typ: typ, dims: dims}
	raw := t.Data
	if len(dims) == 1 && typ != quant.F32 {
		st.typ = quant.F32
		st.data = func() ([]byte, error) {
			f := make([]float32, dims[0])
			if err := quant.Dequantize(typ, raw, f); err != nil {
				return nil, err
			}
			return f32Bytes(f), nil
		}
		return st, nil
	}
	st.data = func() ([]byte, error) { return raw, nil }
	if h := heads; permute && len(dims) == 2 {
		rows := int(dims[1])
		if h <= 0 || rows%h != 0 || (rows/h)%2 != 0 {
			return nil, fmt.Errorf("%d rows do not split into %d heads of even size", rows, h)
		}
		rb, err := quant.RowSize(typ, int(dims[0]))
		if err != nil {
			return nil, err
		}
		st.data = func() ([]byte, error) {
			out := hf.Unpermute(raw, rb, rows, h)
			if out == nil {
				return nil, fmt.Errorf("%d bytes for %d rows of %d", len(raw), rows, rb)
			}
			return out, nil
		}
	}
	return st, nil
}

// --- tokenizers ---

// tokenizerKV reads the tokenizer.* metadata of a GGUF file, or builds it
// from a llama2.c tokenizer.bin or a Hugging Face tokenizer.json (or the
// directory holding it).
func tokenizerKV(path string) ([]gguf.KV, error) {
	if gguf.IsGGUF(path) {
		f, err := gguf.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		var out []gguf.KV
		for _, kv := range f.KV {
			// Decoded values own their memory, so they outlive Close.
			if strings.HasPrefix(kv.Key, "tokenizer.") {
				out = append(out, kv)
			}
		}
		if len(out) == 0 {
			return nil, fmt.Errorf("no tokenizer.* metadata")
		}
		return out, nil
	}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return hfTokenizerKV(path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if t := bytes.TrimSpace(b); bytes.HasPrefix(t, []byte("{")) || bytes.HasPrefix(b, []byte{0x1f, 0x8b}) {
		return hfTokenizerKV(path)
	}
	v, err := llama2c.ParseVocab(b)
	if err != nil {
		return nil, err
	}
	if len(v.Tokens) < 3 {
		return nil, fmt.Errorf("only %d tokens", len(v.Tokens))
	}
	var out []gguf.KV
	for _, e := range []struct {
		k string
		v any
	}{
		{"tokenizer.ggml.model", "llama"},
		{"tokenizer.ggml.tokens", v.Pieces()},
		{"tokenizer.ggml.scores", v.Scores},
		{"tokenizer.ggml.token_type", v.Types()},
		// llama2.c's tokenizer.bin is SentencePiece's: <unk>, <s>, </s>.
		{"tokenizer.ggml.bos_token_id", uint32(1)},
		{"tokenizer.ggml.eos_token_id", uint32(2)},
		{"tokenizer.ggml.unknown_token_id", uint32(0)},
		{"tokenizer.ggml.add_bos_token", true},
		{"tokenizer.ggml.add_eos_token", false},
	} {
		val, err := gguf.ToValue(e.v)
		if err != nil {
			return nil, err
		}
		out = append(out, gguf.KV{Key: e.k, Value: val})
	}
	return out, nil
}
