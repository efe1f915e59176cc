package kvcache

// Span is a half-open range [From, To): positions of a sequence, or
// logical block indices of its block table.
type Span struct{ From, To int }

// Policy decides, for one layer group, which cached positions a query
// attends and which blocks a sequence may give back. Full attention and
// the sliding window are policies; StreamingLLM's sinks, Quest's selected
// blocks and H2O's heavy hitters fit the same seam. The cache asks it once
// per step (Begin, Commit), never per layer or per position.
type Policy interface {
	// Visible appends to dst the positions a query at position pos of seq
	// attends: ascending, disjoint spans inside [0, pos].
	Visible(seq int32, pos int, dst []Span) []Span
	// Release appends to dst the logical blocks of blockSize tokens that no
	// query at position next or later of seq attends, so they may return
	// to the pool. They need not be a prefix: sinks keep block 0.
	Release(seq int32, next, blockSize int, dst []Span) []Span
	// MaxBlocks bounds the blocks a sequence holds while computing a step
	// of chunk tokens; 0 means no bound below the sequence's length.
	MaxBlocks(chunk, blockSize int) int
}

// ScoreObserver is a Policy that reads attention weights (H2O accumulates
// the mass each cached token receives). Attend calls it after the softmax
// of every query and head, with the spans the weights cover, concurrently
// from the pool's workers.
type ScoreObserver interface {
	Policy
	ObserveScores(layer int, seq int32, pos, head int, spans []Span, weights []float32)
}

// PageSelector is a Policy that chooses, per query and KV head, which of
// the positions it lets the query see are actually read, from the query
// itself and before any page is touched (Quest ranks pages by an upper
// bound of q·k from per-page key minima and maxima). Attend calls Select
// concurrently from the pool's workers.
type PageSelector interface {
	Policy
	// Select appends to dst the parts of spans (ascending, disjoint: what
	// Visible allowed, clipped to the model's window) that the query at
	// position pos reads for KV head kvHead; q holds the query vectors of
	// that head's GQA group. The result must be ascending, disjoint and
	// inside spans.
	Select(layer int, seq int32, pos, kvHead int, q []float32, spans, dst []Span) []Span
}

// Lossy is implemented by policies that drop positions the model attends
// on purpose (sinks, Quest, H2O). For any other policy a query whose model
// window reaches a released block is a configuration error, and Attend
// panics rather than return silently different attention.
type Lossy interface{ Lossy() bool }

// FullPolicy attends every position and releases nothing.
type FullPolicy struct{}

// Visible implements Policy.
func (FullPolicy) Visible(_ int32, pos int, dst []Span) []Span {
	return append(dst, Span{0, pos + 1})
}

// Release implements Policy.
func (FullPolicy) Release(_ int32, _, _ int, dst []Span) []Span { return dst }

// MaxBlocks implements Policy.
func (FullPolicy) MaxBlocks(_, _ int) int { return 0 }

// WindowPolicy is Mistral's sliding window: a query sees its last W
// positions, and a block whose positions no later query can see is
// released as soon as the sequence has computed past it, so a sequence
// holds about W/blockSize+1 blocks however long it grows.
type WindowPolicy struct{ W int }

// Visible implements Policy.
func (p WindowPolicy) Visible(_ int32, pos int, dst []Span) []Span {
	return append(dst, Span{max(0, pos+1-p.W), pos + 1})
}

// Release implements Policy: token p sees positions from p+1-W on, so
// block i is dead once (i+1)·blockSize <= next+1-W.
func (p WindowPolicy) Release(_ int32, next, blockSize int, dst []Span) []Span {
	if n := (next + 1 - p.W) / blockSize; next+1-p.W > 0 && n > 0 {
		dst = append(dst, Span{0, n})
	}
	return dst
}

// MaxBlocks implements Policy: live positions are [c+1-W, c+chunk) for a
// step starting at c.
func (p WindowPolicy) MaxBlocks(chunk, blockSize int) int {
	return (p.W+chunk-2)/blockSize + 2
}

// intersect is the ranges in both a and b (each ascending and disjoint).
func intersect(a, b []Span) []Span {
	var out []Span
	for i, j := 0, 0; i < len(a) && j < len(b); {
		lo, hi := max(a[i].From, b[j].From), min(a[i].To, b[j].To)
		if lo < hi {
			out = append(out, Span{lo, hi})
		}
		if a[i].To < b[j].To {
			i++
		} else {
			j++
		}
	}
	return out
}

// QueryShifter is a Policy that moves positions (StreamingLLM's positions
// within the cache, llama.cpp's context shift). Keys are stored rotated at
// their true positions and never rewritten; for a query at pos, the keys
// at positions below the returned bound are scored as if the query stood
// delta positions further (negative: nearer). RoPE depends only on the
// distance, so rotating the query by delta equals re-rotating those keys
// by -delta (llama.cpp's MapKeys shift), without writing blocks that
// other sequences or the prefix cache share. The cache needs
// Config.Rope to rotate.
type QueryShifter interface {
	Policy
	QueryShift(seq int32, pos int) (below, delta int)
}

// Unbounded is implemented by policies under which a sequence may grow
// past the model's context: every query's relative distances stay within
// it, so the model need not check absolute positions.
type Unbounded interface{ Unbounded() bool }

// Tracker is a Policy that keeps state per sequence (accumulated scores,
// key bounds): the cache tells it about every change of a sequence's
// length, so freeing, preemption, rollback and forks keep it in step.
type Tracker interface {
	Policy
	// Committed: seq has computed its first next tokens (called by
	// Commit before blocks are released).
	Committed(seq int32, next int)
	// Truncated: seq keeps only its first n tokens (n = 0: freed).
	Truncated(seq int32, n int)
	// Forked: child starts as a copy of parent.
	Forked(parent, child int32)
}

// Sealer is a Policy whose kept tokens depend on more than the token
// prefix (H2O's evictions depend on when steps ended): the K/V of
// positions from Sealed(seq) on were computed over a history a
// recomputation need not reproduce, so their blocks stay out of the
// prefix cache. Sealed returns a position, or math.MaxInt for none.
type Sealer interface {
	Policy
	Sealed(seq int32) int
}

// attacher is a policy the cache hands itself to at construction (Quest
// reads per-block key bounds, H2O sizes its score tables): attach returns
// the instance bound to c, which the cache uses in its place, so one
// configured policy value can serve several caches.
type attacher interface {
	attach(c *Cache, group int) (Policy, error)
}

// stepper is a bound policy that prepares per-sequence state for the step
// Begin has just laid out (c.step), before Attend runs concurrently, for
// the sequences owns says run it (others may run other policies).
type stepper interface {
	beginStep(owns func(seq int32) bool)
}

// prompter is a bound policy that needs each sequence's prompt length
// (SnapKV's observation window ends there).
type prompter interface{ notePrompt(seq int32, n int) }

// hitLimiter is a policy whose decisions need the scores of prompt
// queries: a prefix hit must leave at least those queries to compute, so
// Lookup returns at most hitLimit(n) of n tokens (H2O: none, every query
// adds mass; SnapKV: all but the observation window).
type hitLimiter interface{ hitLimit(n int) int }
