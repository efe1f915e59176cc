package train

import (
	"fmt"
	"math"

	"pagoda/gguf"
	"pagoda/quant"
)

// WriteGGUF writes the model as a llama GGUF file that `pagoda run`,
// `serve` and `eval` load unchanged: F32 weights (Q8_0 for the matrices
// when q8 is set, as llama-quantize would store them), the vocabulary's
// tokenizer metadata, and name as general.name.
func (m *Model) WriteGGUF(path, name string, v *Vocab, q8 bool) error {
	if v == nil {
		return m.WriteGGUFMeta(path, name, nil, q8)
	}
	if len(v.Tokens) != m.Config.Vocab {
		return fmt.Errorf("train: vocabulary has %d tokens, model %d", len(v.Tokens), m.Config.Vocab)
	}
	return m.WriteGGUFMeta(path, name, v.Meta(), q8)
}

// WriteGGUFMeta is WriteGGUF with the tokenizer metadata given as entries
// (a distilled draft copies its target's verbatim).
func (m *Model) WriteGGUFMeta(path, name string, meta []Meta, q8 bool) error {
	c := m.Config
	w := gguf.NewWriter()
	var err error
	set := func(k string, val any) {
		if err == nil {
			err = w.Set(k, val)
		}
	}
	ftype := uint32(0)
	if q8 {
		ftype = 7
	}
	set("general.architecture", "llama")
	set("general.name", name)
	set("general.file_type", ftype)
	if q8 {
		set("general.quantization_version", uint32(2))
	}
	set("llama.vocab_size", uint32(c.Vocab))
	set("llama.context_length", uint32(c.Context))
	set("llama.embedding_length", uint32(c.Dim))
	set("llama.block_count", uint32(c.Layers))
	set("llama.feed_forward_length", uint32(c.FFN))
	set("llama.attention.head_count", uint32(c.Heads))
	set("llama.attention.head_count_kv", uint32(c.KVHeads))
	set("llama.attention.key_length", uint32(c.HeadDim))
	set("llama.attention.value_length", uint32(c.HeadDim))
	set("llama.rope.dimension_count", uint32(c.HeadDim))
	set("llama.rope.freq_base", float32(c.RopeTheta))
	set("llama.attention.layer_norm_rms_epsilon", c.RMSEps)
	for _, kv := range meta {
		set(kv.Key, kv.Value)
	}
	if err != nil {
		return fmt.Errorf("train: %w", err)
	}
	for _, t := range c.Tensors() {
		dims := make([]uint64, len(t.Dims))
		for i, d := range t.Dims {
			dims[i] = uint64(d)
		}
		data := m.Params[t.Off : t.Off+t.Len]
		typ := quant.F32
		if q8 && t.Matrix && t.Dims[0]%quant.Q8_0.BlockSize() == 0 {
			typ = quant.Q8_0
		}
		size, err := quant.RowSize(typ, t.Dims[0])
		if err != nil {
			return err
		}
		buf := make([]byte, size*(t.Len/t.Dims[0]))
		if err := quant.QuantizeInto(typ, data, buf); err != nil {
			return fmt.Errorf("train: %s: %w", t.Name, err)
		}
		if err := w.AddTensor(t.Name, typ, dims, buf); err != nil {
			return fmt.Errorf("train: %w", err)
		}
	}
	return w.WriteFile(path)
}

// ReadGGUF loads a llama GGUF written by WriteGGUF (or any llama GGUF of
// this block's shape, at any weight type package quant dequantizes) into
// a new model, with its vocabulary when it has one this package wrote.
func ReadGGUF(path string, threads int) (*Model, *Vocab, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	if a, _ := f.String("general.architecture"); a != "llama" {
		return nil, nil, fmt.Errorf("train: %s: architecture %q, want llama", path, a)
	}
	u := func(k string) int {
		x, _ := f.Uint("llama." + k)
		return int(x)
	}
	c := Config{Dim: u("embedding_length"), Layers: u("block_count"), Heads: u("attention.head_count"),
		KVHeads: u("attention.head_count_kv"), FFN: u("feed_forward_length"), Context: u("context_length"), RopeTheta: 10000, RMSEps: 1e-5}
	if c.Heads > 0 {
		c.HeadDim = c.Dim / c.Heads
	}
	if x := u("attention.key_length"); x > 0 {
		c.HeadDim = x
	}
	if x, ok := f.Float("llama.rope.freq_base"); ok {
		c.RopeTheta = x
	}
	if x, ok := f.Float("llama.attention.layer_norm_rms_epsilon"); ok {
		c.RMSEps = float32(x)
	}
	emb := f.Tensor("token_embd.weight")
	if emb == nil || len(emb.Dims) != 2 {
		return nil, nil, fmt.Errorf("train: %s: no 2-D token_embd.weight", path)
	}
	c.Vocab = int(emb.Dims[1])
	c.Tied = f.Tensor("output.weight") == nil
	m, err := NewModel(c, threads)
	if err != nil {
		return nil, nil, fmt.Errorf("%w (%s)", err, path)
	}
	for _, t := range c.Tensors() {
		ti := f.Tensor(t.Name)
		if ti == nil {
			m.Close()
			return nil, nil, fmt.Errorf("train: %s: tensor %s missing", path, t.Name)
		}
		n := 1
		for _, d := range ti.Dims {
			n *= int(d)
		}
		if n != t.Len || int(ti.Dims[0]) != t.Dims[0] {
			m.Close()
			return nil, nil, fmt.Errorf("train: %s: tensor %s has dims %v, want %v", path, t.Name, ti.Dims, t.Dims)
		}
		if err := quant.Dequantize(ti.Type, ti.Data, m.Params[t.Off:t.Off+t.Len]); err != nil {
			m.Close()
			return nil, nil, fmt.Errorf("train: %s: %w", t.Name, err)
		}
	}
	for _, v := range m.Params {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			m.Close()
			return nil, nil, fmt.Errorf("train: %s: non-finite weight", path)
		}
	}
	var v *Vocab
	if _, ok := f.String("tokenizer.ggml.model"); ok {
		if v, err = VocabFromGGUF(f); err != nil {
			v = nil
		}
	}
	return m, v, nil
}
