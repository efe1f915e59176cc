package kvcache

import "fmt"

// Rotary is the model's rotary embedding, which policies that move
// positions (StreamingPolicy) need to rotate queries by a distance.
type Rotary struct {
	Freqs   []float32 // angular frequency per rotated pair (model.Config.Freqs)
	Neox    bool      // half-split pairs
	HeadDim int
}

// rotate turns every head of x (HeadDim floats each) by delta positions.
func (r *Rotary) rotate(rope func(x []float32, pos int, freqs []float32, neox bool), x []float32, delta int) {
	for h := 0; h+r.HeadDim <= len(x); h += r.HeadDim {
		rope(x[h:h+r.HeadDim], delta, r.Freqs, r.Neox)
	}
}

// PosScheme is how StreamingPolicy places the tokens it keeps.
type PosScheme uint8

const (
	// PosCache is StreamingLLM's scheme and the default: positions within
	// the cache. The sinks sit at 0..S-1 and the window right after them,
	// whatever positions its tokens had in the text, so a query is never
	// farther than S+W from any key it sees. The window slides one token
	// per token.
	PosCache PosScheme = iota
	// PosShift is llama.cpp's context shift: the cache fills up to Ctx
	// tokens; then everything between the sinks and the last W tokens is
	// discarded at once and the kept keys move down by the discarded
	// count. Between shifts the sinks drift away from the query.
	PosShift
)

func (s PosScheme) String() string {
	if s == PosShift {
		return "shift"
	}
	return "cache"
}

// StreamingPolicy is StreamingLLM: the first Sinks tokens and a recent
// window of Window tokens; the blocks in between are released as the
// window moves, so a sequence holds a bounded number of blocks however
// long it generates, and may go past the model's context.
//
// Keys stay rotated at their true positions; the position scheme is
// applied by rotating the query for the sinks (QueryShifter), which is
// exact because a window is contiguous: only the distances to the sinks
// differ from the true ones.
type StreamingPolicy struct {
	Sinks, Window int
	Scheme        PosScheme
	// Ctx is, for PosShift, the tokens the cache fills before a shift
	// (llama.cpp's n_ctx); a shift keeps Sinks + Window of them.
	Ctx int
}

// Check reports a configuration that cannot work.
func (p StreamingPolicy) Check() error {
	switch {
	case p.Sinks < 0 || p.Window < 1:
		return fmt.Errorf("kvcache: streaming policy with %d sinks and window %d (want sinks >= 0, window >= 1)", p.Sinks, p.Window)
	case p.Scheme == PosShift && p.Ctx <= p.Sinks+p.Window:
		return fmt.Errorf("kvcache: context shift of a %d-token cache keeping %d sinks + %d recent discards nothing", p.Ctx, p.Sinks, p.Window)
	case p.Scheme > PosShift:
		return fmt.Errorf("kvcache: unknown position scheme %d", p.Scheme)
	}
	return nil
}

func (p StreamingPolicy) String() string {
	if p.Scheme == PosShift {
		return fmt.Sprintf("streaming:sinks=%d,window=%d,pos=shift,ctx=%d", p.Sinks, p.Window, p.Ctx)
	}
	return fmt.Sprintf("streaming:sinks=%d,window=%d", p.Sinks, p.Window)
}

// shifts is, for PosShift, how many shifts happened before a query at pos
// computes, and the first position of the kept recent tokens. Shift k
// happens when a token would take cache position Ctx: at true position
// Ctx + (k-1)·D, with D = Ctx - Sinks - Window tokens discarded each time.
func (p StreamingPolicy) shifts(pos int) (k, lo int) {
	if pos < p.Ctx {
		return 0, 0
	}
	d := p.Ctx - p.Sinks - p.Window
	k = (pos-p.Ctx)/d + 1
	return k, p.Ctx + (k-1)*d - p.Window
}

// windowStart is the first non-sink position a query at pos sees.
func (p StreamingPolicy) windowStart(pos int) int {
	if p.Scheme == PosShift {
		if k, lo := p.shifts(pos); k > 0 {
			return lo
		}
		return p.Sinks
	}
	return max(p.Sinks, pos+1-p.Window)
}

// Visible implements Policy.
func (p StreamingPolicy) Visible(_ int32, pos int, dst []Span) []Span {
	ws := p.windowStart(pos)
	if ws <= p.Sinks {
		return append(dst, Span{0, pos + 1})
	}
	if p.Sinks > 0 {
		dst = append(dst, Span{0, min(p.Sinks, pos+1)})
	}
	return append(dst, Span{ws, pos + 1})
}

// Release implements Policy: blocks holding no sink and lying wholly
// below the window start of a query at next.
func (p StreamingPolicy) Release(_ int32, next, bs int, dst []Span) []Span {
	first := (p.Sinks + bs - 1) / bs
	if last := p.windowStart(next) / bs; last > first {
		dst = append(dst, Span{first, last})
	}
	return dst
}

// MaxBlocks implements Policy: the sink blocks, and the blocks from the
// window start of the step's first query to its last token.
func (p StreamingPolicy) MaxBlocks(chunk, bs int) int {
	span := p.Window // positions [c+1-W, c+chunk)
	if p.Scheme == PosShift {
		span = p.Ctx - p.Sinks
	}
	return (p.Sinks+bs-1)/bs + (span+chunk-2)/bs + 2
}

// QueryShift implements QueryShifter: the distance from a query to sink i
// is its cache position minus i. With PosCache the query's cache position
// is Sinks + (pos - windowStart); with PosShift it is pos less the tokens
// discarded so far.
func (p StreamingPolicy) QueryShift(_ int32, pos int) (below, delta int) {
	if p.Scheme == PosShift {
		k, _ := p.shifts(pos)
		return p.Sinks, -k * (p.Ctx - p.Sinks - p.Window)
	}
	return p.Sinks, p.Sinks - p.windowStart(pos)
}

// Lossy implements Lossy.
func (StreamingPolicy) Lossy() bool { return true }

// Unbounded implements Unbounded: a query is never farther than
// Sinks+Window (or Ctx) from a key it sees.
func (StreamingPolicy) Unbounded() bool { return true }

// CachePositions lists, for a query at pos, the positions it sees and the
// position each is scored at (its place in the cache), and the query's
// own: the plain statement of the scheme, for references and tests.
func (p StreamingPolicy) CachePositions(pos int) (seen, at []int, qAt int) {
	for _, s := range p.Visible(0, pos, nil) {
		for t := s.From; t < s.To; t++ {
			seen = append(seen, t)
		}
	}
	_, delta := p.QueryShift(0, pos)
	shift := 0
	if p.Scheme == PosShift {
		shift = -delta
	} else if ws := p.windowStart(pos); ws > p.Sinks {
		shift = ws - p.Sinks
	}
	for _, t := range seen {
		if t < p.Sinks {
			at = append(at, t)
		} else {
			at = append(at, t-shift)
		}
	}
	return seen, at, pos - shift
}
