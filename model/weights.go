package model

import (
	"encoding/binary"
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

// releaser is a source whose tensor bytes are a file mapping that can give
// back its resident pages (GGUF): the loader calls release on a matrix's
// Data once the kernels have repacked it and read only the copy, so the
// file's bytes are not resident next to their repacked form.
type releaser interface{ release(data []byte) }

// Layer holds one transformer block's weights. A part's fields are nil
// when the architecture does not have them (Gate in a non-gated FFN).
type Layer struct {
	AttnNorm            []float32
	Q, K, V, O          *kernels.Matrix
	QBias, KBias, VBias []float32
	QNorm, KNorm        []float32
	FFNNorm             []float32
	Gate, Up, Down      *kernels.Matrix

	// Mixture of experts: the router (NExpert × NEmbd), the optional
	// selection bias, one matrix per expert, the shared experts and
	// qwen2moe's shared-expert gate (a vector dotted with the input).
	Router                        *kernels.Matrix
	ProbsBias                     []float32
	GateExps, UpExps, DownExps    []*kernels.Matrix
	GateShexp, UpShexp, DownShexp *kernels.Matrix
	SharedGate                    []float32

	// Multi-head latent attention: the low-rank query (QA, QANorm, QB; Q
	// when there is none), the latent + rope key projection and the
	// latent's norm, and per head KB (KVLoRA × QKNope: absorbs q_nope into
	// the latent) and VB (VHeadDim × KVLoRA: latent to value). Files with
	// the combined attn_kv_b get KB and VB built from it at load.
	QA, QB, KVA *kernels.Matrix
	QANorm      []float32
	KVANorm     []float32
	KVB         *kernels.Matrix
	KB, VB      []*kernels.Matrix

	// The dense block's projections as the forward pass runs them: the
	// matrices above (this rank's shards) with their shard, bias and
	// adapter, and the groups that share an input.
	q, k, v, o, gate, up, down Linear
	qkv, gateUp                []*Linear
}

// Weights is the whole model's parameters, bound by GGUF tensor names.
type Weights struct {
	Embd       *kernels.Matrix
	Layers     []Layer
	OutputNorm []float32
	Output     *kernels.Matrix
	// out is the output head as a Linear (vocab-split across ranks).
	out Linear
	// embd is which token rows Embd holds: all of them, or a rank's
	// vocabulary range, whose look-ups the ranks sum (each row lives on
	// exactly one rank).
	embd Shard
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
	case arch.FFNRouter:
		return slot{mat: &l.Router}, true
	case arch.FFNProbsBias:
		return slot{vec: &l.ProbsBias}, true
	case arch.FFNGateExps:
		return slot{stack: &l.GateExps}, true
	case arch.FFNUpExps:
		return slot{stack: &l.UpExps}, true
	case arch.FFNDownExps:
		return slot{stack: &l.DownExps}, true
	case arch.FFNSharedGate:
		return slot{vec: &l.SharedGate}, true
	case arch.FFNGateShexp:
		return slot{mat: &l.GateShexp}, true
	case arch.FFNUpShexp:
		return slot{mat: &l.UpShexp}, true
	case arch.FFNDownShexp:
		return slot{mat: &l.DownShexp}, true
	case arch.AttnQA:
		return slot{mat: &l.QA}, true
	case arch.AttnQANorm:
		return slot{vec: &l.QANorm}, true
	case arch.AttnQB:
		return slot{mat: &l.QB}, true
	case arch.AttnKVA:
		return slot{mat: &l.KVA}, true
	case arch.AttnKVANorm:
		return slot{vec: &l.KVANorm}, true
	case arch.AttnKVB:
		return slot{mat: &l.KVB}, true
	case arch.AttnKB:
		return slot{stack: &l.KB}, true
	case arch.AttnVB:
		return slot{stack: &l.VB}, true
	}
	return slot{}, false
}

// bind looks up every tensor the architecture declares for this config,
// checks its shape and type, and wraps it without copying.
func bind(src source, c *Config, tp tpRank, st Stage, check func(weights int64) error) (*Weights, error) {
	a, err := lookupArch(c.Arch)
	if err != nil {
		return nil, err
	}
	d := c.dims()
	w := &Weights{Layers: make([]Layer, c.NLayer)}
	var bound []boundSlot
	for _, t := range a.Tensors(d, c.NLayer) {
		if !inStage(t, c, st) {
			continue
		}
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
		bound = append(bound, boundSlot{t, s})
	}
	// Until here every weight is a view of the file; cutting a rank's
	// shard copies the row-split matrices, so a cap is checked first, on
	// the bytes the shards will have.
	if check != nil {
		if err := check(shardBytes(w, bound, tp)); err != nil {
			return nil, err
		}
	}
	if tp.ranks > 1 {
		for _, b := range bound {
			if err := shardSlot(src, b.t, b.s, tp); err != nil {
				return nil, err
			}
		}
	}
	if c.TiedOutput && st.Hi == c.NLayer {
		w.Output = w.Embd
	}
	if c.MLA {
		for li := range w.Layers {
			if err := splitKVB(src, c, li, &w.Layers[li]); err != nil {
				return nil, err
			}
		}
	}
	return w, nil
}

// splitKVB gives an MLA layer its per-head KB and VB: as stored
// (attn_k_b, attn_v_b; the binder checked them), or cut from the combined
// attn_kv_b of older files,
// whose rows are, per head, qk_nope key rows then v_head value rows over
// the latent. KB is the transpose of the key rows (the absorbed form
// multiplies q_nope into the latent), so both are rebuilt in F32.
func splitKVB(src source, c *Config, li int, l *Layer) error {
	if l.KVB == nil {
		return nil // stored split
	}
	kvl, nope, vh := c.KVLoRA, c.QKNope, c.VHeadDim
	row := make([]float32, kvl)
	l.KB, l.VB = make([]*kernels.Matrix, c.NHead), make([]*kernels.Matrix, c.NHead)
	for h := 0; h < c.NHead; h++ {
		kb, vb := make([]float32, kvl*nope), make([]float32, vh*kvl)
		for j := 0; j < nope+vh; j++ {
			if err := quant.Dequantize(l.KVB.Type, l.KVB.Row(h*(nope+vh)+j), row); err != nil {
				return fmt.Errorf("tensor %s: %v", label(src, arch.BlockName(li, "attn_kv_b.weight")), err)
			}
			if j < nope {
				for r, v := range row {
					kb[r*nope+j] = v
				}
			} else {
				copy(vb[(j-nope)*kvl:], row)
			}
		}
		l.KB[h] = f32Matrix(kb, kvl, nope)
		l.VB[h] = f32Matrix(vb, vh, kvl)
	}
	l.KVB = nil
	return nil
}

// f32Matrix wraps rows×cols float32 values as an F32 matrix.
func f32Matrix(v []float32, rows, cols int) *kernels.Matrix {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	m, err := kernels.NewMatrix(quant.F32, rows, cols, b)
	if err != nil {
		panic(err) // sized above
	}
	return m
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
		if st, ok := src.tensor(t.Name); ok && t.Role == arch.FFNRouter && len(st.Dims) == 2 && st.Dims[1] != uint64(shape[1]) {
			return fmt.Errorf("tensor %s routes to %d experts, but the metadata says expert_count %d", label(src, t.Name), st.Dims[1], shape[1])
		}
		*s.mat, err = bindMatrix(src, t.Name, shape[1], shape[0])
	case len(shape) == 3 && s.stack != nil:
		if st, ok := src.tensor(t.Name); ok && len(st.Dims) == 3 && st.Dims[2] != uint64(shape[2]) && isExperts(t.Role) {
			return fmt.Errorf("tensor %s holds %d experts, but the metadata says expert_count %d", label(src, t.Name), st.Dims[2], shape[2])
		}
		*s.stack, err = bindStack(src, t.Name, shape[2], shape[1], shape[0])
	default:
		err = fmt.Errorf("tensor %s: declared with %d dimensions, which its field does not hold", label(src, t.Name), len(shape))
	}
	return err
}

func isExperts(r arch.Role) bool {
	return r == arch.FFNGateExps || r == arch.FFNUpExps || r == arch.FFNDownExps
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
	var out []*kernels.Matrix
	if w.Embd != nil { // a pipeline stage after the first has none
		out = append(out, w.Embd)
	}
	for _, l := range w.Layers {
		for _, m := range []*kernels.Matrix{l.Q, l.K, l.V, l.O, l.Gate, l.Up, l.Down, l.Router, l.GateShexp, l.UpShexp, l.DownShexp,
			l.QA, l.QB, l.KVA} {
			if m != nil {
				out = append(out, m)
			}
		}
		for _, st := range [][]*kernels.Matrix{l.GateExps, l.UpExps, l.DownExps, l.KB, l.VB} {
			out = append(out, st...)
		}
	}
	if w.Output != w.Embd && w.Output != nil {
		out = append(out, w.Output)
	}
	return out
}
