package model

import (
	"errors"
	"fmt"
	"io"
	"math"
	"sync"

	"pagoda/kernels"
	"pagoda/quant"
	"pagoda/tokenizer"
)

// Model is a loaded transformer. Forward may be called from one goroutine
// at a time (it reuses scratch buffers); the serving engine owns it.
type Model struct {
	Config  Config
	W       *Weights
	pool    *kernels.Pool
	ownPool bool
	matmul  func(p *kernels.Pool, w *kernels.Matrix, x, out []float32, batch int)
	matmulN func(p *kernels.Pool, ws []*kernels.Matrix, x []float32, outs [][]float32, batch int)
	freqs   []float32
	tok     tokenizer.Tokenizer
	closer  io.Closer

	mu  sync.Mutex
	buf scratch
}

func newModel(c *Config, src source, o Options) (*Model, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	w, err := bind(src, c)
	if err != nil {
		return nil, err
	}
	m := &Model{Config: *c, W: w, freqs: c.Freqs(), matmul: kernels.MatMul, matmulN: kernels.MatMulN}
	if o.Reference {
		m.matmul = kernels.MatMulRef
		m.matmulN = func(p *kernels.Pool, ws []*kernels.Matrix, x []float32, outs [][]float32, batch int) {
			for i, w := range ws {
				kernels.MatMulRef(p, w, x, outs[i], batch)
			}
		}
	}
	if o.Pool != nil {
		m.pool = o.Pool
	} else {
		m.pool = kernels.NewPool(o.Threads)
		m.ownPool = true
	}
	if !o.Reference {
		// Repack into the SIMD layouts now, so the first request does not
		// pay for it.
		for _, mat := range w.Matrices() {
			if mat != w.Embd || c.TiedOutput {
				kernels.Prepack(m.pool, mat)
			}
		}
	}
	return m, nil
}

// Tokenizer is the model's tokenizer (nil when the checkpoint has none and
// none was given).
func (m *Model) Tokenizer() tokenizer.Tokenizer { return m.tok }

// Pool is the worker pool the model computes on.
func (m *Model) Pool() *kernels.Pool { return m.pool }

// AttnParams is the attention shape every layer uses.
func (m *Model) AttnParams() AttnParams {
	c := &m.Config
	return AttnParams{NHead: c.NHead, NKVHead: c.NKVHead, HeadDim: c.HeadDim,
		Scale: float32(1 / math.Sqrt(float64(c.HeadDim))), Window: c.SlidingWindow}
}

// Close releases the weights' file mapping and the worker pool.
func (m *Model) Close() error {
	if m.ownPool {
		m.pool.Close()
		m.ownPool = false
	}
	if m.closer != nil {
		err := m.closer.Close()
		m.closer = nil
		return err
	}
	return nil
}

type scratch struct {
	x, xn, q, k, v, att, o, gate, up, logitsIn []float32
}

func grow(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}

// Forward runs the batch through the model, storing K/V in kv, and returns
// the logits (VocabSize each) of the rows marked in b.Logits, in order.
func (m *Model) Forward(b *Batch, kv KVCache) ([]float32, error) {
	c := &m.Config
	T := len(b.Tokens)
	if T == 0 {
		return nil, errors.New("model: empty batch")
	}
	if len(b.Pos) != T || len(b.Seq) != T || (b.Logits != nil && len(b.Logits) != T) {
		return nil, errors.New("model: batch fields have different lengths")
	}
	for i, t := range b.Tokens {
		if t < 0 || int(t) >= c.VocabSize {
			return nil, fmt.Errorf("model: token %d out of range [0, %d)", t, c.VocabSize)
		}
		if b.Pos[i] < 0 || int(b.Pos[i]) >= c.ContextLen {
			return nil, fmt.Errorf("model: position %d out of range [0, %d)", b.Pos[i], c.ContextLen)
		}
	}
	if err := kv.Begin(b); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()

	d, qd, kvd := c.NEmbd, c.NHead*c.HeadDim, c.NKVHead*c.HeadDim
	s := &m.buf
	s.x = grow(s.x, T*d)
	s.xn = grow(s.xn, T*d)
	s.q = grow(s.q, T*qd)
	s.k = grow(s.k, T*kvd)
	s.v = grow(s.v, T*kvd)
	s.att = grow(s.att, T*qd)
	s.o = grow(s.o, T*d)
	s.gate = grow(s.gate, T*c.FFN)
	s.up = grow(s.up, T*c.FFN)

	for i, t := range b.Tokens {
		if err := quant.Dequantize(m.W.Embd.Type, m.W.Embd.Row(int(t)), s.x[i*d:(i+1)*d]); err != nil {
			return nil, fmt.Errorf("model: embedding: %v", err)
		}
	}
	ap := m.AttnParams()
	hd := c.HeadDim
	for li := range m.W.Layers {
		l := &m.W.Layers[li]
		for i := 0; i < T; i++ {
			kernels.RMSNorm(s.xn[i*d:(i+1)*d], s.x[i*d:(i+1)*d], l.AttnNorm, c.RMSEps)
		}
		m.matmulN(m.pool, []*kernels.Matrix{l.Q, l.K, l.V}, s.xn, [][]float32{s.q, s.k, s.v}, T)
		for i := 0; i < T; i++ {
			q, k, v := s.q[i*qd:(i+1)*qd], s.k[i*kvd:(i+1)*kvd], s.v[i*kvd:(i+1)*kvd]
			if l.QBias != nil {
				addTo(q, l.QBias)
				addTo(k, l.KBias)
				addTo(v, l.VBias)
			}
			pos := int(b.Pos[i])
			for h := 0; h < c.NHead; h++ {
				qh := q[h*hd : (h+1)*hd]
				if l.QNorm != nil {
					kernels.RMSNorm(qh, qh, l.QNorm, c.RMSEps)
				}
				kernels.RoPE(qh, pos, m.freqs, c.RopeNeox)
			}
			for h := 0; h < c.NKVHead; h++ {
				kh := k[h*hd : (h+1)*hd]
				if l.KNorm != nil {
					kernels.RMSNorm(kh, kh, l.KNorm, c.RMSEps)
				}
				kernels.RoPE(kh, pos, m.freqs, c.RopeNeox)
			}
		}
		m.attend(li, b, kv, s.q, s.k, s.v, s.att, ap)
		m.matmul(m.pool, l.O, s.att, s.o, T)
		addTo(s.x, s.o)
		for i := 0; i < T; i++ {
			kernels.RMSNorm(s.xn[i*d:(i+1)*d], s.x[i*d:(i+1)*d], l.FFNNorm, c.RMSEps)
		}
		m.matmulN(m.pool, []*kernels.Matrix{l.Gate, l.Up}, s.xn, [][]float32{s.gate, s.up}, T)
		kernels.SiLUMul(s.gate, s.gate, s.up)
		m.matmul(m.pool, l.Down, s.gate, s.o, T)
		addTo(s.x, s.o)
	}

	rows := 0
	for i := 0; i < T; i++ {
		if wantLogits(b, i) {
			rows++
		}
	}
	s.logitsIn = grow(s.logitsIn, rows*d)
	r := 0
	for i := 0; i < T; i++ {
		if wantLogits(b, i) {
			kernels.RMSNorm(s.logitsIn[r*d:(r+1)*d], s.x[i*d:(i+1)*d], m.W.OutputNorm, c.RMSEps)
			r++
		}
	}
	logits := make([]float32, rows*c.VocabSize)
	if rows > 0 {
		m.matmul(m.pool, m.W.Output, s.logitsIn, logits, rows)
	}
	for i, v := range logits {
		// Corrupt weights (a NaN or Inf in a matrix) surface here rather
		// than as a sampler fed NaN.
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return nil, fmt.Errorf("model: non-finite logit in row %d (corrupt weights?)", i/c.VocabSize)
		}
	}
	return logits, nil
}

func wantLogits(b *Batch, i int) bool {
	if b.Logits == nil {
		return i == len(b.Tokens)-1
	}
	return b.Logits[i]
}

func addTo(dst, src []float32) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] += src[i]
	}
}
