package model

import (
	"errors"
	"fmt"

	"pagoda/ring"
)

// SeqRank is one rank of a sequence-parallel group: every rank holds the
// whole model (weights replicated) and a contiguous slice of one long
// sequence's tokens and their keys and values, per layer. A layer's
// attention exchanges K/V blocks with the other ranks around a ring
// (Ring Attention, package ring), so each rank's rows get exact attention
// over the whole sequence while no rank ever holds more than its slice and
// one block in flight.
//
// The group serves one sequence. Prefill steps give each rank its own rows
// (its slice, continuing where its last prefill left off); decode steps give
// every rank the same rows, whose keys and values the last rank (the
// holder of the sequence's tail) keeps, and every rank gets the same
// attention output (one partial per rank, merged in rank order).
type SeqRank struct {
	m  *Model
	be *seqBackend
}

// seqBackend is the CPU backend whose Attend goes around the ring. It keeps
// the rank's K/V itself, so the model's KVCache sees only Begin.
type seqBackend struct {
	*cpuBackend
	ring   *ring.Ring
	layers []seqSlice
	decode bool // this step's rows are the same on every rank
	err    error
}

// seqSlice is a rank's keys and values of one layer: positions start and on.
type seqSlice struct {
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
	be := &seqBackend{cpuBackend: cpu, ring: ring.New(t, m.ops), layers: make([]seqSlice, c.NLayer)}
	m.be = be
	return &SeqRank{m: m, be: be}, nil
}

// Prefill runs this rank's rows of the sequence (consecutive positions,
// continuing its slice) and returns their logits as Forward does. Every
// rank calls it in the same step.
func (s *SeqRank) Prefill(b *Batch) ([]float32, error) {
	s.be.decode = false
	return s.m.Forward(b, nopCache{})
}

// Decode runs rows that follow the whole sequence, the same batch on every
// rank; the last rank stores their keys and values.
func (s *SeqRank) Decode(b *Batch) ([]float32, error) {
	s.be.decode = true
	return s.m.Forward(b, nopCache{})
}

// Len is the number of positions this rank holds.
func (s *SeqRank) Len() int {
	return len(s.be.layers[0].k) / max(1, s.m.Config.NKVHead*s.m.Config.HeadDim)
}

// stepBackend is a Backend that can refuse a step up front and fail
// inside it (an exchange with other processes); Forward asks it around
// every step.
type stepBackend interface {
	beginStep(b *Batch) error
	stepErr() error
}

func (be *seqBackend) stepErr() error { return be.err }

// beginStep checks that the batch is rows of the one sequence at
// consecutive positions, continuing this rank's slice when it stores them.
func (be *seqBackend) beginStep(b *Batch) error {
	if be.err != nil {
		return be.err
	}
	for i := 1; i < len(b.Pos); i++ {
		if b.Pos[i] != b.Pos[i-1]+1 || b.Seq[i] != b.Seq[0] {
			return fmt.Errorf("sequence parallel: rows must be one sequence at consecutive positions (row %d: position %d after %d)", i, b.Pos[i], b.Pos[i-1])
		}
	}
	sl := &be.layers[0]
	kvd := be.m.Config.NKVHead * be.m.Config.HeadDim
	if end := sl.start + len(sl.k)/kvd; be.stores() && len(sl.k) > 0 && int(b.Pos[0]) != end {
		return fmt.Errorf("sequence parallel: rank %d holds positions [%d, %d); rows from %d do not continue them", be.ring.T.Rank(), sl.start, end, b.Pos[0])
	}
	return nil
}

// stores is whether this rank keeps this step's keys and values.
func (be *seqBackend) stores() bool {
	return !be.decode || be.ring.T.Rank() == be.ring.T.Ranks()-1
}

// Attend keeps the rows' keys and values in this rank's slice (if it
// holds them) and attends every row over all ranks' slices.
func (be *seqBackend) Attend(li int, b *Batch, _ KVCache, q, k, v, att []float32, ap AttnParams) {
	T := len(b.Tokens)
	qd, kvd := ap.NHead*ap.HeadDim, ap.NKVHead*ap.HeadDim
	if be.err != nil {
		clear(att[:T*qd])
		return
	}
	sl := &be.layers[li]
	if be.stores() {
		if len(sl.k) == 0 {
			sl.start = int(b.Pos[0])
		}
		sl.k, sl.v = append(sl.k, k[:T*kvd]...), append(sl.v, v[:T*kvd]...)
	}
	s := ring.Shape{NHead: ap.NHead, NKVHead: ap.NKVHead, HeadDim: ap.HeadDim, Scale: ap.Scale, Window: ap.Window}
	own := ring.Block{Start: sl.start, K: sl.k, V: sl.v}
	var err error
	if be.decode {
		err = be.ring.DecodeAll(s, q[:T*qd], b.Pos, own, att[:T*qd])
	} else {
		err = be.ring.Prefill(s, q[:T*qd], b.Pos, own, att[:T*qd])
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
