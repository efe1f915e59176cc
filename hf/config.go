// Package hf holds what every reader of a Hugging Face llama-family
// checkpoint (config.json + *.safetensors) must agree on: how config.json
// reads, which GGUF tensor each HF tensor is, and the q/k row order HF
// stores. The model loader and the GGUF converter both use it, so a
// checkpoint loads and converts the same way.
package hf

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"pagoda/arch"
	"pagoda/quant"
)

// Config is config.json with defaults filled in. Sizes are as written
// (unchecked, possibly zero or negative) except for the defaults noted;
// callers hold them to their own limits.
type Config struct {
	ModelType string     // as written: llama, mistral, qwen2, qwen3…
	Arch      string     // the GGUF architecture: llama (also for mistral), qwen2, qwen3…
	Decl      *arch.Arch // the architecture's declaration
	// RopeNeox: qwen2/qwen3 rotate half-split pairs, as HF does. Llama's
	// q/k rows must be reordered (Unpermute) for ggml's adjacent pairs.
	RopeNeox bool

	VocabSize             int
	HiddenSize            int
	IntermediateSize      int
	NumLayers             int
	NumHeads              int
	NumKVHeads            int // num_attention_heads when absent or 0
	HeadDim               int // hidden_size / num_attention_heads when absent or 0 (and heads > 0)
	MaxPositionEmbeddings int // 0 when absent

	RMSEps      float64 // 1e-6 when absent or 0
	RopeTheta   float64 // 10000 when absent or 0
	RopeScaling RopeScaling

	TieWordEmbeddings bool
	AttentionBias     bool
	// SlidingWindow is the attention window, 0 for full attention:
	// sliding_window when positive, unless use_sliding_window is false.
	SlidingWindow int
	HiddenAct     string // "" or silu
	// Quant is the GPTQ/AWQ quantization_config (or quantize_config.json,
	// quant_config.json), nil for float checkpoints.
	Quant *quant.QuantConfig
}

// RopeScaling is config.json's rope_scaling.
type RopeScaling struct {
	Kind           string // "" (none), "linear" or "llama3"
	Factor         float64
	LowFreqFactor  float64
	HighFreqFactor float64
	OriginalMaxPos int
}

// hfConfig is the JSON as written.
type hfConfig struct {
	ModelType             string         `json:"model_type"`
	VocabSize             int            `json:"vocab_size"`
	HiddenSize            int            `json:"hidden_size"`
	IntermediateSize      int            `json:"intermediate_size"`
	NumHiddenLayers       int            `json:"num_hidden_layers"`
	NumAttentionHeads     int            `json:"num_attention_heads"`
	NumKeyValueHeads      int            `json:"num_key_value_heads"`
	HeadDim               int            `json:"head_dim"`
	MaxPositionEmbeddings int            `json:"max_position_embeddings"`
	RMSNormEps            float64        `json:"rms_norm_eps"`
	RopeTheta             float64        `json:"rope_theta"`
	RopeScaling           *hfRopeScaling `json:"rope_scaling"`
	TieWordEmbeddings     bool           `json:"tie_word_embeddings"`
	AttentionBias         bool           `json:"attention_bias"`
	// Qwen2 writes null here when the window is off.
	SlidingWindow    json.RawMessage `json:"sliding_window"`
	UseSlidingWindow *bool           `json:"use_sliding_window"`
	HiddenAct        string          `json:"hidden_act"`
	QuantConfig      json.RawMessage `json:"quantization_config"`
}

type hfRopeScaling struct {
	Type           string  `json:"type"`
	RopeType       string  `json:"rope_type"` // newer transformers' name for type
	Factor         float64 `json:"factor"`
	LowFreqFactor  float64 `json:"low_freq_factor"`
	HighFreqFactor float64 `json:"high_freq_factor"`
	OriginalMaxPos int     `json:"original_max_position_embeddings"`
}

// maxLlama3HeadDim bounds the rope_freqs table llama3 scaling builds; real
// models use 64 to 256.
const maxLlama3HeadDim = 1 << 16

// ReadConfig reads dir/config.json.
func ReadConfig(dir string) (*Config, error) {
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, err
	}
	c, err := ParseConfig(b)
	if err != nil || c.Quant != nil {
		return c, err
	}
	// AutoGPTQ and AutoAWQ wrote their settings beside config.json.
	for _, f := range []struct{ name, method string }{{"quantize_config.json", "gptq"}, {"quant_config.json", "awq"}} {
		b, err := os.ReadFile(filepath.Join(dir, f.name))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if c.Quant, err = quant.ParseQuantConfig(b, f.method); err != nil {
			return nil, fmt.Errorf("%s: %v", f.name, err)
		}
		break
	}
	return c, nil
}

// ParseConfig parses config.json, rejecting model types, activations and
// rope scalings the llama-family forward pass cannot run. Errors start with
// "config.json: ".
func ParseConfig(b []byte) (*Config, error) {
	var r hfConfig
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("config.json: %v", err)
	}
	c := &Config{
		ModelType:             r.ModelType,
		VocabSize:             r.VocabSize,
		HiddenSize:            r.HiddenSize,
		IntermediateSize:      r.IntermediateSize,
		NumLayers:             r.NumHiddenLayers,
		NumHeads:              r.NumAttentionHeads,
		NumKVHeads:            r.NumKeyValueHeads,
		HeadDim:               r.HeadDim,
		MaxPositionEmbeddings: r.MaxPositionEmbeddings,
		RMSEps:                r.RMSNormEps,
		RopeTheta:             r.RopeTheta,
		TieWordEmbeddings:     r.TieWordEmbeddings,
		AttentionBias:         r.AttentionBias,
		HiddenAct:             r.HiddenAct,
	}
	if len(r.QuantConfig) > 0 && string(r.QuantConfig) != "null" {
		q, err := quant.ParseQuantConfig(r.QuantConfig, "")
		if err != nil {
			return nil, fmt.Errorf("config.json: quantization_config: %v", err)
		}
		c.Quant = q
	}
	c.Decl = arch.LookupHF(r.ModelType)
	if c.Decl == nil {
		return nil, fmt.Errorf("config.json: model_type %q not supported (supported: %s)", r.ModelType, strings.Join(arch.HFNames(), ", "))
	}
	c.Arch, c.RopeNeox = c.Decl.Name, c.Decl.Rope() == arch.RopeNeox
	if r.HiddenAct != "" && r.HiddenAct != "silu" {
		return nil, fmt.Errorf("config.json: hidden_act %q not supported", r.HiddenAct)
	}
	if c.NumKVHeads == 0 {
		c.NumKVHeads = c.NumHeads
	}
	if c.HeadDim == 0 && c.NumHeads > 0 {
		c.HeadDim = c.HiddenSize / c.NumHeads
	}
	if c.RopeTheta == 0 {
		c.RopeTheta = 10000
	}
	if c.RMSEps == 0 {
		c.RMSEps = 1e-6
	}
	var sw int
	if len(r.SlidingWindow) > 0 && json.Unmarshal(r.SlidingWindow, &sw) == nil && sw > 0 {
		if r.UseSlidingWindow == nil || *r.UseSlidingWindow {
			c.SlidingWindow = sw
		}
	}
	if rs := r.RopeScaling; rs != nil {
		kind := rs.RopeType
		if kind == "" {
			kind = rs.Type
		}
		switch kind {
		case "llama3", "linear":
		case "", "default":
			kind = ""
		default:
			return nil, fmt.Errorf("config.json: rope_scaling type %q not supported", kind)
		}
		// Llama-3 scaling becomes head_dim/2 rope_freqs values; a negative
		// or absurd head_dim must fail here, not in make.
		if kind == "llama3" && (c.HeadDim < 0 || c.HeadDim > maxLlama3HeadDim) {
			return nil, fmt.Errorf("config.json: head_dim %d out of range for rope_scaling type \"llama3\"", c.HeadDim)
		}
		c.RopeScaling = RopeScaling{Kind: kind, Factor: rs.Factor, LowFreqFactor: rs.LowFreqFactor,
			HighFreqFactor: rs.HighFreqFactor, OriginalMaxPos: rs.OriginalMaxPos}
	}
	return c, nil
}

// PermutedHeads says whether Unpermute must reorder the rows of tensor
// ggufName (llama's q/k weights; never for the neox architectures) and over
// how many heads: num_attention_heads for q, num_key_value_heads for k, as
// configured (not checked to be positive).
func (c *Config) PermutedHeads(ggufName string) (heads int, ok bool) {
	if c.RopeNeox {
		return 0, false
	}
	t, ok := c.Decl.Find(ggufName)
	switch {
	case ok && t.Role == arch.AttnQ:
		return c.NumHeads, true
	case ok && t.Role == arch.AttnK:
		return c.NumKVHeads, true
	}
	return 0, false
}
