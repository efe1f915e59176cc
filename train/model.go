// Package train trains llama-family models on the CPU: the block Pagoda's
// model package runs (token embedding, RMSNorm, RoPE attention with GQA
// and a causal mask, SwiGLU feed-forward, final norm, tied or untied output
// head) with a cross-entropy loss, forward and backward written out by hand
// in float32 as llm.c does, AdamW with warm-up and cosine decay, and
// gradient-norm clipping. Checkpoints are GGUF files the model package
// loads unchanged.
//
// The forward pass reproduces the model package's arithmetic: adjacent-pair
// RoPE (ggml's "normal" rope, llama) with the same float32 frequencies and
// float64 angles, RMSNorm x/√(mean(x²)+eps)·w, query head h reading KV head
// h/(Heads/KVHeads), scores scaled by 1/√HeadDim, silu(gate)·up.
package train

import (
	"fmt"
	"math"
)

// Config is a model shape.
type Config struct {
	Dim, Layers, Heads, KVHeads, HeadDim, FFN, Vocab, Context int
	RopeTheta                                                 float64
	RMSEps                                                    float32
	// Tied: the token embedding doubles as the output head (no
	// output.weight).
	Tied bool
}

// Validate reports a shape the trainer (or the model package) cannot run.
func (c Config) Validate() error {
	for _, f := range []struct {
		name string
		v    int
	}{{"dim", c.Dim}, {"layers", c.Layers}, {"heads", c.Heads}, {"kv heads", c.KVHeads},
		{"head dim", c.HeadDim}, {"ffn", c.FFN}, {"vocab", c.Vocab}, {"context", c.Context}} {
		if f.v <= 0 || f.v > 1<<20 {
			return fmt.Errorf("train: %s = %d out of range", f.name, f.v)
		}
	}
	switch {
	case c.Heads%c.KVHeads != 0:
		return fmt.Errorf("train: heads %d is not a multiple of kv heads %d", c.Heads, c.KVHeads)
	case c.HeadDim%2 != 0:
		return fmt.Errorf("train: head dim %d is odd (RoPE rotates pairs)", c.HeadDim)
	case !(c.RopeTheta > 0):
		return fmt.Errorf("train: rope theta %g must be positive", c.RopeTheta)
	case !(c.RMSEps > 0):
		return fmt.Errorf("train: rms eps %g must be positive", c.RMSEps)
	}
	return nil
}

// Tensor is one parameter tensor: its GGUF name, its GGUF dims (row length
// first) and its place in the flat parameter vector.
type Tensor struct {
	Name     string
	Dims     []int
	Off, Len int
	// Matrix: weight decay applies (not to norms).
	Matrix bool
}

// Tensors lists the parameters in the order llama.cpp's converter writes
// them.
func (c Config) Tensors() []Tensor {
	var ts []Tensor
	off := 0
	add := func(name string, matrix bool, dims ...int) {
		n := 1
		for _, d := range dims {
			n *= d
		}
		ts = append(ts, Tensor{Name: name, Dims: dims, Off: off, Len: n, Matrix: matrix})
		off += n
	}
	D, qd, kvd := c.Dim, c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	add("token_embd.weight", true, D, c.Vocab)
	for l := 0; l < c.Layers; l++ {
		p := fmt.Sprintf("blk.%d.", l)
		add(p+"attn_norm.weight", false, D)
		add(p+"attn_q.weight", true, D, qd)
		add(p+"attn_k.weight", true, D, kvd)
		add(p+"attn_v.weight", true, D, kvd)
		add(p+"attn_output.weight", true, qd, D)
		add(p+"ffn_norm.weight", false, D)
		add(p+"ffn_gate.weight", true, D, c.FFN)
		add(p+"ffn_up.weight", true, D, c.FFN)
		add(p+"ffn_down.weight", true, c.FFN, D)
	}
	add("output_norm.weight", false, D)
	if !c.Tied {
		add("output.weight", true, D, c.Vocab)
	}
	return ts
}

// NumParams is the length of the flat parameter vector.
func (c Config) NumParams() int {
	ts := c.Tensors()
	t := ts[len(ts)-1]
	return t.Off + t.Len
}

// layerW views one block's tensors in a flat vector.
type layerW struct {
	attnNorm, wq, wk, wv, wo, ffnNorm, wg, wu, wd []float32
}

// weights views every tensor of a flat vector (parameters or gradients).
type weights struct {
	embd    []float32
	layers  []layerW
	outNorm []float32
	out     []float32 // the embedding when tied
}

func (c Config) views(flat []float32) weights {
	ts := c.Tensors()
	v := func(i int) []float32 { return flat[ts[i].Off : ts[i].Off+ts[i].Len : ts[i].Off+ts[i].Len] }
	w := weights{embd: v(0), layers: make([]layerW, c.Layers)}
	for l := range w.layers {
		b := 1 + 9*l
		w.layers[l] = layerW{v(b), v(b + 1), v(b + 2), v(b + 3), v(b + 4), v(b + 5), v(b + 6), v(b + 7), v(b + 8)}
	}
	w.outNorm = v(1 + 9*c.Layers)
	w.out = w.embd
	if !c.Tied {
		w.out = v(2 + 9*c.Layers)
	}
	return w
}

// freqs are the rotation frequencies exactly as model.Config.Freqs computes
// them (float64 power, rounded to float32).
func (c Config) freqs() []float32 {
	f := make([]float32, c.HeadDim/2)
	for i := range f {
		f[i] = float32(math.Pow(c.RopeTheta, -2*float64(i)/float64(c.HeadDim)))
	}
	return f
}

// Init fills params with the initialisation GPT-2 uses: N(0, 0.02²) for
// matrices, the two residual projections of each block scaled down by
// 1/√(2·Layers), norms at one.
func (c Config) Init(params []float32, seed uint64) {
	r := NewRNG(seed)
	for _, t := range c.Tensors() {
		p := params[t.Off : t.Off+t.Len]
		if !t.Matrix {
			for i := range p {
				p[i] = 1
			}
			continue
		}
		std := 0.02
		if hasSuffix(t.Name, "attn_output.weight") || hasSuffix(t.Name, "ffn_down.weight") {
			std /= math.Sqrt(2 * float64(c.Layers))
		}
		for i := range p {
			p[i] = float32(r.Normal() * std)
		}
	}
}

func hasSuffix(s, suf string) bool { return len(s) >= len(suf) && s[len(s)-len(suf):] == suf }

// RNG is SplitMix64: a single uint64 of state, so a training state file
// can store it and resume the exact sequence.
type RNG struct{ S uint64 }

// NewRNG seeds a generator.
func NewRNG(seed uint64) *RNG { return &RNG{S: seed} }

// Uint64 is the next output.
func (r *RNG) Uint64() uint64 {
	r.S += 0x9e3779b97f4a7c15
	x := r.S
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// Intn is uniform in [0, n).
func (r *RNG) Intn(n int) int { return int(r.Uint64() % uint64(n)) }

// Float64 is uniform in [0, 1).
func (r *RNG) Float64() float64 { return float64(r.Uint64()>>11) / (1 << 53) }

// Normal is a standard normal deviate (Box–Muller).
func (r *RNG) Normal() float64 {
	u := r.Float64()
	for u == 0 {
		u = r.Float64()
	}
	return math.Sqrt(-2*math.Log(u)) * math.Cos(2*math.Pi*r.Float64())
}
