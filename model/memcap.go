package model

import (
	"fmt"

	"pagoda/progress"
)

// MemoryError is a model refused by Options.MaxMemory: what this process
// would bind against the cap, before any of it is allocated.
type MemoryError struct {
	Weights int64 // the weight matrices this process binds (its shard only)
	Reserve int64 // what the caller adds for this model (its KV storage)
	Cap     int64
}

// Need is the bytes the model would take in this process.
func (e *MemoryError) Need() int64 { return e.Weights + e.Reserve }

func (e *MemoryError) Error() string {
	return fmt.Sprintf("needs %d bytes (%s: weights %s + KV %s), over the memory cap of %d bytes (%s)",
		e.Need(), progress.Bytes(e.Need()), progress.Bytes(e.Weights), progress.Bytes(e.Reserve), e.Cap, progress.Bytes(e.Cap))
}

// CheckMemory is nil when weights plus reserve fit in limit (0: no
// limit), else a *MemoryError.
func CheckMemory(limit, weights, reserve int64) error {
	if limit > 0 && weights+reserve > limit {
		return &MemoryError{Weights: weights, Reserve: reserve, Cap: limit}
	}
	return nil
}

// weightBytes is the bytes of the weight matrices w binds, as stored
// (quantized blocks, F16): a tensor-parallel rank's shard or a stage's
// layers only. Norms and biases, a fraction of a percent, are left out.
func (w *Weights) weightBytes() int64 {
	var n int64
	for _, mat := range w.Matrices() {
		n += int64(len(mat.Data))
	}
	return n
}

// WeightBytes is the bytes of the weight matrices this model bound, as
// Options.MaxMemory counts them.
func (m *Model) WeightBytes() int64 { return m.W.weightBytes() }

// capCheck is bind's check of o.MaxMemory (nil without one), given the
// bytes of the weight matrices this model will hold: called once the
// weights are bound to the file and before anything is copied, read or
// repacked, the point where refusing costs nothing. The reserve is asked
// of the model's local configuration (its heads under tensor
// parallelism) and its layers.
func capCheck(o Options, c *Config, tp tpRank, st Stage) func(int64) error {
	if o.MaxMemory <= 0 {
		return nil
	}
	return func(weights int64) error {
		var reserve int64
		if o.Reserve != nil {
			local := *c
			local.localize(tp)
			var err error
			if reserve, err = o.Reserve(&local, st); err != nil {
				return err
			}
		}
		return CheckMemory(o.MaxMemory, weights, reserve)
	}
}
