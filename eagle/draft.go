// Package eagle is EAGLE speculative drafting (Li et al. 2024) with
// EAGLE-2's dynamic draft trees: a one-layer draft that autoregresses on
// the target's own features. At position j its input is
// FC([e(x_{j+1}); f_j]) — the target's (frozen) embedding of the next
// token beside the target's final hidden state at j — and one llama
// decoder layer (RoPE attention over its own KV cache, SwiGLU MLP) turns
// that into f̂_{j+1}, the predicted feature of the next position; the
// target's frozen output head applied to f̂ gives the draft's next-token
// distribution, and f̂ is fed back as the feature of the next draft step.
//
// Conventions, as EAGLE's published code has them: the features are the
// output head's input (after the target's output norm, what
// model.Batch.Hidden returns), the draft's output goes to the head with no
// norm of its own, and the decoder layer has no input norm (the FC output
// is the attention input; only the MLP has its RMSNorm, EAGLE's
// post_attention_layernorm).
//
// Wiring into the engine (`--spec eagle --heads FILE`):
//
//	d, err := eagle.Load(file, target, targetPath) // checks the side file's target checksum and shapes
//	p := d.Proposer(eagle.ProposerOptions{TopK: 8, Depth: 6})
//	// p is a spec.FeatureProposer: Req.Max is the tree's node budget,
//	// Req.Parent the tree, Req.Probs stays empty.
//
// Load also accepts EAGLE's published draft checkpoint as a .safetensors
// file (or a directory holding model.safetensors), when its shapes are the
// target's. Train a draft with Train (`pagoda heads train --kind eagle`).
package eagle

import (
	"fmt"

	"pagoda/kernels"
	"pagoda/model"
	"pagoda/quant"
)

// Shape is the draft layer's geometry, from the target's config but for
// FFN, which may be smaller.
type Shape struct {
	D, Heads, KVHeads, HeadDim, FFN, Vocab int
}

// ShapeOf is the draft shape that fits target c, with the target's FFN
// width when ffn is 0.
func ShapeOf(c *model.Config, ffn int) Shape {
	if ffn <= 0 {
		ffn = c.FFN
	}
	return Shape{D: c.NEmbd, Heads: c.NHead, KVHeads: c.NKVHead, HeadDim: c.HeadDim, FFN: ffn, Vocab: c.VocabSize}
}

func (s Shape) String() string {
	return fmt.Sprintf("d %d, %d heads (%d KV) of %d, FFN %d, vocab %d", s.D, s.Heads, s.KVHeads, s.HeadDim, s.FFN, s.Vocab)
}

// tensor is one parameter tensor of the draft within the flat vector.
type tensor struct {
	name       string // GGUF name, eagle.-prefixed
	rows, cols int    // cols 0: a vector of rows elements
	off        int
	matrix     bool
}

func (t tensor) size() int {
	if t.cols == 0 {
		return t.rows
	}
	return t.rows * t.cols
}

// tensors lists the draft's parameters in their flat order.
func (s Shape) tensors() []tensor {
	d, qd, kvd := s.D, s.Heads*s.HeadDim, s.KVHeads*s.HeadDim
	ts := []tensor{
		{name: "eagle.fc.weight", rows: d, cols: 2 * d, matrix: true},
		{name: "eagle.fc.bias", rows: d},
		{name: "eagle.blk.0.attn_q.weight", rows: qd, cols: d, matrix: true},
		{name: "eagle.blk.0.attn_k.weight", rows: kvd, cols: d, matrix: true},
		{name: "eagle.blk.0.attn_v.weight", rows: kvd, cols: d, matrix: true},
		{name: "eagle.blk.0.attn_output.weight", rows: d, cols: qd, matrix: true},
		{name: "eagle.blk.0.ffn_norm.weight", rows: d},
		{name: "eagle.blk.0.ffn_gate.weight", rows: s.FFN, cols: d, matrix: true},
		{name: "eagle.blk.0.ffn_up.weight", rows: s.FFN, cols: d, matrix: true},
		{name: "eagle.blk.0.ffn_down.weight", rows: d, cols: s.FFN, matrix: true},
	}
	off := 0
	for i := range ts {
		ts[i].off = off
		off += ts[i].size()
	}
	return ts
}

func (s Shape) numParams() int {
	ts := s.tensors()
	last := ts[len(ts)-1]
	return last.off + last.size()
}

func (s Shape) validate() error {
	if s.D <= 0 || s.Heads <= 0 || s.KVHeads <= 0 || s.HeadDim <= 0 || s.FFN <= 0 || s.Vocab <= 0 {
		return fmt.Errorf("eagle: bad draft shape (%v)", s)
	}
	if s.Heads%s.KVHeads != 0 {
		return fmt.Errorf("eagle: %d heads do not group over %d KV heads", s.Heads, s.KVHeads)
	}
	return nil
}

// weights are views of the flat parameters (or of their gradients).
type weights struct {
	fc, fcb, q, k, v, o, norm, gate, up, down []float32
	// q8, when set, is the matrices quantized to Q8_0 for proposing
	// (nil entries: widths that are not whole Q8_0 blocks stay float32).
	q8 *[nMats]*kernels.Matrix
}

func (s Shape) views(flat []float32) weights {
	ts := s.tensors()
	v := func(i int) []float32 { return flat[ts[i].off : ts[i].off+ts[i].size()] }
	return weights{fc: v(0), fcb: v(1), q: v(2), k: v(3), v: v(4), o: v(5), norm: v(6), gate: v(7), up: v(8), down: v(9)}
}

// Draft is an EAGLE draft layer bound to its target. Its methods are not
// safe for concurrent use; a Proposer owns one.
type Draft struct {
	Shape  Shape
	Params []float32
	w      weights
	// Accuracy is the held-out top-1 agreement with the target per draft
	// depth, as recorded by training (empty for a published checkpoint).
	Accuracy []float64

	target *model.Model
	// targetSum is model.FileChecksum of the target the draft was made for.
	targetSum string
	eps       float32
	freqs     []float32
	cos, sin  []float32 // the rotations by position (ropeTable)
	neox      bool
	pool      *kernels.Pool
	// headF is the output head dequantized (Vocab×D), built for training.
	headF []float32
}

// newDraft makes a zero draft of shape s for target.
func newDraft(s Shape, target *model.Model, targetSum string) (*Draft, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	c := &target.Config
	if want := ShapeOf(c, s.FFN); s != want {
		return nil, fmt.Errorf("eagle: draft shape (%v) does not fit the target (%v)", s, want)
	}
	if c.MLA || c.QKNorm || c.QKVBias {
		return nil, fmt.Errorf("eagle: the draft layer is a plain llama block; target architecture %s (MLA/QK-norm/QKV bias) is not supported", c.Arch)
	}
	w := target.W
	if w == nil || w.Embd == nil || w.Output == nil || w.Embd.Rows != c.VocabSize || w.Output.Rows != c.VocabSize ||
		w.Embd.Cols != c.NEmbd || w.Output.Cols != c.NEmbd {
		return nil, fmt.Errorf("eagle: the target's embedding and output head must be whole (vocab %d × %d) on this process", c.VocabSize, c.NEmbd)
	}
	d := &Draft{Shape: s, Params: make([]float32, s.numParams()), target: target, targetSum: targetSum,
		eps: c.RMSEps, freqs: c.Freqs(), neox: c.RopeNeox, pool: kernels.NewPool(1)}
	if 2*len(d.freqs) > s.HeadDim {
		return nil, fmt.Errorf("eagle: rope dims %d exceed the head dim %d", 2*len(d.freqs), s.HeadDim)
	}
	d.w = s.views(d.Params)
	return d, nil
}

// quantized is the draft's weights with Q8_0 copies of its matrices: a
// proposal runs a few rows at a time, where reading the weights is the
// cost, and Q8_0 reads a quarter of float32's bytes (the target's own
// matrices are usually quantized as much).
func (d *Draft) quantized() (weights, error) {
	w := d.w
	var q8 [nMats]*kernels.Matrix
	for i, f := range [nMats][]float32{w.fc, w.q, w.k, w.v, w.o, w.gate, w.up, w.down} {
		t := d.Shape.tensors()[[nMats]int{0, 2, 3, 4, 5, 7, 8, 9}[i]]
		if t.cols%32 != 0 {
			continue
		}
		rb, err := quant.RowSize(quant.Q8_0, t.cols)
		if err != nil {
			return weights{}, err
		}
		b := make([]byte, t.rows*rb)
		for r := range t.rows {
			quant.QuantizeQ8_0(f[r*t.cols:(r+1)*t.cols], b[r*rb:(r+1)*rb])
		}
		m, err := kernels.NewMatrix(quant.Q8_0, t.rows, t.cols, b)
		if err != nil {
			return weights{}, err
		}
		q8[i] = m
	}
	w.q8 = &q8
	return w, nil
}

// Close releases the draft's thread pool.
func (d *Draft) Close() { d.pool.Close() }

// SetThreads sets the threads the draft's matrix products use.
func (d *Draft) SetThreads(n int) {
	d.pool.Close()
	d.pool = kernels.NewPool(max(1, n))
}

// TargetChecksum is the identity of the target the draft belongs to.
func (d *Draft) TargetChecksum() string { return d.targetSum }

// FeatureDim is the width of the target features the draft reads.
func (d *Draft) FeatureDim() int { return d.Shape.D }
