// Package model holds the transformer forward pass for the llama family
// (Llama 1/2/3, TinyLlama, Mistral, Qwen2, Qwen3) over weights kept in their
// stored format, and the loaders that bind GGUF, llama2.c and Hugging Face
// checkpoints onto the same weights.
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
	Arch       string // llama, qwen2, qwen3 (mistral loads as llama)
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
}

// lookupArch finds a GGUF architecture name in the registry.
func lookupArch(name string) (*arch.Arch, error) {
	a := arch.Lookup(name)
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
	c.QKVBias, c.QKNorm = false, false
	if at, ok := a.Attn.(arch.Attention); ok {
		c.QKVBias = at.HasBias(arch.Dims{Bias: bias})
		c.QKNorm = at.QKNorm
		if !at.Window {
			c.SlidingWindow = 0
		}
	}
}

// dims are the hyper-parameters the declared tensor shapes read.
func (c *Config) dims() arch.Dims {
	return arch.Dims{Embd: c.NEmbd, Heads: c.NHead, KVHeads: c.NKVHead, HeadDim: c.HeadDim, FFN: c.FFN,
		Vocab: c.VocabSize, Bias: c.QKVBias, Tied: c.TiedOutput}
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
	case c.FFN <= 0 || c.FFN > 1<<20:
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
	return nil
}

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
