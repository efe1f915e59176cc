package model

import (
	"fmt"
	"math"

	"pagoda/kernels"
	"pagoda/quant"
)

// rawTensor is a tensor as a loader found it: GGUF name, ggml dims (Dims[0]
// is the row length) and the stored bytes.
type rawTensor struct {
	Type quant.Type
	Dims []uint64
	Data []byte
	// DType names a stored type that has no ggml id (safetensors I8,
	// F8_E4M3…), for messages.
	DType string
}

func (t *rawTensor) typeName() string {
	if t.DType != "" {
		return t.DType
	}
	return t.Type.String()
}

// fileNamer is a source whose files name tensors otherwise (Hugging Face);
// messages then give the file's name, which the user can find.
type fileNamer interface{ fileName(name string) string }

func label(src source, name string) string {
	if fn, ok := src.(fileNamer); ok {
		if f := fn.fileName(name); f != "" && f != name {
			return fmt.Sprintf("%q (%s)", f, name)
		}
	}
	return fmt.Sprintf("%q", name)
}

// source is what every checkpoint format offers the binder: tensors by their
// GGUF names.
type source interface {
	tensor(name string) (*rawTensor, bool)
}

// Layer holds one transformer block's weights.
type Layer struct {
	AttnNorm            []float32
	Q, K, V, O          *kernels.Matrix
	QBias, KBias, VBias []float32
	QNorm, KNorm        []float32
	FFNNorm             []float32
	Gate, Up, Down      *kernels.Matrix
}

// Weights is the whole model's parameters, bound by GGUF tensor names.
type Weights struct {
	Embd       *kernels.Matrix
	Layers     []Layer
	OutputNorm []float32
	Output     *kernels.Matrix
}

// bind looks up every tensor the config calls for, checks its shape and
// type, and wraps it without copying.
func bind(src source, c *Config) (*Weights, error) {
	var err error
	mat := func(name string, rows, cols int) *kernels.Matrix {
		if err != nil {
			return nil
		}
		var m *kernels.Matrix
		m, err = bindMatrix(src, name, rows, cols)
		return m
	}
	vec := func(name string, n int, optional bool) []float32 {
		if err != nil {
			return nil
		}
		var v []float32
		v, err = bindVector(src, name, n, optional)
		return v
	}
	d, q, kv := c.NEmbd, c.NHead*c.HeadDim, c.NKVHead*c.HeadDim
	w := &Weights{Layers: make([]Layer, c.NLayer)}
	w.Embd = mat("token_embd.weight", c.VocabSize, d)
	for i := range w.Layers {
		l := &w.Layers[i]
		p := fmt.Sprintf("blk.%d.", i)
		l.AttnNorm = vec(p+"attn_norm.weight", d, false)
		l.Q = mat(p+"attn_q.weight", q, d)
		l.K = mat(p+"attn_k.weight", kv, d)
		l.V = mat(p+"attn_v.weight", kv, d)
		l.O = mat(p+"attn_output.weight", d, q)
		if c.QKVBias {
			l.QBias = vec(p+"attn_q.bias", q, false)
			l.KBias = vec(p+"attn_k.bias", kv, false)
			l.VBias = vec(p+"attn_v.bias", kv, false)
		}
		if c.QKNorm {
			l.QNorm = vec(p+"attn_q_norm.weight", c.HeadDim, false)
			l.KNorm = vec(p+"attn_k_norm.weight", c.HeadDim, false)
		}
		l.FFNNorm = vec(p+"ffn_norm.weight", d, false)
		l.Gate = mat(p+"ffn_gate.weight", c.FFN, d)
		l.Up = mat(p+"ffn_up.weight", c.FFN, d)
		l.Down = mat(p+"ffn_down.weight", d, c.FFN)
	}
	w.OutputNorm = vec("output_norm.weight", d, false)
	if c.TiedOutput {
		w.Output = w.Embd
	} else {
		w.Output = mat("output.weight", c.VocabSize, d)
	}
	if err != nil {
		return nil, err
	}
	return w, nil
}

func bindMatrix(src source, name string, rows, cols int) (*kernels.Matrix, error) {
	t, ok := src.tensor(name)
	if !ok {
		return nil, fmt.Errorf("tensor %s missing", label(src, name))
	}
	if !t.Type.Supported() {
		return nil, fmt.Errorf("tensor %s: type %s not supported", label(src, name), t.typeName())
	}
	if len(t.Dims) != 2 || t.Dims[0] != uint64(cols) || t.Dims[1] != uint64(rows) {
		return nil, fmt.Errorf("tensor %s: shape %v, want [%d %d]", label(src, name), t.Dims, cols, rows)
	}
	m, err := kernels.NewMatrix(t.Type, rows, cols, t.Data)
	if err != nil {
		return nil, fmt.Errorf("tensor %s: %v", label(src, name), err)
	}
	if len(t.Data) < m.RowBytes*rows {
		return nil, fmt.Errorf("tensor %s: %d bytes, want %d", label(src, name), len(t.Data), m.RowBytes*rows)
	}
	m.Data = t.Data[:m.RowBytes*rows]
	return m, nil
}

func bindVector(src source, name string, n int, optional bool) ([]float32, error) {
	t, ok := src.tensor(name)
	if !ok {
		if optional {
			return nil, nil
		}
		return nil, fmt.Errorf("tensor %s missing", label(src, name))
	}
	if !t.Type.Supported() {
		return nil, fmt.Errorf("tensor %s: type %s not supported", label(src, name), t.typeName())
	}
	total := uint64(1)
	for _, d := range t.Dims {
		total *= d
	}
	if total != uint64(n) {
		return nil, fmt.Errorf("tensor %s: shape %v, want %d elements", label(src, name), t.Dims, n)
	}
	size, err := quant.RowSize(t.Type, n)
	if err != nil {
		return nil, fmt.Errorf("tensor %s: %v", label(src, name), err)
	}
	if len(t.Data) < size {
		return nil, fmt.Errorf("tensor %s: %d bytes, want %d", label(src, name), len(t.Data), size)
	}
	out := make([]float32, n)
	if err := quant.Dequantize(t.Type, t.Data[:size], out); err != nil {
		return nil, fmt.Errorf("tensor %s: %v", label(src, name), err)
	}
	for _, v := range out {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return nil, fmt.Errorf("tensor %s holds non-finite values", label(src, name))
		}
	}
	return out, nil
}

// Matrices lists every 2-D weight a forward pass reads, each once (the
// output matrix is left out when it is the tied embedding).
func (w *Weights) Matrices() []*kernels.Matrix {
	out := []*kernels.Matrix{w.Embd}
	for _, l := range w.Layers {
		out = append(out, l.Q, l.K, l.V, l.O, l.Gate, l.Up, l.Down)
	}
	if w.Output != w.Embd {
		out = append(out, w.Output)
	}
	return out
}
