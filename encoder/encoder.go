// Package encoder runs bidirectional encoder models (BERT and its
// descendants: MiniLM, bge, e5, gte) from GGUF files, for embeddings. An
// encoder has no decode step and so no KV cache: a batch of sequences goes
// through the layers once, every token attending to every token of its
// own sequence, and each sequence's hidden states are pooled into one
// vector.
package encoder

import (
	"errors"
	"fmt"
	"math"

	"pagoda/arch"
	"pagoda/gguf"
	"pagoda/kernels"
	"pagoda/quant"
	"pagoda/tokenizer"
)

// Pooling is how a sequence's hidden states become one vector; the values
// are llama.cpp's (GGUF <arch>.pooling_type).
type Pooling int

// The poolings llama.cpp defines.
const (
	PoolNone Pooling = 0
	PoolMean Pooling = 1
	PoolCLS  Pooling = 2
	PoolLast Pooling = 3
	PoolRank Pooling = 4
)

func (p Pooling) String() string {
	switch p {
	case PoolNone:
		return "none"
	case PoolMean:
		return "mean"
	case PoolCLS:
		return "cls"
	case PoolLast:
		return "last"
	case PoolRank:
		return "rank"
	}
	return fmt.Sprintf("pooling(%d)", int(p))
}

// ParsePooling reads a pooling name as llama.cpp's --pooling spells it.
func ParsePooling(s string) (Pooling, error) {
	for _, p := range []Pooling{PoolNone, PoolMean, PoolCLS, PoolLast} {
		if p.String() == s {
			return p, nil
		}
	}
	return 0, fmt.Errorf("pooling %q not supported (want none, mean, cls or last)", s)
}

// Pool reduces rows (n rows of d floats, one sequence's hidden states) to
// one vector: the mean, the first row (CLS) or the last. The mean sums in
// float64 in row order, so a sequence pools the same alone or in a batch.
func Pool(p Pooling, rows []float32, n, d int) ([]float32, error) {
	if n <= 0 || len(rows) < n*d {
		return nil, errors.New("encoder: pooling an empty sequence")
	}
	out := make([]float32, d)
	switch p {
	case PoolMean:
		acc := make([]float64, d)
		for i := 0; i < n; i++ {
			for j, v := range rows[i*d : (i+1)*d] {
				acc[j] += float64(v)
			}
		}
		for j := range out {
			out[j] = float32(acc[j] / float64(n))
		}
	case PoolCLS:
		copy(out, rows[:d])
	case PoolLast:
		copy(out, rows[(n-1)*d:n*d])
	default:
		return nil, fmt.Errorf("encoder: pooling %s gives no sequence embedding", p)
	}
	return out, nil
}

// Normalize scales v to unit Euclidean length (llama.cpp's
// --embd-normalize 2, what OpenAI and ollama return); a zero vector stays
// zero.
func Normalize(v []float32) {
	var s float64
	for _, x := range v {
		s += float64(x) * float64(x)
	}
	if s == 0 {
		return
	}
	inv := 1 / math.Sqrt(s)
	for i := range v {
		v[i] = float32(float64(v[i]) * inv)
	}
}

// Config is an encoder's hyper-parameters.
type Config struct {
	Arch       string
	NLayer     int
	NEmbd      int
	NHead      int
	FFN        int
	ContextLen int // learned positions
	TokenTypes int
	VocabSize  int
	Eps        float32
	// Pooling is the file's pooling_type; a BERT file without one pools
	// by CLS, as llama.cpp does for bert.
	Pooling Pooling
}

// Options for Load.
type Options struct {
	// Threads for the worker pool (0: GOMAXPROCS). Ignored with Pool.
	Threads int
	Pool    *kernels.Pool
	// Reference computes with the plain Go kernels.
	Reference bool
}

type layer struct {
	q, k, v, o, up, down       *kernels.Matrix
	qb, kb, vb, ob, upb, downb []float32
	attnNorm, attnNormB        []float32
	outNorm, outNormB          []float32
}

// Model is a loaded encoder. Embed may be called from one goroutine at a
// time.
type Model struct {
	Config Config
	tok    tokenizer.Tokenizer
	ops    *kernels.Ops
	pool   *kernels.Pool
	own    bool
	file   *gguf.File

	embd, pos, types    *kernels.Matrix
	embdNorm, embdNormB []float32
	layers              []layer
}

// IsEncoder says whether a GGUF file declares an encoder architecture.
func IsEncoder(f *gguf.File) bool {
	a, _ := f.String("general.architecture")
	return arch.LookupEncoder(a) != nil
}

// Load opens an encoder GGUF file.
func Load(path string, o Options) (*Model, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	m, err := FromGGUF(f, o)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%w (%s)", err, path)
	}
	m.file = f
	return m, nil
}

// FromGGUF binds an encoder to f's tensors; f must outlive the model.
func FromGGUF(f *gguf.File, o Options) (*Model, error) {
	name, _ := f.String("general.architecture")
	a := arch.LookupEncoder(name)
	if a == nil {
		return nil, fmt.Errorf("encoder: architecture %q is not an encoder (encoders: %v)", name, arch.EncoderNames())
	}
	c := Config{Arch: a.Name, Pooling: PoolCLS}
	geti := func(key string, dst *int, required bool) error {
		v, ok := f.Uint(name + "." + key)
		if !ok {
			if required {
				return fmt.Errorf("encoder: %s.%s missing", name, key)
			}
			return nil
		}
		if v == 0 || v > 1<<24 {
			return fmt.Errorf("encoder: %s.%s = %d out of range", name, key, v)
		}
		*dst = int(v)
		return nil
	}
	for _, k := range []struct {
		key string
		dst *int
	}{{"block_count", &c.NLayer}, {"embedding_length", &c.NEmbd}, {"attention.head_count", &c.NHead},
		{"feed_forward_length", &c.FFN}, {"context_length", &c.ContextLen}} {
		if err := geti(k.key, k.dst, true); err != nil {
			return nil, err
		}
	}
	// Every layer has a dozen tensors: a count beyond the file's is
	// refused before anything is sized by it.
	if c.NLayer > len(f.Tensors) {
		return nil, fmt.Errorf("encoder: %s.block_count %d, but the file has %d tensors", name, c.NLayer, len(f.Tensors))
	}
	if c.NEmbd%c.NHead != 0 {
		return nil, fmt.Errorf("encoder: embedding length %d not divisible by %d heads", c.NEmbd, c.NHead)
	}
	eps, ok := f.Float(name + ".attention.layer_norm_epsilon")
	if !ok || !(eps > 0 && eps < 1) {
		return nil, fmt.Errorf("encoder: %s.attention.layer_norm_epsilon missing or out of range", name)
	}
	c.Eps = float32(eps)
	if p, ok := f.Int(name + ".pooling_type"); ok {
		if p < int64(PoolNone) || p > int64(PoolRank) {
			return nil, fmt.Errorf("encoder: %s.pooling_type %d unknown", name, p)
		}
		c.Pooling = Pooling(p)
	}
	if causal, ok := f.Bool(name + ".attention.causal"); ok && causal {
		return nil, fmt.Errorf("encoder: %s.attention.causal is true; a causal %s is not supported", name, name)
	}
	if n, ok := f.Uint("tokenizer.ggml.token_type_count"); ok {
		c.TokenTypes = int(n)
	}
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		return nil, err
	}
	c.VocabSize = tok.Vocab().Size()

	m := &Model{Config: c, tok: tok, ops: kernels.Best()}
	if o.Reference {
		m.ops = kernels.Generic()
	}
	d := arch.Dims{Embd: c.NEmbd, FFN: c.FFN, Vocab: c.VocabSize, Positions: c.ContextLen, TokenTypes: c.TokenTypes}
	mat := func(name string, t arch.Tensor) (*kernels.Matrix, error) {
		ti := f.Tensor(name)
		if ti == nil {
			if t.Optional {
				return nil, nil
			}
			return nil, fmt.Errorf("encoder: tensor %q missing", name)
		}
		want := t.Shape(d)
		if len(want) == 1 {
			want = append(want, 1)
		}
		if len(ti.Dims) > 2 || int(ti.Dims[0]) != want[0] || (t.Role != arch.TokenTypes && int(ti.Rows()) != want[1]) ||
			(t.Role == arch.TokenTypes && ti.Rows() < 1) {
			return nil, fmt.Errorf("encoder: tensor %q has shape %v, want %v", name, ti.Dims, want)
		}
		return kernels.NewMatrix(ti.Type, int(ti.Rows()), int(ti.Dims[0]), ti.Data)
	}
	vecOf := func(mx *kernels.Matrix) ([]float32, error) {
		if mx == nil {
			return nil, nil
		}
		out := make([]float32, mx.Cols)
		if err := quant.Dequantize(mx.Type, mx.Row(0), out); err != nil {
			return nil, err
		}
		return out, nil
	}
	bind := func(tensors []arch.Tensor, prefix string, set func(r arch.Role, mx *kernels.Matrix) error) error {
		for _, t := range tensors {
			mx, err := mat(prefix+t.Name, t)
			if err != nil {
				return err
			}
			if err := set(t.Role, mx); err != nil {
				return fmt.Errorf("encoder: tensor %q: %w", prefix+t.Name, err)
			}
		}
		return nil
	}
	err = bind(a.Globals, "", func(r arch.Role, mx *kernels.Matrix) (err error) {
		switch r {
		case arch.TokenEmbd:
			m.embd = mx
		case arch.PosEmbd:
			m.pos = mx
		case arch.TokenTypes:
			m.types = mx
		case arch.EmbdNorm:
			m.embdNorm, err = vecOf(mx)
		case arch.EmbdNormBias:
			m.embdNormB, err = vecOf(mx)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	m.layers = make([]layer, c.NLayer)
	for l := range m.layers {
		L := &m.layers[l]
		err := bind(a.Block, fmt.Sprintf("blk.%d.", l), func(r arch.Role, mx *kernels.Matrix) (err error) {
			switch r {
			case arch.AttnQ:
				L.q = mx
			case arch.AttnK:
				L.k = mx
			case arch.AttnV:
				L.v = mx
			case arch.AttnOut:
				L.o = mx
			case arch.FFNUp:
				L.up = mx
			case arch.FFNDown:
				L.down = mx
			case arch.AttnQBias:
				L.qb, err = vecOf(mx)
			case arch.AttnKBias:
				L.kb, err = vecOf(mx)
			case arch.AttnVBias:
				L.vb, err = vecOf(mx)
			case arch.AttnOutBias:
				L.ob, err = vecOf(mx)
			case arch.FFNUpBias:
				L.upb, err = vecOf(mx)
			case arch.FFNDownBias:
				L.downb, err = vecOf(mx)
			case arch.AttnOutNorm:
				L.attnNorm, err = vecOf(mx)
			case arch.AttnOutNormBias:
				L.attnNormB, err = vecOf(mx)
			case arch.LayerOutNorm:
				L.outNorm, err = vecOf(mx)
			case arch.LayerOutNormBias:
				L.outNormB, err = vecOf(mx)
			}
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	if o.Pool != nil {
		m.pool = o.Pool
	} else {
		m.pool = kernels.NewPool(o.Threads)
		m.own = true
	}
	for _, L := range m.layers {
		for _, mx := range []*kernels.Matrix{L.q, L.k, L.v, L.o, L.up, L.down} {
			m.ops.Prepack(m.pool, mx)
		}
	}
	return m, nil
}

// Tokenizer is the model's WordPiece tokenizer.
func (m *Model) Tokenizer() tokenizer.Tokenizer { return m.tok }

// Close releases the worker pool and the file mapping.
func (m *Model) Close() error {
	if m.own {
		m.pool.Close()
		m.own = false
	}
	if m.file != nil {
		err := m.file.Close()
		m.file = nil
		return err
	}
	return nil
}
