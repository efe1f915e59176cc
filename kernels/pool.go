package kernels

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Pool is a persistent set of worker goroutines for data-parallel loops.
// Spawning goroutines per matrix-vector product costs more than the work on
// small models (a decode matvec is ~10–100 µs), so the workers live as long
// as the pool, and after each job they spin for a while before parking:
// the next matmul of a forward pass arrives within microseconds to a few
// hundred of them (attention and norms run in between), and waking a
// parked goroutine costs tens of microseconds. The spin must outlast those
// gaps: at 100 µs (worker) and 25 µs (caller) a TinyLlama Q4_0 decode step
// on 2 threads spent half its time parking and waking, and ran at 0.55×
// the speed it reaches with 500 µs for both.
type Pool struct {
	n       int
	workers []*worker
	mu      sync.Mutex // one For at a time; nested or concurrent calls run inline
	pending atomic.Int32
	waiting atomic.Int32  // 1 while the caller is blocked on done
	done    chan struct{} // wakes a blocked caller
	closed  atomic.Bool
	spin    time.Duration
	wg      sync.WaitGroup
}

// worker is padded to its own cache lines so the hot seq/state words of
// different workers never share a line.
type worker struct {
	_      [64]byte
	seq    atomic.Uint32 // bumped by the caller for each job
	parked atomic.Int32  // 1 while blocked on wake
	fn     func(lo, hi int)
	lo, hi int
	wake   chan struct{}
	_      [64]byte
}

// NewPool starts n workers (n <= 0 means runtime.NumCPU()); the calling
// goroutine of For counts as one of them.
func NewPool(n int) *Pool {
	if n <= 0 {
		n = runtime.NumCPU()
	}
	p := &Pool{n: n, spin: 500 * time.Microsecond, done: make(chan struct{}, 1)}
	for i := 1; i < n; i++ {
		w := &worker{wake: make(chan struct{}, 1)}
		p.workers = append(p.workers, w)
		p.wg.Add(1)
		go p.run(w)
	}
	return p
}

func (p *Pool) run(w *worker) {
	defer p.wg.Done()
	// Not w.seq.Load(): the first job may be posted before this goroutine
	// starts running.
	var last uint32
	for {
		// Spin for new work, then park.
		deadline := time.Now().Add(p.spin)
		for spins := 0; w.seq.Load() == last; spins++ {
			if p.closed.Load() {
				return
			}
			if spins&255 == 255 && time.Now().After(deadline) {
				w.parked.Store(1)
				if w.seq.Load() == last && !p.closed.Load() {
					<-w.wake
				}
				w.parked.Store(0)
				deadline = time.Now().Add(p.spin)
			}
			spinPause()
		}
		last = w.seq.Load()
		w.fn(w.lo, w.hi)
		w.fn = nil
		if p.pending.Add(-1) == 0 && p.waiting.Load() == 1 {
			select {
			case p.done <- struct{}{}:
			default:
			}
		}
	}
}

// Threads is the number of threads the pool runs loops on.
func (p *Pool) Threads() int {
	if p == nil {
		return 1
	}
	return p.n
}

// For runs fn over [0, n) split into at most Threads() contiguous ranges,
// each at least grain long, and returns when all have finished. The calling
// goroutine takes the first range. A nil pool runs fn(0, n) inline, and so
// does a call made while the pool is busy (from inside fn, or from another
// goroutine), so For never deadlocks.
func (p *Pool) For(n, grain int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	if grain < 1 {
		grain = 1
	}
	parts := p.Threads()
	if m := (n + grain - 1) / grain; m < parts {
		parts = m
	}
	if parts <= 1 || p.closed.Load() || !p.mu.TryLock() {
		fn(0, n)
		return
	}
	defer p.mu.Unlock()
	chunk := (n + parts - 1) / parts
	var used int32
	for i := 1; i < parts; i++ {
		lo, hi := i*chunk, min((i+1)*chunk, n)
		if lo >= hi {
			break
		}
		used++
		p.pending.Add(1)
		w := p.workers[i-1]
		w.fn, w.lo, w.hi = fn, lo, hi
		w.seq.Add(1)
		if w.parked.Load() == 1 {
			select {
			case w.wake <- struct{}{}:
			default:
			}
		}
	}
	fn(0, min(chunk, n))
	// Spin for the others (their ranges finish within microseconds of
	// ours when the machine is free), then block so that, when it has
	// fewer free CPUs than threads, the OS can run the workers on this CPU
	// instead of watching the caller spin. A stale token on done only
	// costs one more trip around the loop.
	if p.pending.Load() == 0 {
		return
	}
	deadline := time.Now().Add(p.spin)
	for spins := 0; p.pending.Load() != 0; spins++ {
		if spins&15 == 15 && time.Now().After(deadline) {
			p.waiting.Store(1)
			for p.pending.Load() != 0 {
				<-p.done
			}
			p.waiting.Store(0)
			return
		}
		spinPause()
	}
}

// Close stops the workers. The pool must not be used afterwards.
func (p *Pool) Close() {
	if p == nil || p.closed.Swap(true) {
		return
	}
	for _, w := range p.workers {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
	p.wg.Wait()
}
