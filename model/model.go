package model

import (
	"errors"
	"fmt"
	"io"
	"math"
	"pagoda/arch"
	"sync"
	"sync/atomic"

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
	ops     *kernels.Ops // kernels.Generic() for Options.Reference, else kernels.Best()
	// be is what the layer code computes with (the CPU kernels on pool);
	// tp which tensor-parallel rank of how many this model is.
	be Backend
	tp tpRank
	// stage is the layers this model holds (all of them unless it is one
	// stage of a pipeline).
	stage Stage
	freqs []float32
	// attn and ffns (one per layer) are the block's parts, composed from
	// the declaration.
	attn   part
	ffns   []part
	tok    tokenizer.Tokenizer
	closer io.Closer
	// experts counts, per layer × expert, the tokens routed to each
	// expert; expertBytes the expert weight bytes the routed experts' matrix
	// products have read (both since load; nil for a dense model).
	experts     []atomic.Uint64
	expertBytes atomic.Uint64

	mu  sync.Mutex
	buf scratch
}

func newModel(c *Config, src source, o Options) (*Model, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	a, err := lookupArch(c.Arch)
	if err != nil {
		return nil, err
	}
	attn, ffns, err := newBlock(a, c)
	if err != nil {
		return nil, err
	}
	tp, err := newTPRank(c, o)
	if err != nil {
		return nil, err
	}
	st, err := o.Stage.resolve(c.NLayer)
	if err != nil {
		return nil, err
	}
	w, err := bind(src, c, tp, st, capCheck(o, c, tp, st))
	if err != nil {
		return nil, err
	}
	w.linears(c, tp)
	m := &Model{Config: *c, W: w, freqs: c.Freqs(), attn: attn, ffns: ffns, ops: kernels.Best(), tp: tp, stage: st}
	m.Config.localize(tp)
	if c.NExpert > 0 {
		m.experts = make([]atomic.Uint64, c.NLayer*c.NExpert)
	}
	if o.Reference {
		m.ops = kernels.Generic()
	}
	if o.Pool != nil {
		m.pool = o.Pool
	} else {
		m.pool = kernels.NewPool(o.Threads)
		m.ownPool = true
	}
	cpu := &cpuBackend{m: m, ops: m.ops, pool: m.pool, rank: tp.rank}
	if tp.ranks > 1 {
		cpu.group = o.Group
	}
	m.be = cpu
	m.prepack(src, o.Progress)
	return m, nil
}

// prepack repacks the weights into the kernels' layouts.
func (m *Model) prepack(src source, progress func(done, total int)) {
	// Repack into the kernels' layouts now, so the first request does not
	// pay for it (the plain Go set packs nothing). Stacks (a layer's
	// experts, MLA's per-head matrices) share one allocation each, so that
	// matrices too small for huge pages alone get them together.
	//
	// A matrix the kernels now read only in its packed form gives its
	// file pages back as soon as it is packed, so the load never holds
	// the file and its repacked copy at once: resident memory peaks near
	// the packed weights plus one tensor. A tied embedding, packed as the
	// output, is released too: Forward's row look-ups fault back only the
	// rows it reads.
	rel, _ := src.(releaser)
	release := func(mat *kernels.Matrix) {
		if rel != nil && m.ops.PackedOnly(mat) {
			rel.release(mat.Data)
		}
	}
	for _, l := range m.W.Layers {
		for _, st := range [][]*kernels.Matrix{l.GateExps, l.UpExps, l.DownExps, l.KB, l.VB} {
			m.ops.PrepackStack(m.pool, st)
			for _, mat := range st {
				release(mat)
			}
		}
	}
	mats := m.W.Matrices()
	for i, mat := range mats {
		if mat != m.W.Embd || m.W.Output == m.W.Embd {
			m.ops.Prepack(m.pool, mat)
			release(mat)
		}
		if progress != nil {
			progress(i+1, len(mats))
		}
	}
}

// Ops is the kernel set the model computes with: kernels.Generic() for a
// Reference model. A KV cache built for the model should use the same.
func (m *Model) Ops() *kernels.Ops { return m.ops }

// Tokenizer is the model's tokenizer (nil when the checkpoint has none and
// none was given).
func (m *Model) Tokenizer() tokenizer.Tokenizer { return m.tok }

// Pool is the worker pool the model computes on.
func (m *Model) Pool() *kernels.Pool { return m.pool }

// AttnParams is the attention shape every layer uses. For MLA it is the
// absorbed form the cache sees: every head's query (KVLoRA + QKRope values)
// against the one latent + rope key row, scaled by 1/√(QKNope+QKRope).
func (m *Model) AttnParams() AttnParams {
	c := &m.Config
	nkv, kd, _ := c.KVShape()
	return AttnParams{NHead: c.NHead, NKVHead: nkv, HeadDim: kd,
		Scale: float32(1 / math.Sqrt(float64(c.AttnHeadDim()))), Window: c.SlidingWindow}
}

// ExpertLoad is, per layer, the number of tokens routed to each expert
// since the model was loaded (a nil row for a dense layer; nil for a dense
// model), for metrics. It may be called while Forward runs.
func (m *Model) ExpertLoad() [][]uint64 {
	if m.experts == nil {
		return nil
	}
	c := &m.Config
	out := make([][]uint64, c.NLayer)
	for l := c.NDenseLead; l < c.NLayer; l++ {
		out[l] = make([]uint64, c.NExpert)
		for e := range out[l] {
			out[l][e] = m.experts[l*c.NExpert+e].Load()
		}
	}
	return out
}

// ExpertBytesRead is the routed experts' weight bytes the forward passes
// have read since load: each active expert's gate, up and down matrices
// once per forward pass, however many tokens it serves. Divided by the
// decoded tokens it shows a decode step reading only the selected experts.
func (m *Model) ExpertBytesRead() uint64 { return m.expertBytes.Load() }

// Close releases the weights' file mapping and the worker pool.
// HiddenSize is the width of the hidden states Batch.Hidden returns.
func (m *Model) HiddenSize() int { return m.Config.NEmbd }

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
	// part is a rank's slice of the logits before they are gathered.
	part []float32
	// pieces is how the batch's attention splits into runs; every layer
	// splits it the same way, so Forward works it out once.
	pieces []attnPiece
	moe    moeScratch
	mla    mlaScratch
	// rope holds each row's rotary table (kernels.RoPETable), 2·len(freqs)
	// floats a row: every layer rotates at the same positions, so they are
	// worked out once per pass.
	rope []float32
}

// ropeRows is the rotary table of every row of b, one after the other.
func ropeRows(dst []float32, b *Batch, freqs []float32) []float32 {
	w := 2 * len(freqs)
	dst = grow(dst, len(b.Tokens)*w)
	for i := range b.Tokens {
		kernels.RoPETable(dst[i*w:(i+1)*w], b.RopePos(i), freqs)
	}
	return dst
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
	if !m.first() || !m.last() {
		return nil, fmt.Errorf("model: %v of %d is a pipeline stage: it runs ForwardStage", m.stage, m.Config.NLayer)
	}
	return m.ForwardStage(b, kv, nil)
}

// head is the final norm and the output head over the rows of m.buf.x
// marked in b; m.mu must be held.
func (m *Model) head(b *Batch) ([]float32, error) {
	c := &m.Config
	T := len(b.Tokens)
	d := c.NEmbd
	s := &m.buf
	rows := 0
	for i := 0; i < T; i++ {
		if wantLogits(b, i) {
			rows++
		}
	}
	s.logitsIn = grow(s.logitsIn, rows*d)
	hid := len(b.Hidden) == T*d
	r := 0
	for i := 0; i < T; i++ {
		if hid {
			m.ops.RMSNorm(b.Hidden[i*d:(i+1)*d], s.x[i*d:(i+1)*d], m.W.OutputNorm, c.RMSEps)
		}
		if wantLogits(b, i) {
			if hid {
				copy(s.logitsIn[r*d:(r+1)*d], b.Hidden[i*d:(i+1)*d])
			} else {
				m.ops.RMSNorm(s.logitsIn[r*d:(r+1)*d], s.x[i*d:(i+1)*d], m.W.OutputNorm, c.RMSEps)
			}
			r++
		}
	}
	logits := make([]float32, rows*c.VocabSize)
	if rows > 0 {
		m.logits(s.logitsIn, logits, rows)
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

// begin checks the batch against the model and the cache's limits and
// lets the cache prepare for it.
func (m *Model) begin(b *Batch, kv KVCache) error {
	c := &m.Config
	T := len(b.Tokens)
	if T == 0 {
		return errors.New("model: empty batch")
	}
	if len(b.Pos) != T || len(b.Seq) != T || (b.Logits != nil && len(b.Logits) != T) || (b.Rope != nil && len(b.Rope) != T) {
		return errors.New("model: batch fields have different lengths")
	}
	if b.Hidden != nil && len(b.Hidden) != T*c.NEmbd {
		return fmt.Errorf("model: hidden-state buffer of %d floats for %d rows of %d", len(b.Hidden), T, c.NEmbd)
	}
	// A cache whose policy keeps every query's distances within the
	// context (StreamingLLM) lets positions run past it.
	limit := c.ContextLen
	if pl, ok := kv.(interface{ PositionLimit() int }); ok && pl.PositionLimit() > 0 {
		limit = pl.PositionLimit()
	}
	for i, t := range b.Tokens {
		if t < 0 || int(t) >= c.VocabSize {
			return fmt.Errorf("model: token %d out of range [0, %d)", t, c.VocabSize)
		}
		if b.Pos[i] < 0 || int(b.Pos[i]) >= limit {
			return fmt.Errorf("model: position %d out of range [0, %d)", b.Pos[i], limit)
		}
		if rp := b.RopePos(i); rp < 0 || rp > int(b.Pos[i]) {
			return fmt.Errorf("model: rotary position %d of row %d outside [0, %d]", rp, i, b.Pos[i])
		}
	}
	if sb, ok := m.be.(stepBackend); ok {
		if err := sb.beginStep(b); err != nil {
			return err
		}
	}
	if err := kv.Begin(b); err != nil {
		return fmt.Errorf("model: %w", err)
	}
	return nil
}

// embed looks up the tokens' embedding rows into x. A rank that holds a
// vocabulary range of the table looks up its tokens, zeroes the others'
// rows and sums with the other ranks: every token's row comes from exactly
// one rank, so the sum is that row, bit for bit.
func (m *Model) embed(tokens []int32, x []float32) error {
	d := m.Config.NEmbd
	e, sh := m.W.Embd, m.W.embd
	split := sh.Ranks > 1 && sh.Axis == arch.Vocab
	for i, t := range tokens {
		row := x[i*d : (i+1)*d]
		if split {
			if int(t) < sh.Lo || int(t) >= sh.Hi {
				clear(row)
				continue
			}
			t -= int32(sh.Lo)
		}
		if err := quant.Dequantize(e.Type, e.Row(int(t)), row); err != nil {
			return fmt.Errorf("model: embedding: %v", err)
		}
	}
	if split {
		m.be.AllReduce(x)
	}
	return nil
}

// trunk runs the embedding (or, on a later pipeline stage, takes the
// residual stream in) and the stage's layers over the batch, leaving the
// last layer's residual stream in m.buf.x; m.mu must be held.
func (m *Model) trunk(b *Batch, kv KVCache, in []float32) error {
	c := &m.Config
	T := len(b.Tokens)

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

	if in != nil {
		copy(s.x, in)
	} else if err := m.embed(b.Tokens, s.x[:T*d]); err != nil {
		return err
	}
	s.pieces = attnPieces(b, c.SlidingWindow)
	s.rope = ropeRows(s.rope, b, m.freqs)
	for li := m.stage.Lo; li < m.stage.Hi; li++ {
		m.attn.forward(m, li, b, kv)
		m.ffns[li].forward(m, li, b, kv)
	}
	if sb, ok := m.be.(stepBackend); ok {
		// An exchange failed inside a layer (which has no error path);
		// the rows computed after it are not to be used.
		return sb.stepErr()
	}
	return nil
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
