package model

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"pagoda/gguf"
	"pagoda/kernels"
	"pagoda/llama2c"
	"pagoda/quant"
	"pagoda/safetensors"
	"pagoda/tokenizer"
)

// Options control loading.
type Options struct {
	// Tokenizer is a tokenizer file (GGUF, tokenizer.json, llama2.c
	// tokenizer.bin) that overrides or supplies the model's own.
	Tokenizer string
	// Threads for the matmul pool (0 = number of CPUs).
	Threads int
	// Pool shares an existing worker pool instead of starting one.
	Pool *kernels.Pool
	// Reference selects the plain Go kernels (the slow, obvious path tests
	// hold the fast one against).
	Reference bool
	// ContextLen overrides the context length (0 = the model's).
	ContextLen int
}

// Open loads a model from a GGUF file, a llama2.c checkpoint (.bin) or a
// Hugging Face directory (config.json + *.safetensors).
func Open(path string, o Options) (*Model, error) {
	m, err := open(path, o)
	if err != nil {
		if strings.Contains(err.Error(), path) {
			// The format reader already named the file.
			return nil, fmt.Errorf("model: %w", err)
		}
		return nil, fmt.Errorf("model: %s: %w", path, err)
	}
	return m, nil
}

func open(path string, o Options) (*Model, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	var (
		cfg    *Config
		src    source
		tok    tokenizer.Tokenizer
		closer io.Closer
	)
	switch {
	case st.IsDir():
		cfg, src, closer, err = openHF(path)
	case strings.HasSuffix(strings.ToLower(path), ".gguf") && !isGGUF(path):
		return nil, fmt.Errorf("not a GGUF file (no GGUF magic at the start)")
	case isGGUF(path):
		var f *gguf.File
		f, err = gguf.Open(path)
		if err != nil {
			return nil, err
		}
		closer = f
		cfg, err = configFromGGUF(f)
		if err == nil {
			src = ggufSource{f}
			if o.Tokenizer == "" {
				tok, err = tokenizer.FromGGUF(f)
				if err != nil {
					err = fmt.Errorf("tokenizer: %w", err)
				}
			}
		}
	default:
		var c *llama2c.Checkpoint
		c, err = llama2c.Open(path)
		if err != nil {
			return nil, err
		}
		closer = c
		cfg = configFromLlama2C(c.Config)
		src = llama2cSource{c}
	}
	if err != nil {
		if closer != nil {
			closer.Close()
		}
		return nil, err
	}
	if o.Tokenizer != "" {
		tok, err = tokenizer.Load(o.Tokenizer)
		if err != nil {
			closer.Close()
			return nil, fmt.Errorf("tokenizer %s: %w", o.Tokenizer, err)
		}
	}
	if o.ContextLen > 0 {
		cfg.ContextLen = o.ContextLen
	}
	m, err := newModel(cfg, src, o)
	if err != nil {
		closer.Close()
		return nil, err
	}
	m.closer = closer
	m.tok = tok
	if tok != nil && tok.Vocab().Size() > cfg.VocabSize {
		m.Close()
		return nil, fmt.Errorf("tokenizer has %d tokens but the model only %d", tok.Vocab().Size(), cfg.VocabSize)
	}
	return m, nil
}

func isGGUF(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	var b [4]byte
	if _, err := io.ReadFull(f, b[:]); err != nil {
		return false
	}
	return string(b[:]) == "GGUF"
}

// --- GGUF ---

type ggufSource struct{ f *gguf.File }

func (s ggufSource) tensor(name string) (*rawTensor, bool) {
	t := s.f.Tensor(name)
	if t == nil {
		return nil, false
	}
	return &rawTensor{Type: t.Type, Dims: t.Dims, Data: t.Data}, true
}

func configFromGGUF(f *gguf.File) (*Config, error) {
	arch, ok := f.String("general.architecture")
	if !ok {
		return nil, fmt.Errorf("general.architecture missing")
	}
	c := &Config{Arch: arch, RopeScale: 1}
	switch arch {
	case "llama", "mistral":
		c.Arch = "llama"
	case "qwen2":
		c.RopeNeox, c.QKVBias = true, true
	case "qwen3":
		c.RopeNeox, c.QKNorm = true, true
	default:
		return nil, fmt.Errorf("architecture %q not supported (supported: llama, mistral, qwen2, qwen3)", arch)
	}
	var missing []string
	u := func(key string) int {
		v, ok := f.Uint(arch + "." + key)
		if !ok {
			missing = append(missing, arch+"."+key)
			return 0
		}
		if v > 1<<31 {
			return -1
		}
		return int(v)
	}
	c.NLayer = u("block_count")
	c.NEmbd = u("embedding_length")
	c.FFN = u("feed_forward_length")
	c.NHead = u("attention.head_count")
	c.ContextLen = u("context_length")
	if len(missing) > 0 {
		return nil, fmt.Errorf("metadata missing: %s", strings.Join(missing, ", "))
	}
	c.NKVHead = c.NHead
	if v, ok := f.Uint(arch + ".attention.head_count_kv"); ok {
		c.NKVHead = int(min(v, 1<<20))
	}
	if c.NHead > 0 {
		c.HeadDim = c.NEmbd / c.NHead
	}
	if v, ok := f.Uint(arch + ".attention.key_length"); ok {
		c.HeadDim = int(min(v, 1<<20))
	}
	c.RopeDim = c.HeadDim
	if v, ok := f.Uint(arch + ".rope.dimension_count"); ok {
		c.RopeDim = int(min(v, 1<<20))
	}
	c.RopeTheta = 10000
	if v, ok := f.Float(arch + ".rope.freq_base"); ok {
		c.RopeTheta = v
	}
	c.RMSEps = 1e-5
	if v, ok := f.Float(arch + ".attention.layer_norm_rms_epsilon"); ok {
		c.RMSEps = float32(v)
	}
	if v, ok := f.Uint(arch + ".attention.sliding_window"); ok {
		c.SlidingWindow = int(min(v, 1<<30))
	}
	if t, ok := f.String(arch + ".rope.scaling.type"); ok && t == "linear" {
		if v, ok := f.Float(arch + ".rope.scaling.factor"); ok && v > 0 {
			c.RopeScale = v
		}
	}
	if emb := f.Tensor("token_embd.weight"); emb != nil && len(emb.Dims) == 2 {
		c.VocabSize = int(min(emb.Dims[1], 1<<31))
	}
	c.TiedOutput = f.Tensor("output.weight") == nil
	if rf := f.Tensor("rope_freqs.weight"); rf != nil {
		n := c.RopeDim / 2
		if rf.Type != quant.F32 || len(rf.Data) < 4*n {
			return nil, fmt.Errorf("tensor \"rope_freqs.weight\": want %d F32 values", n)
		}
		c.RopeFreqs = make([]float32, n)
		if err := quant.Dequantize(quant.F32, rf.Data[:4*n], c.RopeFreqs); err != nil {
			return nil, err
		}
	}
	return c, c.Validate()
}

// --- llama2.c ---

type llama2cSource struct{ c *llama2c.Checkpoint }

func (s llama2cSource) tensor(name string) (*rawTensor, bool) {
	t := s.c.Tensor(name)
	if t == nil {
		return nil, false
	}
	return &rawTensor{Type: t.Type, Dims: t.Dims, Data: t.Data}, true
}

func configFromLlama2C(lc llama2c.Config) *Config {
	c := &Config{
		Arch:       "llama",
		NLayer:     lc.NLayers,
		NEmbd:      lc.Dim,
		NHead:      lc.NHeads,
		NKVHead:    lc.NKVHeads,
		FFN:        lc.HiddenDim,
		VocabSize:  lc.VocabSize,
		ContextLen: lc.SeqLen,
		RopeTheta:  10000,
		RopeScale:  1,
		RMSEps:     1e-5,
		TiedOutput: lc.SharedClassifier,
	}
	if c.NHead > 0 {
		c.HeadDim = c.NEmbd / c.NHead
	}
	c.RopeDim = c.HeadDim
	return c
}

// --- Hugging Face ---

type hfConfig struct {
	ModelType             string          `json:"model_type"`
	Architectures         []string        `json:"architectures"`
	VocabSize             int             `json:"vocab_size"`
	HiddenSize            int             `json:"hidden_size"`
	IntermediateSize      int             `json:"intermediate_size"`
	NumHiddenLayers       int             `json:"num_hidden_layers"`
	NumAttentionHeads     int             `json:"num_attention_heads"`
	NumKeyValueHeads      int             `json:"num_key_value_heads"`
	HeadDim               int             `json:"head_dim"`
	MaxPositionEmbeddings int             `json:"max_position_embeddings"`
	RMSNormEps            float64         `json:"rms_norm_eps"`
	RopeTheta             float64         `json:"rope_theta"`
	RopeScaling           *hfRopeScaling  `json:"rope_scaling"`
	TieWordEmbeddings     bool            `json:"tie_word_embeddings"`
	AttentionBias         bool            `json:"attention_bias"`
	SlidingWindow         json.RawMessage `json:"sliding_window"`
	UseSlidingWindow      *bool           `json:"use_sliding_window"`
	HiddenAct             string          `json:"hidden_act"`
}

type hfRopeScaling struct {
	Type           string  `json:"type"`
	RopeType       string  `json:"rope_type"`
	Factor         float64 `json:"factor"`
	LowFreqFactor  float64 `json:"low_freq_factor"`
	HighFreqFactor float64 `json:"high_freq_factor"`
	OriginalMaxPos int     `json:"original_max_position_embeddings"`
}

type hfSource struct {
	set  *safetensors.Set
	cfg  *Config
	perm map[string]*rawTensor // q/k weights with the rotate-half permutation undone
}

var hfNames = map[string]string{
	"attn_norm.weight":   "input_layernorm.weight",
	"attn_q.weight":      "self_attn.q_proj.weight",
	"attn_k.weight":      "self_attn.k_proj.weight",
	"attn_v.weight":      "self_attn.v_proj.weight",
	"attn_output.weight": "self_attn.o_proj.weight",
	"attn_q.bias":        "self_attn.q_proj.bias",
	"attn_k.bias":        "self_attn.k_proj.bias",
	"attn_v.bias":        "self_attn.v_proj.bias",
	"attn_q_norm.weight": "self_attn.q_norm.weight",
	"attn_k_norm.weight": "self_attn.k_norm.weight",
	"ffn_norm.weight":    "post_attention_layernorm.weight",
	"ffn_gate.weight":    "mlp.gate_proj.weight",
	"ffn_up.weight":      "mlp.up_proj.weight",
	"ffn_down.weight":    "mlp.down_proj.weight",
}

func hfName(name string) string {
	switch name {
	case "token_embd.weight":
		return "model.embed_tokens.weight"
	case "output_norm.weight":
		return "model.norm.weight"
	case "output.weight":
		return "lm_head.weight"
	}
	var layer int
	var rest string
	if n, _ := fmt.Sscanf(name, "blk.%d.%s", &layer, &rest); n == 2 {
		if hf, ok := hfNames[rest]; ok {
			return fmt.Sprintf("model.layers.%d.%s", layer, hf)
		}
	}
	return ""
}

func (s *hfSource) tensor(name string) (*rawTensor, bool) {
	if t, ok := s.perm[name]; ok {
		return t, true
	}
	hn := hfName(name)
	if hn == "" {
		return nil, false
	}
	t, ok := s.set.Tensor(hn)
	if !ok {
		return nil, false
	}
	var typ quant.Type
	switch t.DType {
	case "F32":
		typ = quant.F32
	case "F16":
		typ = quant.F16
	case "BF16":
		typ = quant.BF16
	default:
		// An unsupported dtype reaches the binder as an unknown type
		// with a name in the error.
		return &rawTensor{Type: quant.Type(0xFFFF), DType: t.DType}, true
	}
	dims := make([]uint64, len(t.Shape))
	for i, d := range t.Shape {
		dims[len(t.Shape)-1-i] = uint64(d)
	}
	rt := &rawTensor{Type: typ, Dims: dims, Data: t.Data}
	// HF llama checkpoints store q/k rows in the rotate-half order; ggml's
	// "normal" rope wants adjacent pairs, as llama.cpp's converter
	// arranges them.
	if !s.cfg.RopeNeox && (strings.HasSuffix(name, "attn_q.weight") || strings.HasSuffix(name, "attn_k.weight")) && len(dims) == 2 {
		heads := s.cfg.NHead
		if strings.HasSuffix(name, "attn_k.weight") {
			heads = s.cfg.NKVHead
		}
		p, err := unpermute(rt, heads)
		if err == nil {
			s.perm[name] = p
			return p, true
		}
	}
	return rt, true
}

func (s *hfSource) fileName(name string) string { return hfName(name) }

// unpermute reorders the rows of each head from [x_0..x_{h/2-1}, y_0..] to
// [x_0, y_0, x_1, y_1, …].
func unpermute(t *rawTensor, heads int) (*rawTensor, error) {
	rows := int(t.Dims[1])
	rb, err := quant.RowSize(t.Type, int(t.Dims[0]))
	if err != nil || heads <= 0 || rows%heads != 0 || len(t.Data) < rows*rb {
		return nil, fmt.Errorf("cannot unpermute")
	}
	hd := rows / heads
	out := make([]byte, rows*rb)
	for h := 0; h < heads; h++ {
		for i := 0; i < hd/2; i++ {
			for j := 0; j < 2; j++ {
				dst := h*hd + 2*i + j
				src := h*hd + j*(hd/2) + i
				copy(out[dst*rb:(dst+1)*rb], t.Data[src*rb:(src+1)*rb])
			}
		}
	}
	return &rawTensor{Type: t.Type, Dims: t.Dims, Data: out}, nil
}

func openHF(dir string) (*Config, source, io.Closer, error) {
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, nil, nil, err
	}
	var hc hfConfig
	if err := json.Unmarshal(b, &hc); err != nil {
		return nil, nil, nil, fmt.Errorf("config.json: %v", err)
	}
	c := &Config{
		NLayer:     hc.NumHiddenLayers,
		NEmbd:      hc.HiddenSize,
		NHead:      hc.NumAttentionHeads,
		NKVHead:    hc.NumKeyValueHeads,
		HeadDim:    hc.HeadDim,
		FFN:        hc.IntermediateSize,
		VocabSize:  hc.VocabSize,
		ContextLen: hc.MaxPositionEmbeddings,
		RopeTheta:  hc.RopeTheta,
		RopeScale:  1,
		RMSEps:     float32(hc.RMSNormEps),
		TiedOutput: hc.TieWordEmbeddings,
	}
	switch hc.ModelType {
	case "llama", "mistral":
		c.Arch = "llama"
		c.QKVBias = hc.AttentionBias
	case "qwen2":
		c.Arch, c.RopeNeox, c.QKVBias = "qwen2", true, true
	case "qwen3":
		c.Arch, c.RopeNeox, c.QKNorm = "qwen3", true, true
	default:
		return nil, nil, nil, fmt.Errorf("config.json: model_type %q not supported (supported: llama, mistral, qwen2, qwen3)", hc.ModelType)
	}
	if hc.HiddenAct != "" && hc.HiddenAct != "silu" {
		return nil, nil, nil, fmt.Errorf("config.json: hidden_act %q not supported", hc.HiddenAct)
	}
	if c.NKVHead == 0 {
		c.NKVHead = c.NHead
	}
	if c.HeadDim == 0 && c.NHead > 0 {
		c.HeadDim = c.NEmbd / c.NHead
	}
	c.RopeDim = c.HeadDim
	if c.RopeTheta == 0 {
		c.RopeTheta = 10000
	}
	if c.RMSEps == 0 {
		c.RMSEps = 1e-6
	}
	var sw int
	if len(hc.SlidingWindow) > 0 && json.Unmarshal(hc.SlidingWindow, &sw) == nil && sw > 0 {
		if hc.UseSlidingWindow == nil || *hc.UseSlidingWindow {
			c.SlidingWindow = sw
		}
	}
	if rs := hc.RopeScaling; rs != nil {
		kind := rs.RopeType
		if kind == "" {
			kind = rs.Type
		}
		switch kind {
		case "llama3":
			c.RopeFreqs = Llama3RopeFreqs(c.RopeDim, c.RopeTheta, rs.Factor, rs.LowFreqFactor, rs.HighFreqFactor, rs.OriginalMaxPos)
		case "linear":
			if rs.Factor > 0 {
				c.RopeScale = rs.Factor
			}
		case "", "default":
		default:
			return nil, nil, nil, fmt.Errorf("config.json: rope_scaling type %q not supported", kind)
		}
	}
	if err := c.Validate(); err != nil {
		return nil, nil, nil, fmt.Errorf("config.json: %v", err)
	}
	set, err := safetensors.OpenDir(dir)
	if err != nil {
		return nil, nil, nil, err
	}
	if _, ok := set.Tensor("lm_head.weight"); !ok {
		c.TiedOutput = true
	}
	return c, &hfSource{set: set, cfg: c, perm: map[string]*rawTensor{}}, set, nil
}
