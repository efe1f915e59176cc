package grammar

import (
	"context"
	"fmt"
	"time"
)

// Limits bound the work of compiling one schema, so that a hostile schema
// (an enum of 85,000 strings, an object of 20,000 properties) is refused
// after a bounded and small amount of CPU and memory rather than after it
// has been built. A zero field takes its default.
type Limits struct {
	// MaxStates caps the automaton states of all lexemes together.
	MaxStates int
	// MaxBytes caps the memory of the grammar's tables (automata and
	// rules), counted as they are built.
	MaxBytes int64
	// MaxTime caps the wall time of one compilation.
	MaxTime time.Duration
}

// Defaults: room for every schema of the test suite and the usual tool and
// structured-output schemas by a wide margin, while a refusal costs well
// under 100 ms and a few tens of MB at most.
const (
	DefaultMaxStates = 1 << 18
	DefaultMaxBytes  = 16 << 20
	DefaultMaxTime   = 2 * time.Second
)

// WithDefaults is l with every zero field set to its default.
func (l Limits) WithDefaults() Limits {
	if l.MaxStates <= 0 {
		l.MaxStates = DefaultMaxStates
	}
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	if l.MaxTime <= 0 {
		l.MaxTime = DefaultMaxTime
	}
	return l
}

// budget is what one compilation has spent. Its error is sticky: once
// over, every later check fails the same way.
type budget struct {
	ctx      context.Context
	lim      Limits
	deadline time.Time
	states   int
	bytes    int64
	ticks    int
	err      error
	// transient: err is the clock's or the context's, not the schema's.
	transient bool
}

func newBudget(ctx context.Context, lim Limits) *budget {
	if ctx == nil {
		ctx = context.Background()
	}
	lim = lim.WithDefaults()
	return &budget{ctx: ctx, lim: lim, deadline: time.Now().Add(lim.MaxTime)}
}

// fits reports, without charging, whether states more automaton states
// and bytes more memory stay within the limits; the error names which
// does not.
func (b *budget) fits(states int, bytes int64) error {
	if b.err != nil {
		return b.err
	}
	if b.states+states > b.lim.MaxStates {
		return fmt.Errorf("the schema needs more than %d automaton states (at least %d; too many or too long enum values, property names or string length limits)", b.lim.MaxStates, b.states+states)
	}
	if b.bytes+bytes > b.lim.MaxBytes {
		return fmt.Errorf("the schema's grammar needs more than %d MiB (at least %d MiB)", b.lim.MaxBytes>>20, (b.bytes+bytes+(1<<20)-1)>>20)
	}
	return nil
}

// charge spends states and bytes; going over is remembered.
func (b *budget) charge(states int, bytes int64) error {
	if err := b.fits(states, bytes); err != nil {
		b.err = err
		return err
	}
	b.states += states
	b.bytes += bytes
	return b.check()
}

// check fails once the budget is spent, the time is up or the context is
// done (the client left). The clock and the context are read every few
// calls only, so check is cheap enough for inner loops.
func (b *budget) check() error {
	if b.err != nil {
		return b.err
	}
	if b.ticks++; b.ticks&63 != 0 {
		return nil
	}
	return b.checkNow()
}

func (b *budget) checkNow() error {
	if b.err != nil {
		return b.err
	}
	if err := b.ctx.Err(); err != nil {
		b.err, b.transient = fmt.Errorf("compilation stopped: %w", context.Cause(b.ctx)), true
	} else if time.Now().After(b.deadline) {
		b.err, b.transient = fmt.Errorf("compiling the schema took longer than %v", b.lim.MaxTime), true
	}
	return b.err
}
