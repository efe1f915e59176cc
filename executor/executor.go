// Package executor is the boundary between a scheduler and the process
// that runs the model: one step goes in as plain data (StepInput), its
// results come back as plain data (StepOutput). In one process Local runs
// the step on a model and its KV storage, passing the input by pointer;
// across a wire (a pipe, a socket) Remote and Serve carry the same step in
// a compact binary form (wire.go), so a worker process can execute what a
// scheduler elsewhere planned.
package executor

import (
	"errors"
	"fmt"
	"time"

	"pagoda/model"
)

// StepInput is one forward step: a flat batch of prefill chunks and decode
// tokens of one or more sequences. Tokens of one sequence appear in
// increasing position order.
type StepInput struct {
	Tokens []int32
	Pos    []int32
	// Seq is the sequence handle of each row, as the worker's KV storage
	// knows it.
	Seq []int32
	// Logits marks the rows whose logits come back, in row order; nil
	// means only the last row.
	Logits []bool
	// KV is where the rows live in a paged KV storage and what each
	// attends (block tables, slot mapping, visible spans), as the
	// scheduler's KV manager planned it; nil lets the storage plan the
	// step itself (a flat cache, a single-process run).
	KV *model.KVPlan
	// Rope is each row's rotary position where it differs from Pos (the
	// nodes of a speculation tree share positions by depth but are stored
	// apart); nil: Pos.
	Rope []int32
	// Moves are KV slot copies the storage makes, every layer, before the
	// step runs: (from, to) pairs of slots (page·BlockSize + offset). A
	// verified speculation tree's accepted path is compacted into place
	// this way. A step may carry moves and no rows.
	Moves []int32
	// Hidden asks for every row's final hidden state (StepOutput.Hidden):
	// the features Medusa heads and EAGLE drafts predict from.
	Hidden bool
	// TopK > 0 asks for each logits row as its k largest logits only
	// (StepOutput.TopIDs and Logits, k per row), which is all a greedy
	// request without log-probabilities, logit bias or penalties needs
	// (k = 1). A tensor-parallel group with a vocabulary-split output
	// head then reduces each rank's slice to its top k and ships those
	// instead of whole rows. At most MaxTopK; larger than the vocabulary
	// means the whole vocabulary, sorted.
	TopK int
}

// MaxTopK bounds StepInput.TopK.
const MaxTopK = 1 << 16

// Rows is the number of logits rows the step returns.
func (in *StepInput) Rows() int {
	if in.Logits == nil {
		if len(in.Tokens) == 0 {
			return 0
		}
		return 1
	}
	n := 0
	for _, l := range in.Logits {
		if l {
			n++
		}
	}
	return n
}

// StepOutput is what one step returns.
type StepOutput struct {
	// Logits holds VocabSize floats for each row marked in the input, in
	// row order.
	Logits []float32
	// Busy is how long the executor computed the step, where it measures
	// it (a pipeline stage does, for the bubble fraction); 0 otherwise.
	Busy time.Duration
	// Hidden holds NEmbd floats per row of the input, when it asked.
	Hidden []float32
	// TopIDs, when the input asked for TopK, are the token ids of each
	// row's largest logits, k per row (fewer only when the vocabulary
	// is smaller), largest first, ties to the lower id; Logits then
	// holds their values in the same order.
	TopIDs []int32
	// KV is what the storage's stateful policies decided for the
	// manager (kvcache.Follower.Reports), when the storage keeps them.
	KV []model.KVReport
}

// Executor runs steps. Implementations are called from one goroutine at a
// time (the scheduler's loop); the input is only read, and the output's
// slices belong to the caller until the next Execute.
type Executor interface {
	Execute(in *StepInput) (StepOutput, error)
}

// Forwarder is the model side of a local executor: *model.Model does it.
type Forwarder interface {
	Forward(b *model.Batch, kv model.KVCache) ([]float32, error)
}

// Local executes steps in this process on a model and the KV storage it
// reads and writes.
type Local struct {
	F  Forwarder
	KV model.KVCache
	b  model.Batch // reused: the step is handed to the model without copying
}

// NewLocal is an executor running f over kv.
func NewLocal(f Forwarder, kv model.KVCache) *Local { return &Local{F: f, KV: kv} }

// Execute runs one step.
func (l *Local) Execute(in *StepInput) (StepOutput, error) {
	if l.F == nil || l.KV == nil {
		return StepOutput{}, errors.New("executor: no model or KV storage")
	}
	if err := moveSlots(l.KV, in.Moves); err != nil {
		return StepOutput{}, err
	}
	rep, _ := l.KV.(Reporter)
	if len(in.Tokens) == 0 {
		if in.KV == nil || len(in.KV.Notes) == 0 {
			return StepOutput{}, nil
		}
		if rep == nil {
			return StepOutput{}, fmt.Errorf("executor: KV storage %T cannot follow a manager's notes", l.KV)
		}
		if err := rep.Apply(in.KV.Notes); err != nil {
			return StepOutput{}, err
		}
		return StepOutput{KV: rep.Reports()}, nil
	}
	var out StepOutput
	if in.Hidden {
		hs, ok := l.F.(interface{ HiddenSize() int })
		if !ok {
			return StepOutput{}, fmt.Errorf("executor: %T does not return hidden states", l.F)
		}
		out.Hidden = make([]float32, len(in.Tokens)*hs.HiddenSize())
	}
	l.b = model.Batch{Tokens: in.Tokens, Pos: in.Pos, Seq: in.Seq, Logits: in.Logits, KV: in.KV, Rope: in.Rope, Hidden: out.Hidden}
	logits, err := l.F.Forward(&l.b, l.KV)
	l.b = model.Batch{}
	if err != nil {
		return StepOutput{}, err
	}
	out.Logits = logits
	if rep != nil {
		out.KV = rep.Reports()
	}
	if in.TopK > 0 {
		if out.TopIDs, out.Logits, err = TopK(logits, in.Rows(), in.TopK, nil, nil); err != nil {
			return StepOutput{}, err
		}
	}
	return out, nil
}

// Reporter is KV storage that follows a manager on another process
// (kvcache.Follower): it applies the notes a plan carries, and reports
// what its stateful policies decided after each step.
type Reporter interface {
	Apply(notes []model.KVNote) error
	Reports() []model.KVReport
}

// SlotMover is KV storage that copies slots, every layer: what applies a
// step's Moves.
type SlotMover interface {
	MoveSlots(pairs []int32) error
}

func moveSlots(kv model.KVCache, pairs []int32) error {
	if len(pairs) == 0 {
		return nil
	}
	mv, ok := kv.(SlotMover)
	if !ok {
		return fmt.Errorf("executor: KV storage %T cannot move slots", kv)
	}
	return mv.MoveSlots(pairs)
}

// check reports a step whose fields disagree in length, so a malformed
// step from a wire fails clearly instead of reaching the model.
func (in *StepInput) check() error {
	T := len(in.Tokens)
	if len(in.Pos) != T || len(in.Seq) != T || (in.Logits != nil && len(in.Logits) != T) || (in.Rope != nil && len(in.Rope) != T) {
		return fmt.Errorf("executor: step fields have different lengths (%d tokens, %d positions, %d sequences, %d logits marks, %d rotary positions)",
			T, len(in.Pos), len(in.Seq), len(in.Logits), len(in.Rope))
	}
	if in.TopK < 0 || in.TopK > MaxTopK {
		return fmt.Errorf("executor: top-k %d out of range [0, %d]", in.TopK, MaxTopK)
	}
	if len(in.Moves)%2 != 0 {
		return fmt.Errorf("executor: %d slot-move entries are not (from, to) pairs", len(in.Moves))
	}
	return nil
}
