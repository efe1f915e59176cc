package convert

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"pagoda/gguf"
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
	case hasMagic(path, gguf.Magic):
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

func hasMagic(path, magic string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	b := make([]byte, len(magic))
	if _, err := io.ReadFull(f, b); err != nil {
		return false
	}
	return string(b) == magic
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
	for _, e := range []struct {
		k string
		v any
	}{
		{"general.architecture", "llama"},
		{"general.name", baseName(path)},
		{"llama.vocab_size", uint32(lc.VocabSize)},
		{"llama.context_length", uint32(lc.SeqLen)},
		{"llama.embedding_length", uint32(lc.Dim)},
		{"llama.block_count", uint32(lc.NLayers)},
		{"llama.feed_forward_length", uint32(lc.HiddenDim)},
		{"llama.attention.head_count", uint32(lc.NHeads)},
		{"llama.attention.head_count_kv", uint32(lc.NKVHeads)},
		{"llama.rope.dimension_count", uint32(hd)},
		// run.c hard-codes both.
		{"llama.rope.freq_base", float32(10000)},
		{"llama.attention.layer_norm_rms_epsilon", float32(1e-5)},
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
	sortCanonical(s.tensors)
	return s, nil
}

// --- Hugging Face ---

type hfConfig struct {
	ModelType             string  `json:"model_type"`
	VocabSize             int     `json:"vocab_size"`
	HiddenSize            int     `json:"hidden_size"`
	IntermediateSize      int     `json:"intermediate_size"`
	NumHiddenLayers       int     `json:"num_hidden_layers"`
	NumAttentionHeads     int     `json:"num_attention_heads"`
	NumKeyValueHeads      int     `json:"num_key_value_heads"`
	HeadDim               int     `json:"head_dim"`
	MaxPositionEmbeddings int     `json:"max_position_embeddings"`
	RMSNormEps            float64 `json:"rms_norm_eps"`
	RopeTheta             float64 `json:"rope_theta"`
	RopeScaling           *struct {
		Type           string  `json:"type"`
		RopeType       string  `json:"rope_type"`
		Factor         float64 `json:"factor"`
		LowFreqFactor  float64 `json:"low_freq_factor"`
		HighFreqFactor float64 `json:"high_freq_factor"`
		OriginalMaxPos int     `json:"original_max_position_embeddings"`
	} `json:"rope_scaling"`
	TieWordEmbeddings bool   `json:"tie_word_embeddings"`
	HiddenAct         string `json:"hidden_act"`
}

// hfLayerNames maps the per-layer HF names to GGUF names, in the order the
// GGUF converter writes a block.
var hfLayerNames = []struct{ hf, gguf string }{
	{"input_layernorm.weight", "attn_norm.weight"},
	{"self_attn.q_proj.weight", "attn_q.weight"},
	{"self_attn.q_proj.bias", "attn_q.bias"},
	{"self_attn.k_proj.weight", "attn_k.weight"},
	{"self_attn.k_proj.bias", "attn_k.bias"},
	{"self_attn.v_proj.weight", "attn_v.weight"},
	{"self_attn.v_proj.bias", "attn_v.bias"},
	{"self_attn.q_norm.weight", "attn_q_norm.weight"},
	{"self_attn.k_norm.weight", "attn_k_norm.weight"},
	{"self_attn.o_proj.weight", "attn_output.weight"},
	{"post_attention_layernorm.weight", "ffn_norm.weight"},
	{"mlp.gate_proj.weight", "ffn_gate.weight"},
	{"mlp.up_proj.weight", "ffn_up.weight"},
	{"mlp.down_proj.weight", "ffn_down.weight"},
}

func ggufName(hf string) (string, bool) {
	switch hf {
	case "model.embed_tokens.weight":
		return "token_embd.weight", true
	case "model.norm.weight":
		return "output_norm.weight", true
	case "lm_head.weight":
		return "output.weight", true
	}
	rest, ok := strings.CutPrefix(hf, "model.layers.")
	if !ok {
		return "", false
	}
	i := strings.IndexByte(rest, '.')
	if i <= 0 {
		return "", false
	}
	layer, suffix := rest[:i], rest[i+1:]
	for _, c := range layer {
		if c < '0' || c > '9' {
			return "", false
		}
	}
	for _, m := range hfLayerNames {
		if m.hf == suffix {
			return "blk." + layer + "." + m.gguf, true
		}
	}
	return "", false
}

// canonicalRank orders tensors as the GGUF converters write them:
// embeddings and rope_freqs, then the blocks, then the output head.
func canonicalRank(name string) (int, int, int) {
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
	for i, m := range hfLayerNames {
		if m.gguf == rest {
			return 1, l, i
		}
	}
	return 1, l, len(hfLayerNames)
}

func sortCanonical(ts []*srcTensor) {
	sort.SliceStable(ts, func(i, j int) bool {
		a0, a1, a2 := canonicalRank(ts[i].name)
		b0, b1, b2 := canonicalRank(ts[j].name)
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
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, err
	}
	var hc hfConfig
	if err := json.Unmarshal(b, &hc); err != nil {
		return nil, fmt.Errorf("config.json: %v", err)
	}
	var arch string
	neox := false
	switch hc.ModelType {
	case "llama", "mistral":
		arch = "llama"
	case "qwen2", "qwen3":
		arch, neox = hc.ModelType, true
	default:
		return nil, fmt.Errorf("config.json: model_type %q not supported (supported: llama, mistral, qwen2, qwen3)", hc.ModelType)
	}
	if hc.HiddenAct != "" && hc.HiddenAct != "silu" {
		return nil, fmt.Errorf("config.json: hidden_act %q not supported", hc.HiddenAct)
	}
	if hc.NumHiddenLayers <= 0 || hc.HiddenSize <= 0 || hc.NumAttentionHeads <= 0 || hc.IntermediateSize <= 0 {
		return nil, fmt.Errorf("config.json: num_hidden_layers, hidden_size, num_attention_heads and intermediate_size must be positive")
	}
	kvHeads := hc.NumKeyValueHeads
	if kvHeads == 0 {
		kvHeads = hc.NumAttentionHeads
	}
	headDim := hc.HeadDim
	if headDim == 0 {
		headDim = hc.HiddenSize / hc.NumAttentionHeads
	}
	theta := hc.RopeTheta
	if theta == 0 {
		theta = 10000
	}
	eps := hc.RMSNormEps
	if eps == 0 {
		eps = 1e-6
	}
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
	a := arch + "."
	meta := []struct {
		k string
		v any
	}{
		{"general.architecture", arch},
		{"general.name", baseName(dir)},
		{a + "vocab_size", uint32(vocab)},
		{a + "context_length", uint32(ctx)},
		{a + "embedding_length", uint32(hc.HiddenSize)},
		{a + "block_count", uint32(hc.NumHiddenLayers)},
		{a + "feed_forward_length", uint32(hc.IntermediateSize)},
		{a + "attention.head_count", uint32(hc.NumAttentionHeads)},
		{a + "attention.head_count_kv", uint32(kvHeads)},
		{a + "attention.key_length", uint32(headDim)},
		{a + "attention.value_length", uint32(headDim)},
		{a + "rope.dimension_count", uint32(headDim)},
		{a + "rope.freq_base", float32(theta)},
		{a + "attention.layer_norm_rms_epsilon", float32(eps)},
	}
	var ropeFreqs []float32
	if rs := hc.RopeScaling; rs != nil {
		kind := rs.RopeType
		if kind == "" {
			kind = rs.Type
		}
		switch kind {
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
		case "", "default":
		default:
			return fail(fmt.Errorf("config.json: rope_scaling type %q not supported", kind))
		}
	}
	for _, e := range meta {
		if err := s.setKV(e.k, e.v); err != nil {
			return fail(err)
		}
	}
	_, hasHead := set.Tensor("lm_head.weight")
	tied := hc.TieWordEmbeddings || !hasHead
	for _, hn := range set.Names() {
		if strings.HasSuffix(hn, "rotary_emb.inv_freq") {
			continue // recomputed from rope_theta
		}
		name, ok := ggufName(hn)
		if !ok {
			return fail(fmt.Errorf("tensor %q: no GGUF name for it (supported: llama, mistral, qwen2, qwen3 layouts)", hn))
		}
		if name == "output.weight" && tied {
			continue
		}
		t, _ := set.Tensor(hn)
		st, err := hfTensor(name, t, arch, neox, hc.NumAttentionHeads, kvHeads)
		if err != nil {
			return fail(fmt.Errorf("tensor %q: %w", hn, err))
		}
		s.tensors = append(s.tensors, st)
	}
	if ropeFreqs != nil {
		data := f32Bytes(ropeFreqs)
		s.tensors = append(s.tensors, &srcTensor{name: "rope_freqs.weight", typ: quant.F32,
			dims: []uint64{uint64(len(ropeFreqs))}, data: func() ([]byte, error) { return data, nil }})
	}
	sortCanonical(s.tensors)
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
// biases), and llama q/k rows taken out of the rotate-half order HF uses.
func hfTensor(name string, t *safetensors.Tensor, arch string, neox bool, heads, kvHeads int) (*srcTensor, error) {
	var typ quant.Type
	switch t.DType {
	case "F32":
		typ = quant.F32
	case "F16":
		typ = quant.F16
	case "BF16":
		typ = quant.BF16
	default:
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
	if !neox && len(dims) == 2 && (strings.HasSuffix(name, ".attn_q.weight") || strings.HasSuffix(name, ".attn_k.weight")) {
		h := heads
		if strings.HasSuffix(name, ".attn_k.weight") {
			h = kvHeads
		}
		rows := int(dims[1])
		if h <= 0 || rows%h != 0 || (rows/h)%2 != 0 {
			return nil, fmt.Errorf("%d rows do not split into %d heads of even size", rows, h)
		}
		rb, err := quant.RowSize(typ, int(dims[0]))
		if err != nil {
			return nil, err
		}
		st.data = func() ([]byte, error) { return unpermute(raw, rb, rows, h), nil }
	}
	return st, nil
}

// unpermute reorders each head's rows from HF's [x_0..x_{h/2-1}, y_0..]
// (rotate-half) to [x_0, y_0, x_1, y_1, …], the adjacent pairs of ggml's
// "normal" rope, undoing the permutation llama.cpp's converter applies.
func unpermute(data []byte, rowBytes, rows, heads int) []byte {
	hd := rows / heads
	out := make([]byte, rows*rowBytes)
	for h := 0; h < heads; h++ {
		for i := 0; i < hd/2; i++ {
			for j := 0; j < 2; j++ {
				dst := h*hd + 2*i + j
				src := h*hd + j*(hd/2) + i
				copy(out[dst*rowBytes:(dst+1)*rowBytes], data[src*rowBytes:(src+1)*rowBytes])
			}
		}
	}
	return out
}

// --- tokenizers ---

// tokenizerKV reads the tokenizer.* metadata of a GGUF file, or builds it
// from a llama2.c tokenizer.bin or a Hugging Face tokenizer.json (or the
// directory holding it).
func tokenizerKV(path string) ([]gguf.KV, error) {
	if hasMagic(path, gguf.Magic) {
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
