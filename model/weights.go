package model

import (
	"fmt"
	"math"

	"pagoda/arch"
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
	// Perm is a GPTQ act-order column order (kernels.Matrix.Perm).
	Perm []int32
	// Err is why a tensor that is present could not be read (a GPTQ/AWQ
	// layer that does not repack); the binder reports it.
	Err error
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

// Layer holds one transformer block's weights. A part's fields are nil
// when the architecture does not have them (Gate in a non-gated FFN).
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

// slot is the field one declared tensor binds to: a vector, a matrix, or a
// stack of matrices (a 3-D tensor).
type slot struct {
	vec   *[]float32
	mat   **kernels.Matrix
	stack *[]*kernels.Matrix
}

// slot is the one table from tensor roles (package arch) to fields, shared
// by every checkpoint format; l is nil for tensors outside the blocks.
func (w *Weights) slot(l *Layer, r arch.Role) (slot, bool) {
	if l == nil {
		switch r {
		case arch.TokenEmbd:
			return slot{mat: &w.Embd}, true
		case arch.OutputNorm:
			return slot{vec: &w.OutputNorm}, true
		case arch.Output:
			return slot{mat: &w.Output}, true
		}
		return slot{}, false
	}
	switch r {
	case arch.AttnNorm:
		return slot{vec: &l.AttnNorm}, true
	case arch.AttnQ:
		return slot{mat: &l.Q}, true
	case arch.AttnK:
		return slot{mat: &l.K}, true
	case arch.AttnV:
		return slot{mat: &l.V}, true
	case arch.AttnOut:
		return slot{mat: &l.O}, true
	case arch.AttnQBias:
		return slot{vec: &l.QBias}, true
	case arch.AttnKBias:
		return slot{vec: &l.KBias}, true
	case arch.AttnVBias:
		return slot{vec: &l.VBias}, true
	case arch.AttnQNorm:
		return slot{vec: &l.QNorm}, true
	case arch.AttnKNorm:
		return slot{vec: &l.KNorm}, true
	case arch.FFNNorm:
		return slot{vec: &l.FFNNorm}, true
	case arch.FFNGate:
		return slot{mat: &l.Gate}, true
	case arch.FFNUp:
		return slot{mat: &l.Up}, true
	case arch.FFNDown:
		return slot{mat: &l.Down}, true
	}
	return slot{}, false
}

// bind looks up every tensor the architecture declares for this config,
// checks its shape and type, and wraps it without copying.
func bind(src source, c *Config) (*Weights, error) {
	a, err := lookupArch(c.Arch)
	if err != nil {
		return nil, err
	}
	d := c.dims()
	w := &Weights{Layers: make([]Layer, c.NLayer)}
	for _, t := range a.Tensors(d, c.NLayer) {
		var l *Layer
		if t.Layer >= 0 {
			l = &w.Layers[t.Layer]
		}
		s, ok := w.slot(l, t.Role)
		if !ok {
			return nil, fmt.Errorf("tensor %s: no weight field for its role %d", label(src, t.Name), t.Role)
		}
		if err := bindSlot(src, t, d, s); err != nil {
			return nil, err
		}
	}
	if c.TiedOutput {
		w.Output = w.Embd
	}
	return w, nil
}

func bindSlot(src source, t arch.Named, d arch.Dims, s slot) error {
	if _, ok := src.tensor(t.Name); !ok && t.Optional {
		return nil
	}
	shape := t.Shape(d)
	var err error
	switch {
	case len(shape) == 1 && s.vec != nil:
		*s.vec, err = bindVector(src, t.Name, shape[0])
	case len(shape) == 2 && s.mat != nil:
		*s.mat, err = bindMatrix(src, t.Name, shape[1], shape[0])
	case len(shape) == 3 && s.stack != nil:
		*s.stack, err = bindStack(src, t.Name, shape[2], shape[1], shape[0])
	default:
		err = fmt.Errorf("tensor %s: declared with %d dimensions, which its field does not hold", label(src, t.Name), len(shape))
	}
	return err
}

func bindMatrix(src source, name string, rows, cols int) (*kernels.Matrix, error) {
	t, ok := src.tensor(name)
	if !ok {
		return nil, fmt.Errorf("tensor %s missing", label(src, name))
	}
	if t.Err != nil {
		return nil, fmt.Errorf("tensor %s: %w", label(src, name), t.Err)
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
	m.Perm = t.Perm
	return m, nil
}

// bindStack binds a 3-D tensor, ggml dims [cols, rows, n] (a stack of n
// matrices such as MoE experts), as n matrix views into its bytes.
func bindStack(src source, name string, n, rows, cols int) ([]*kernels.Matrix, error) {
	t, ok := src.tensor(name)
	if !ok {
		return nil, fmt.Errorf("tensor %s missing", label(src, name))
	}
	if !t.Type.Supported() {
		return nil, fmt.Errorf("tensor %s: type %s not supported", label(src, name), t.typeName())
	}
	if len(t.Dims) != 3 || t.Dims[0] != uint64(cols) || t.Dims[1] != uint64(rows) || t.Dims[2] != uint64(n) {
		return nil, fmt.Errorf("tensor %s: shape %v, want [%d %d %d]", label(src, name), t.Dims, cols, rows, n)
	}
	rowBytes, err := quant.RowSize(t.Type, cols)
	if err != nil {
		return nil, fmt.Errorf("tensor %s: %v", label(src, name), err)
	}
	// Every slice starts on a row boundary, so each is a whole matrix of
	// whole quantization blocks.
	size := rowBytes * rows
	if len(t.Data) < size*n {
		return nil, fmt.Errorf("tensor %s: %d bytes, want %d", label(src, name), len(t.Data), size*n)
	}
	out := make([]*kernels.Matrix, n)
	for i := range out {
		m, err := kernels.NewMatrix(t.Type, rows, cols, t.Data[i*size:(i+1)*size:(i+1)*size])
		if err != nil {
			return nil, fmt.Errorf("tensor %s[%d]: %v", label(src, name), i, err)
		}
		out[i] = m
	}
	return out, nil
}

func bindVector(src source, name string, n int) ([]float32, error) {
	t, ok := src.tensor(name)
	if !ok {
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
		for _, m := range []*kernels.Matrix{l.Q, l.K, l.V, l.O, l.Gate, l.Up, l.Down} {
			if m != nil {
				out = append(out, m)
			}
		}
	}
	if w.Output != w.Embd {
		out = append(out, w.Output)
	}
	return out
}
