package kvcache

import (
	"fmt"
	"math"
)

// SnapKVPolicy is SnapKV (Li et al., 2024): at the end of the prompt, the
// last Window prompt queries vote, per layer and KV head, with their
// attention weights (summed over the GQA group) for the earlier prompt
// positions; the votes are smoothed by average pooling of width Kernel and
// each head keeps the top Capacity-Window of them plus the observation
// window itself. Everything decoded afterwards is kept. The prompt's
// length comes from Cache.NotePrompt (the engine tells it at admission);
// a sequence whose prompt is not known is not compressed.
type SnapKVPolicy struct {
	Capacity, Window, Kernel int
	m                        *maskState
	prompts                  map[int32]int
}

// NewSnapKV makes a SnapKV policy; each cache binds its own copy.
func NewSnapKV(capacity, window, kernel int) *SnapKVPolicy {
	return &SnapKVPolicy{Capacity: capacity, Window: window, Kernel: kernel}
}

func (p *SnapKVPolicy) String() string {
	return fmt.Sprintf("snapkv:capacity=%d,window=%d,kernel=%d", p.Capacity, p.Window, p.Kernel)
}

// Check implements the configuration check.
func (p *SnapKVPolicy) Check() error {
	if p.Window < 1 || p.Capacity < p.Window || p.Kernel < 1 || p.Kernel%2 == 0 {
		return fmt.Errorf("kvcache: snapkv with capacity %d, window %d, kernel %d (want capacity >= window >= 1, odd kernel)", p.Capacity, p.Window, p.Kernel)
	}
	return nil
}

func (p *SnapKVPolicy) attach(c *Cache, gi int) (Policy, error) {
	return &SnapKVPolicy{Capacity: p.Capacity, Window: p.Window, Kernel: p.Kernel, m: newMaskState(c, gi), prompts: map[int32]int{}}, nil
}

func (p *SnapKVPolicy) notePrompt(seq int32, n int) { p.prompts[seq] = n }

// Visible implements Policy.
func (*SnapKVPolicy) Visible(_ int32, pos int, dst []Span) []Span {
	return append(dst, Span{0, pos + 1})
}

// Release implements Policy: blocks every head has evicted.
func (p *SnapKVPolicy) Release(seq int32, next, bs int, dst []Span) []Span {
	return p.m.release(seq, next, bs, dst)
}

// MaxBlocks implements Policy: no bound.
func (*SnapKVPolicy) MaxBlocks(_, _ int) int { return 0 }

// Lossy implements Lossy.
func (*SnapKVPolicy) Lossy() bool { return true }

func (p *SnapKVPolicy) beginStep(owns func(int32) bool) { p.m.beginStep(owns) }

// ObserveScores implements ScoreObserver: the observation window's votes
// for the positions before it.
func (p *SnapKVPolicy) ObserveScores(layer int, seq int32, pos, head int, spans []Span, w []float32) {
	P := p.prompts[seq]
	if pos < P-p.Window || pos >= P {
		return
	}
	obs := P - p.Window
	k := 0
	for i, s := range spans {
		if s.From >= obs {
			spans = spans[:i]
			break
		}
		if s.To > obs {
			spans = append(spans[:i:i], Span{s.From, obs})
			k += obs - s.From
			break
		}
		k += s.To - s.From
	}
	p.m.observe(p.m.seqs[seq], layer, head, spans, w[:k])
}

// Select implements PageSelector: the positions the head keeps.
func (p *SnapKVPolicy) Select(layer int, seq int32, _, kvHead int, q []float32, spans, dst []Span) []Span {
	p.m.learnGroup(q)
	return p.m.selectKept(seq, layer, kvHead, spans, dst)
}

// Committed implements Tracker: once the prompt is computed, each head
// keeps its pooled top positions.
func (p *SnapKVPolicy) Committed(seq int32, next int) {
	s, P := p.m.seqs[seq], p.prompts[seq]
	if s == nil || s.done || P == 0 || next < P {
		return
	}
	s.done = true
	if P <= p.Capacity {
		return
	}
	obs := P - p.Window
	pooled := make([]int64, obs)
	cand := make([]int, obs)
	var idx []int
	half := p.Kernel / 2
	for i := range s.gone {
		acc := s.acc[i]
		// Average pooling, zero padded: the kernel's sum (the constant
		// divisor does not change the order).
		var sum int64
		for t := 0; t < min(half, obs); t++ {
			sum += acc[t]
		}
		for t := 0; t < obs; t++ {
			if t+half < obs {
				sum += acc[t+half]
			}
			if t-half-1 >= 0 {
				sum -= acc[t-half-1]
			}
			pooled[t] = sum
			cand[t] = t
		}
		keepTop(s.gone[i], cand, func(t int) int64 { return pooled[t] }, p.Capacity-p.Window, idx)
	}
	s.sealed = P
}

// hitLimit: the observation window's queries must run.
func (p *SnapKVPolicy) hitLimit(n int) int { return n - p.Window }

// Truncated implements Tracker.
func (p *SnapKVPolicy) Truncated(seq int32, n int) {
	if n == 0 {
		delete(p.prompts, seq)
	}
	p.m.truncated(seq, n)
}

// Forked implements Tracker.
func (p *SnapKVPolicy) Forked(parent, child int32) {
	p.m.forked(parent, child)
	if n, ok := p.prompts[parent]; ok {
		p.prompts[child] = n
	}
}

// Sealed implements Sealer: decode tokens attend the compressed prompt.
func (p *SnapKVPolicy) Sealed(seq int32) int {
	if s := p.m.seqs[seq]; s != nil && s.done && s.sealed != math.MaxInt {
		return s.sealed
	}
	return math.MaxInt
}

func init() {
	policyMakers["snapkv"] = func(a *args) Policy {
		return NewSnapKV(a.int("capacity", 1024), a.int("window", 32), a.int("kernel", 7))
	}
}
