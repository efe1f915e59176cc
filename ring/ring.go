package ring

import (
	"fmt"
	"sync"

	"pagoda/kernels"
)

// Transport is a rank's two links in a ring of Ranks ranks: messages go to
// the next rank, (Rank+1) mod Ranks, and come from the previous one. Every
// rank makes the same calls in the same order. An error is final: the
// transport is broken and every later call fails.
type Transport interface {
	Rank() int
	Ranks() int
	// SendBlocks sends blocks (rows of kvd floats) to the next rank.
	SendBlocks(bs []Block, kvd int) error
	// RecvBlocks receives the previous rank's blocks, reusing the memory
	// of bs.
	RecvBlocks(bs []Block, kvd int) ([]Block, error)
	// SendPartial and RecvPartial carry a partial result (M, L, Acc).
	SendPartial(p *Partial) error
	RecvPartial(p *Partial) error
}

// Ring runs attention over a sequence whose keys and values are split in
// contiguous slices among the ranks of a Transport. It keeps its buffers
// between calls (one per layer, the same sizes); one goroutine at a time.
type Ring struct {
	T   Transport
	Ops *kernels.Ops

	buf   [2][]Block // blocks in flight: received into one while the other is sent
	part  Partial
	peer  Partial
	parts []*Partial // by rank, for DecodeAll
	end   int        // see End
}

// End is one past the last position of all the blocks the last prefill
// saw: the end of the whole sequence, on every rank.
func (r *Ring) End() int { return r.end }

// New is a ring over t computing with ops (nil: kernels.Best()).
func New(t Transport, ops *kernels.Ops) *Ring {
	if ops == nil {
		ops = kernels.Best()
	}
	return &Ring{T: t, Ops: ops}
}

// Prefill writes into out (rows × QDim) the exact causal attention of this
// rank's queries q, at positions qPos, over the whole sequence: own is this
// rank's slice of keys and values, and the other ranks' slices come around
// the ring. In each of Ranks−1 passes every rank sends the blocks it holds
// to the next rank while it receives the previous rank's and merges the
// attention of its queries over the blocks it holds; after the last pass
// each rank has seen every block once. Blocks wholly in the future of a
// rank's queries still pass through it (they are on their way to later
// ranks) but cost no arithmetic there.
func (r *Ring) Prefill(s Shape, q []float32, qPos []int32, own Block, out []float32) error {
	return r.PrefillBlocks(s, q, qPos, []Block{own}, out)
}

// PrefillBlocks is Prefill for a rank that holds several runs of the
// sequence (own, in any number), its queries at any positions: the zigzag split (Zigzag) gives each rank an early and a late
// run so the causal work is even.
func (r *Ring) PrefillBlocks(s Shape, q []float32, qPos []int32, own []Block, out []float32) error {
	if err := s.Check(); err != nil {
		return err
	}
	kvd, P := s.KVDim(), r.T.Ranks()
	r.part.Reset(s, len(qPos))
	r.end = 0
	cur := own
	for pass := 0; pass < P; pass++ {
		var sendErr, recvErr error
		var wg sync.WaitGroup
		next := &r.buf[pass%2]
		if pass < P-1 {
			wg.Go(func() { sendErr = r.T.SendBlocks(cur, kvd) })
			wg.Go(func() { *next, recvErr = r.T.RecvBlocks(*next, kvd) })
		}
		for _, b := range cur {
			r.part.Attend(r.Ops, q, qPos, b)
			r.end = max(r.end, b.Start+b.Len(s))
		}
		wg.Wait()
		if err := firstErr(sendErr, recvErr); err != nil {
			return fmt.Errorf("ring attention, rank %d of %d, pass %d: %w", r.T.Rank(), P, pass+1, err)
		}
		cur = *next
	}
	r.part.Out(out)
	return nil
}

// Zigzag is the load-balanced split of T positions over P ranks: 2P
// chunks of T/(2P) (the last takes the rest), rank r holding chunks r and
// 2P−1−r, as half-open ranges. With contiguous slices the last rank's
// queries see the whole sequence and the first rank's only their own
// slice (causal work grows as 1, 3, 5, …); paired this way every rank
// sees about the same number of keys.
func Zigzag(T, P, rank int) [2][2]int {
	c := func(i int) int { return i * T / (2 * P) }
	a, b := rank, 2*P-1-rank
	return [2][2]int{{c(a), c(a + 1)}, {c(b), c(b + 1)}}
}

// Decode attends the query rows q (the same on every rank: the new
// tokens, at positions qPos) over the keys and values of all ranks, each
// rank holding own. Every rank computes the partial over its own slice;
// the partials travel the ring from rank 1 to rank 0, each rank merging
// its own into what it received, so rank 0 ends with the partial over the
// whole sequence and writes out. It reports whether it wrote out (rank 0).
func (r *Ring) Decode(s Shape, q []float32, qPos []int32, own Block, out []float32) (bool, error) {
	if err := s.Check(); err != nil {
		return false, err
	}
	rank, P := r.T.Rank(), r.T.Ranks()
	r.part.Reset(s, len(qPos))
	r.part.Attend(r.Ops, q, qPos, own)
	// Rank 1 starts the chain; every rank after it, and rank 0 last,
	// receives the partial so far from the previous rank.
	if P > 1 && rank != 1 {
		if err := r.T.RecvPartial(&r.peer); err != nil {
			return false, fmt.Errorf("ring decode, rank %d of %d: %w", rank, P, err)
		}
		if err := r.part.Merge(&r.peer); err != nil {
			return false, err
		}
	}
	if rank != 0 {
		if err := r.T.SendPartial(&r.part); err != nil {
			return false, fmt.Errorf("ring decode, rank %d of %d: %w", rank, P, err)
		}
		return false, nil
	}
	r.part.Out(out)
	return true, nil
}

// DecodeAll is Decode with the result on every rank, the same bits on
// each: the ranks' partials go around the ring in Ranks−1 passes (each
// rank forwarding the one it received last), and every rank merges all of
// them in rank order. A layer stack needs this, since every rank's next
// layer reads the attention output.
func (r *Ring) DecodeAll(s Shape, q []float32, qPos []int32, own Block, out []float32) error {
	return r.DecodeAllBlocks(s, q, qPos, []Block{own}, out)
}

// DecodeAllBlocks is DecodeAll for a rank that holds several runs.
func (r *Ring) DecodeAllBlocks(s Shape, q []float32, qPos []int32, own []Block, out []float32) error {
	if err := s.Check(); err != nil {
		return err
	}
	rank, P := r.T.Rank(), r.T.Ranks()
	for len(r.parts) < P {
		r.parts = append(r.parts, new(Partial))
	}
	mine := r.parts[rank]
	mine.Reset(s, len(qPos))
	for _, b := range own {
		mine.Attend(r.Ops, q, qPos, b)
	}
	for pass := 1; pass < P; pass++ {
		// Send the partial of rank − pass + 1, receive that of rank − pass.
		send, recv := r.parts[(rank-pass+1+P)%P], r.parts[(rank-pass+P)%P]
		var sendErr, recvErr error
		var wg sync.WaitGroup
		wg.Go(func() { sendErr = r.T.SendPartial(send) })
		wg.Go(func() { recvErr = r.T.RecvPartial(recv) })
		wg.Wait()
		if err := firstErr(sendErr, recvErr); err != nil {
			return fmt.Errorf("ring decode, rank %d of %d, pass %d: %w", rank, P, pass, err)
		}
	}
	r.part.Reset(s, len(qPos))
	for _, p := range r.parts[:P] {
		if err := r.part.Merge(p); err != nil {
			return err
		}
	}
	r.part.Out(out)
	return nil
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}
