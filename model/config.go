// Package model holds the transformer forward pass for the llama family
// (Llama 1/2/3, TinyLlama, Mistral, Qwen2, Qwen3), the mixture-of-experts
// models (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, DeepSeek-V2/V3 with
// multi-head latent attention) over weights kept in their stored format,
// and the loaders that bind GGUF, llama2.c and Hugging Face checkpoints
// onto the same weights (mixture-of-experts and MLA from GGUF only).
package model

import (
	"fmt"
	"math"
	"strings"

	"pagoda/arch"
)

// Config is the architecture and hyper-parameters of a model, whatever
// format it came from.
type Config struct {
	Arch       string // a registered GGUF architecture (mistral loads as llama)
	NLayer     int
	NEmbd      int
	NHead      int
	NKVHead    int
	HeadDim    int
	FFN        int
	VocabSize  int
	ContextLen int

	RopeTheta     float64
	RopeDim       int     // dimensions of each head that rotate (= HeadDim normally)
	RopeNeox      bool    // half-split pairs (qwen2/qwen3); otherwise adjacent pairs
	RopeScale     float64 // linear position scaling factor (1 = none)
	RopeFreqs     []float32
	RMSEps        float32
	SlidingWindow int // 0 = full attention

	// TiedOutput, QKVBias, QKNorm and RopeNeox restate the declaration
	// (package arch) resolved for this checkpoint; setArch sets them.
	TiedOutput bool
	QKVBias    bool
	QKNorm     bool
	QKNormFull bool // q/k norms span all heads at once (olmoe)

	// Mixture of experts (NExpert 0: a dense model). Layers from
	// NDenseLead on route each token to NExpertUsed of NExpert experts of
	// width ExpertFFN; shared experts (total width SharedFFN, 0: none) run
	// on every token, scaled by a sigmoid gate when SharedGate.
	NExpert, NExpertUsed int
	ExpertFFN, SharedFFN int
	NDenseLead           int
	Gating               arch.Gating
	ExpertNorm           bool    // renormalise the selected weights to sum 1
	ExpertScale          float32 // multiply the selected weights (0 or 1: no scaling)
	SharedGate           bool

	// Multi-head latent attention (deepseek2). The KV cache holds KVLoRA +
	// QKRope values per token and layer, one entry for all heads: NKVHead
	// is 1 and HeadDim is KVLoRA+QKRope, the cache's K row, which also
	// serves as V (KVShape). QLoRA is the low-rank query width (0: attn_q).
	MLA                                     bool
	QLoRA, KVLoRA, QKNope, QKRope, VHeadDim int
	KVBCombined                             bool // the file stores attn_kv_b, not attn_k_b/attn_v_b

	// Pooling is how the file says embeddings pool (GGUF
	// <arch>.pooling_type: "none", "mean", "cls", "last", "rank"); ""
	// when it does not say.
	Pooling string
}

// KVShape is what the KV cache stores per token and layer: nkv heads of
// kdim keys and vdim values; vdim 0 means the K row serves as V too (MLA's
// latent).
func (c *Config) KVShape() (nkv, kdim, vdim int) {
	if c.MLA {
		return 1, c.KVLoRA + c.QKRope, 0
	}
	return c.NKVHead, c.HeadDim, c.HeadDim
}

// KVBytesPerToken is the KV cache bytes one token takes over all layers
// with elemSize-byte values, and mha, what storing every query head's full
// K and V would take: for MLA the multi-head equivalent of the latent (K
// QKNope+QKRope, V VHeadDim per head), otherwise the model without GQA.
func (c *Config) KVBytesPerToken(elemSize int) (cache, mha int64) {
	nkv, kd, vd := c.KVShape()
	per := int64(c.NLayer) * int64(elemSize)
	cache = per * int64(nkv*(kd+vd))
	if c.MLA {
		return cache, per * int64(c.NHead*(c.QKNope+c.QKRope+c.VHeadDim))
	}
	return cache, per * int64(c.NHead*2*c.HeadDim)
}

// AttnHeadDim is the per-head width attention scores are scaled by: the
// head dimension, or for MLA the query/key head (unrotated plus rope part).
func (c *Config) AttnHeadDim() int {
	if c.MLA {
		return c.QKNope + c.QKRope
	}
	return c.HeadDim
}

// lookupArch finds a GGUF architecture name in the registry.
func lookupArch(name string) (*arch.Arch, error) {
	a := arch.Lookup(name)
	if a == nil && arch.LookupEncoder(name) != nil {
		return nil, fmt.Errorf("architecture %q is an encoder (an embedding model): it computes embeddings, not text", name)
	}
	if a == nil {
		return nil, fmt.Errorf("architecture %q not supported (supported: %s)", name, strings.Join(arch.Names(), ", "))
	}
	return a, nil
}

// setArch resolves the declaration's per-architecture choices for this
// checkpoint; bias is whether it asks for q/k/v biases where the
// architecture leaves that open (HF llama's attention_bias).
func (c *Config) setArch(a *arch.Arch, bias bool) {
	c.Arch = a.Name
	c.RopeNeox = a.Rope() == arch.RopeNeox
	c.QKVBias, c.QKNorm, c.QKNormFull, c.MLA = false, false, false, false
	switch at := a.Attn.(type) {
	case arch.Attention:
		c.QKVBias = at.HasBias(arch.Dims{Bias: bias})
		c.QKNorm = at.QKNorm || at.QKNormFull
		c.QKNormFull = at.QKNormFull
		if !at.Window {
			c.SlidingWindow = 0
		}
	case arch.MLA:
		c.MLA = true
		c.SlidingWindow = 0
	}
	if moe, ok := a.MoE.(arch.MoE); ok && c.NExpert > 0 {
		c.Gating, c.ExpertNorm, c.SharedGate = moe.Gating, moe.Norm, moe.SharedGate
	}
}

// dims are the hyper-parameters the declared tensor shapes read.
func (c *Config) dims() arch.Dims {
	return arch.Dims{Embd: c.NEmbd, Heads: c.NHead, KVHeads: c.NKVHead, HeadDim: c.HeadDim, FFN: c.FFN,
		Vocab: c.VocabSize, Bias: c.QKVBias, Tied: c.TiedOutput,
		Experts: c.NExpert, ExpertFFN: c.ExpertFFN, SharedFFN: c.SharedFFN, DenseLead: c.NDenseLead,
		QLoRA: c.QLoRA, KVLoRA: c.KVLoRA, QKNope: c.QKNope, QKRope: c.QKRope, VHead: c.VHeadDim,
		KVBCombined: c.KVBCombined}
}

// Validate checks that the hyper-parameters are consistent, so a corrupt
// file fails here with a message instead of panicking in the forward pass.
func (c *Config) Validate() error {
	for i, f := range c.RopeFreqs {
		// A zero, negative or NaN divisor turns every rotation into NaN.
		if !(f > 0) || math.IsInf(float64(f), 0) {
			return fmt.Errorf("rope_freqs[%d] = %g: want a finite positive divisor", i, f)
		}
	}
	switch {
	case c.NLayer <= 0 || c.NLayer > 1024:
		return fmt.Errorf("block count %d out of range", c.NLayer)
	case c.NEmbd <= 0 || c.NEmbd > 1<<17:
		return fmt.Errorf("embedding length %d out of range", c.NEmbd)
	case c.NHead <= 0 || c.NHead > 4096:
		return fmt.Errorf("head count %d out of range", c.NHead)
	case c.NKVHead <= 0 || c.NKVHead > c.NHead || c.NHead%c.NKVHead != 0:
		return fmt.Errorf("KV head count %d does not divide head count %d", c.NKVHead, c.NHead)
	case c.HeadDim <= 0 || c.HeadDim > 1024 || c.HeadDim%2 != 0:
		return fmt.Errorf("head dimension %d out of range", c.HeadDim)
	case c.RopeDim <= 0 || c.RopeDim > c.HeadDim || c.RopeDim%2 != 0:
		return fmt.Errorf("rope dimension %d out of range (head dimension %d)", c.RopeDim, c.HeadDim)
	case (c.FFN <= 0 && !c.allMoE()) || c.FFN < 0 || c.FFN > 1<<20:
		return fmt.Errorf("feed-forward length %d out of range", c.FFN)
	case c.VocabSize <= 0 || c.VocabSize > 1<<22:
		return fmt.Errorf("vocabulary size %d out of range", c.VocabSize)
	case c.ContextLen <= 0:
		return fmt.Errorf("context length %d out of range", c.ContextLen)
	case !(c.RopeTheta > 0) || math.IsInf(c.RopeTheta, 0):
		return fmt.Errorf("rope theta %g out of range", c.RopeTheta)
	case !(c.RMSEps > 0) || c.RMSEps > 1:
		return fmt.Errorf("rms epsilon %g out of range", c.RMSEps)
	case c.RopeFreqs != nil && len(c.RopeFreqs) != c.RopeDim/2:
		return fmt.Errorf("rope_freqs has %d entries, want %d", len(c.RopeFreqs), c.RopeDim/2)
	}
	if c.NExpert > 0 {
		switch {
		case c.NExpert > 1<<12:
			return fmt.Errorf("expert count %d out of range", c.NExpert)
		case c.NExpertUsed <= 0 || c.NExpertUsed > c.NExpert:
			return fmt.Errorf("experts used per token %d out of range [1, %d]", c.NExpertUsed, c.NExpert)
		case c.ExpertFFN <= 0 || c.ExpertFFN > 1<<20:
			return fmt.Errorf("expert feed-forward length %d out of range", c.ExpertFFN)
		case c.SharedFFN < 0 || c.SharedFFN > 1<<20:
			return fmt.Errorf("shared expert feed-forward length %d out of range", c.SharedFFN)
		case c.NDenseLead < 0 || c.NDenseLead > c.NLayer:
			return fmt.Errorf("leading dense block count %d out of range [0, %d]", c.NDenseLead, c.NLayer)
		case c.Gating != arch.GatingSoftmax && c.Gating != arch.GatingSigmoid:
			return fmt.Errorf("unknown expert gating function %d (softmax 1, sigmoid 2)", c.Gating)
		case !(c.ExpertScale >= 0) || math.IsInf(float64(c.ExpertScale), 0):
			return fmt.Errorf("expert weights scale %g out of range", c.ExpertScale)
		}
	}
	if c.MLA {
		switch {
		case c.KVLoRA <= 0 || c.KVLoRA > 1<<14:
			return fmt.Errorf("MLA kv_lora_rank %d out of range", c.KVLoRA)
		case c.QLoRA < 0 || c.QLoRA > 1<<16:
			return fmt.Errorf("MLA q_lora_rank %d out of range", c.QLoRA)
		case c.QKNope <= 0 || c.QKNope > 1024 || c.VHeadDim <= 0 || c.VHeadDim > 1024:
			return fmt.Errorf("MLA head dims out of range: qk_nope %d, v %d", c.QKNope, c.VHeadDim)
		case c.QKRope != c.RopeDim:
			return fmt.Errorf("MLA rope head dim %d differs from rope dimension count %d", c.QKRope, c.RopeDim)
		case c.NKVHead != 1 || c.HeadDim != c.KVLoRA+c.QKRope:
			return fmt.Errorf("MLA cache row %d×%d, want 1×%d (kv_lora_rank + rope)", c.NKVHead, c.HeadDim, c.KVLoRA+c.QKRope)
		}
	}
	return nil
}

// allMoE says whether every layer's feed-forward part is mixture of
// experts, so the dense width is unused.
func (c *Config) allMoE() bool { return c.NExpert > 0 && c.NDenseLead == 0 }

// Freqs returns the angular frequency of each rotated pair, with rope_freqs
// and linear scaling folded in.
func (c *Config) Freqs() []float32 {
	n := c.RopeDim / 2
	f := make([]float32, n)
	scale := c.RopeScale
	if scale <= 0 {
		scale = 1
	}
	for i := range f {
		v := math.Pow(c.RopeTheta, -2*float64(i)/float64(c.RopeDim)) / scale
		if c.RopeFreqs != nil {
			v /= float64(c.RopeFreqs[i])
		}
		f[i] = float32(v)
	}
	return f
}

// Params counts the weights (embeddings included once when tied).
func (c *Config) Params() int64 {
	a := arch.Lookup(c.Arch)
	if a == nil {
		return 0
	}
	return a.Params(c.dims(), c.NLayer)
}

// Llama3RopeFreqs computes the per-pair divisors of Llama-3.1 rope scaling,
// as llama.cpp's converter writes them into rope_freqs.weight.
func Llama3RopeFreqs(headDim int, theta, factor, lowFreqFactor, highFreqFactor float64, origCtx int) []float32 {
	lowWavelen := float64(origCtx) / lowFreqFactor
	highWavelen := float64(origCtx) / highFreqFactor
	out := make([]float32, headDim/2)
	for i := range out {
		freq := 1 / math.Pow(theta, float64(2*i)/float64(headDim))
		wavelen := 2 * math.Pi / freq
		switch {
		case wavelen < highWavelen:
			out[i] = 1
		case wavelen > lowWavelen:
			out[i] = float32(factor)
		default:
			smooth := (float64(origCtx)/wavelen - lowFreqFactor) / (highFreqFactor - lowFreqFactor)
			out[i] = float32(1 / ((1-smooth)/factor + smooth))
		}
	}
	return out
}
