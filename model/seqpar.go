package model

import (
	"errors"
	"fmt"

	"pagoda/ring"
)

// SeqRank is one rank of a sequence-parallel group: every rank holds the
// whole model (weights replicated) and its share of one long sequence's
// tokens and their keys and values, per layer. A layer's attention
// exchanges K/V blocks with the other ranks around a ring (Ring Attention,
// package ring), so each rank's rows get exact attention over the whole
// sequence while no rank ever holds more than its share and the blocks in
// flight.
//
// The group serves one sequence. Prefill steps give each rank its own
// rows: one contiguous slice, or several runs (ring.Zigzag's early and late
// chunk, which even out the causal work). Decode steps give every rank the
// same rows, right after the whole sequence; the rank holding the
// sequence's tail keeps their keys and values, and every rank gets the
// same attention output (one partial per rank, merged in rank order).
type SeqRank struct {
	m  *Model
	be *seqBackend
}

// seqBackend is the CPU backend whose Attend goes around the ring. It keeps
// the rank's K/V itself, so the model's KVCache sees only Begin.
type seqBackend struct {
	*cpuBackend
	ring   *ring.Ring
	layers [][]seqRun // per layer, the runs this rank holds in position order
	decode bool       // this step's rows are the same on every rank
	store  bool       // this rank keeps this step's keys and values
	end    int        // the whole sequence's end, as of this step
	err    error
	blocks []ring.Block
}

// seqRun is a run of consecutive positions from start whose keys and
// values (rows of NKVHead·HeadDim) a rank holds for one layer.
type seqRun struct {
	start int
	k, v  []float32
}

// NewSeqRank makes m a rank of the sequence-parallel group t connects (m
// computes through the ring from then on, and must not be used apart from
// the SeqRank).
func NewSeqRank(m *Model, t ring.Transport) (*SeqRank, error) {
	c := &m.Config
	switch {
	case m.tp.ranks > 1:
		return nil, errors.New("sequence parallel: a tensor-parallel shard cannot also split the sequence")
	case c.MLA:
		return nil, errors.New("sequence parallel: MLA attends through its latent cache, not implemented")
	case t.Ranks() < 1 || t.Rank() < 0 || t.Rank() >= t.Ranks():
		return nil, fmt.Errorf("sequence parallel: rank %d of %d", t.Rank(), t.Ranks())
	}
	cpu, ok := m.be.(*cpuBackend)
	if !ok {
		return nil, errors.New("sequence parallel: the model already computes through another backend")
	}
	be := &seqBackend{cpuBackend: cpu, ring: ring.New(t, m.ops), layers: make([][]seqRun, c.NLayer)}
	m.be = be
	return &SeqRank{m: m, be: be}, nil
}

// Prefill runs this rank's rows of the sequence (positions increasing,
// after those it holds) and returns their logits as Forward does. Every
// rank calls it in the same step. A rank with no rows in the step (a
// prompt chunk shorter than the ring) passes an empty batch: it still
// sends its runs around the ring in every layer, so the others' passes
// complete.
func (s *SeqRank) Prefill(b *Batch) ([]float32, error) {
	s.be.decode = false
	if len(b.Tokens) == 0 {
		return nil, s.be.idle()
	}
	return s.m.Forward(b, nopCache{})
}

// Reset forgets the sequence: the next step is a new sequence's prefill
// from position 0. Every rank resets before the same step. A broken
// rank stays broken (its link is gone).
func (s *SeqRank) Reset() {
	for li := range s.be.layers {
		s.be.layers[li] = nil
	}
	s.be.end = 0
}

// idle is a prefill step without rows: every layer's ring passes, with
// no queries of this rank's own.
func (be *seqBackend) idle() error {
	if be.err != nil {
		return be.err
	}
	ap := be.m.AttnParams()
	s := ring.Shape{NHead: ap.NHead, NKVHead: ap.NKVHead, HeadDim: ap.HeadDim, Scale: ap.Scale, Window: ap.Window}
	for li := range be.layers {
		be.blocks = be.blocks[:0]
		for _, r := range be.layers[li] {
			be.blocks = append(be.blocks, ring.Block{Start: r.start, K: r.k, V: r.v})
		}
		if err := be.ring.PrefillBlocks(s, nil, nil, be.blocks, nil); err != nil {
			be.err = fmt.Errorf("sequence parallel: layer %d: %w", li, err)
			return be.err
		}
		be.end = be.ring.End()
	}
	return nil
}

// Decode runs rows that follow the whole sequence, the same batch on every
// rank; the rank holding the sequence's tail stores their keys and values.
func (s *SeqRank) Decode(b *Batch) ([]float32, error) {
	s.be.decode = true
	return s.m.Forward(b, nopCache{})
}

// Len is the number of positions this rank holds.
func (s *SeqRank) Len() int {
	n := 0
	for _, r := range s.be.layers[0] {
		n += len(r.k)
	}
	return n / max(1, s.m.Config.NKVHead*s.m.Config.HeadDim)
}

// stepBackend is a Backend that can refuse a step up front and fail
// inside it (an exchange with other processes); Forward asks it around
// every step.
type stepBackend interface {
	beginStep(b *Batch) error
	stepErr() error
}

func (be *seqBackend) stepErr() error { return be.err }

// holdEnd is one past the last position this rank holds (0: none).
func (be *seqBackend) holdEnd() int {
	runs := be.layers[0]
	if len(runs) == 0 {
		return 0
	}
	r := runs[len(runs)-1]
	return r.start + len(r.k)/(be.m.Config.NKVHead*be.m.Config.HeadDim)
}

// beginStep checks that the batch is rows of the one sequence at
// increasing positions after those this rank holds, and a decode step's
// right after the whole sequence.
func (be *seqBackend) beginStep(b *Batch) error {
	if be.err != nil {
		return be.err
	}
	for i := 1; i < len(b.Pos); i++ {
		if b.Pos[i] <= b.Pos[i-1] || b.Seq[i] != b.Seq[0] {
			return fmt.Errorf("sequence parallel: rows must be one sequence at increasing positions (row %d: position %d after %d)", i, b.Pos[i], b.Pos[i-1])
		}
	}
	rank := be.ring.T.Rank()
	switch end := be.holdEnd(); {
	case be.decode && be.end == 0:
		return errors.New("sequence parallel: decode before any prefill")
	case be.decode && (int(b.Pos[0]) != be.end || int(b.Pos[len(b.Pos)-1]) != be.end+len(b.Pos)-1):
		return fmt.Errorf("sequence parallel: decode rows must be positions [%d, %d), right after the sequence", be.end, be.end+len(b.Pos))
	case !be.decode && int(b.Pos[0]) < end:
		return fmt.Errorf("sequence parallel: rank %d holds positions up to %d; rows from %d do not follow them", rank, end, b.Pos[0])
	}
	// A rank keeps all its prefill rows, and decode rows if it holds the
	// sequence's tail (exactly one rank does).
	be.store = !be.decode || be.holdEnd() == be.end
	if be.decode {
		be.end += len(b.Pos)
	}
	return nil
}

// keep appends the batch rows' keys and values to layer li's runs.
func (be *seqBackend) keep(li int, b *Batch, k, v []float32, kvd int) {
	runs := be.layers[li]
	for i, p := range b.Pos {
		n := len(runs)
		if n == 0 || runs[n-1].start+len(runs[n-1].k)/kvd != int(p) {
			runs = append(runs, seqRun{start: int(p)})
			n++
		}
		r := &runs[n-1]
		r.k, r.v = append(r.k, k[i*kvd:(i+1)*kvd]...), append(r.v, v[i*kvd:(i+1)*kvd]...)
	}
	be.layers[li] = runs
}

// Attend keeps the rows' keys and values (if this rank holds them) and
// attends every row over all ranks' runs.
func (be *seqBackend) Attend(li int, b *Batch, _ KVCache, q, k, v, att []float32, ap AttnParams) {
	T := len(b.Tokens)
	qd, kvd := ap.NHead*ap.HeadDim, ap.NKVHead*ap.HeadDim
	if be.err != nil {
		clear(att[:T*qd])
		return
	}
	if be.store {
		be.keep(li, b, k, v, kvd)
	}
	be.blocks = be.blocks[:0]
	for _, r := range be.layers[li] {
		be.blocks = append(be.blocks, ring.Block{Start: r.start, K: r.k, V: r.v})
	}
	s := ring.Shape{NHead: ap.NHead, NKVHead: ap.NKVHead, HeadDim: ap.HeadDim, Scale: ap.Scale, Window: ap.Window}
	var err error
	if be.decode {
		err = be.ring.DecodeAllBlocks(s, q[:T*qd], b.Pos, be.blocks, att[:T*qd])
	} else {
		err = be.ring.PrefillBlocks(s, q[:T*qd], b.Pos, be.blocks, att[:T*qd])
		be.end = be.ring.End()
	}
	if err != nil {
		be.err = fmt.Errorf("sequence parallel: layer %d: %w", li, err)
		clear(att[:T*qd])
	}
}

// nopCache is the KVCache a sequence-parallel rank passes Forward: the
// backend keeps the keys and values, so there is nothing to prepare.
type nopCache struct{}

func (nopCache) Begin(*Batch) error { return nil }
func (nopCache) Store(int, int, []float32, []float32) {
	panic("sequence parallel: the ring backend stores keys and values")
}
func (nopCache) Attend(int, int, int, []float32, []float32, AttnParams) {
	panic("sequence parallel: the ring backend attends")
}
