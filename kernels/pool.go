package kernels

import (
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Pool is a persistent set of worker goroutines for data-parallel loops.
//
// Spawning goroutines per matrix-vector product costs more than the work on
// small models (a decode matvec is ~10–100 µs), so the workers live as long
// as the pool, and after each job they spin for a while before parking:
// the next matmul of a forward pass arrives within microseconds to a few
// hundred of them, and waking a parked goroutine costs tens of
// microseconds (at 100 µs of spin a TinyLlama Q4_0 decode step on 2
// threads spent half its time parking and waking).
//
// Work is not split statically. Each loop is a job whose index range the
// caller and the workers claim piece by piece from a shared counter
// (guided self-scheduling: a quarter of the remainder per thread, down to
// a floor), so when the OS deschedules a thread — other processes sharing
// the cores — the threads still running take over the unclaimed work
// instead of waiting for the descheduled one's fixed share. The caller
// waits only for pieces already claimed, spins briefly and then blocks so
// that a descheduled worker can get the CPU it is waiting on.
type Pool struct {
	n       int
	workers []*worker
	mu      sync.Mutex // one For at a time; nested or concurrent calls run inline
	seq     atomic.Uint32
	job     atomic.Pointer[job]
	waiting atomic.Int32  // 1 while the caller is blocked on done
	done    chan struct{} // wakes a blocked caller
	closed  atomic.Bool
	spin    time.Duration // a worker's spin for the next job
	wait    time.Duration // the caller's spin for claimed pieces
	wg      sync.WaitGroup
}

// worker is padded to its own cache lines so that its parked word never
// shares a line with another worker's.
type worker struct {
	_      [64]byte
	parked atomic.Int32 // 1 while blocked on wake
	wake   chan struct{}
	id     int // its span in a job; the caller's is 0
	_      [64]byte
}

// job is one For call. A fresh one per call means a worker that wakes late
// and loads a finished job finds nothing left to claim.
//
// The index range is cut into one span per thread. A thread claims pieces
// from the front of its own span first, so in a quiet machine each thread
// reads one forward stream of weights and the prefetchers (the hardware's
// and the kernels' software prefetch, which runs past the end of a piece)
// stay ahead of it from piece to piece. A thread whose span is used up
// takes half of what is left of another's from its back end: a
// descheduled thread holds up only the piece it is running.
type job struct {
	left  atomic.Int64 // indexes not yet finished
	_     [56]byte
	spans []span
	fn    func(lo, hi int)
	grain int64
	floor int64 // smallest piece a thread claims from its own span, a multiple of grain
	spare [4]span
}

// span is the unclaimed part [lo, hi) of one thread's share, packed as
// lo<<32 | hi so that the owner (taking from lo) and a thief (taking from
// hi) claim with one compare-and-swap; a span on its own cache line keeps
// owners' claims from contending.
type span struct {
	r atomic.Uint64
	_ [56]byte
}

func (s *span) bounds() (v uint64, lo, hi int64) {
	v = s.r.Load()
	return v, int64(v >> 32), int64(v & 0xffffffff)
}

func (s *span) set(lo, hi int64) { s.r.Store(uint64(lo)<<32 | uint64(hi)) }

// claimFront takes a piece from the front of the span: a quarter of what is
// left, rounded up to grain, but at least floor.
func (s *span) claimFront(grain, floor int64) (lo, hi int64, ok bool) {
	for {
		v, lo, hi := s.bounds()
		if lo >= hi {
			return 0, 0, false
		}
		c := max(floor, ((hi-lo+3)/4+grain-1)/grain*grain)
		e := min(lo+c, hi)
		if s.r.CompareAndSwap(v, uint64(e)<<32|uint64(hi)) {
			return lo, e, true
		}
	}
}

// claimBack takes half of what is left of the span, rounded up to grain,
// from its back end. The front stays grain-aligned because the back end is
// either the span's end or an earlier thief's grain-aligned start.
func (s *span) claimBack(grain int64) (lo, hi int64, ok bool) {
	for {
		v, lo, hi := s.bounds()
		if lo >= hi {
			return 0, 0, false
		}
		c := ((hi-lo+1)/2 + grain - 1) / grain * grain
		b := max(lo, hi-c)
		if b > lo {
			b = lo + (b-lo)/grain*grain
		}
		if s.r.CompareAndSwap(v, uint64(lo)<<32|uint64(b)) {
			return b, hi, true
		}
	}
}

// preempted is a gap in a worker's spin loop long enough to mean the OS
// ran something else on its CPU: the machine is oversubscribed, and a
// worker that keeps spinning only burns slices the caller needs.
const preempted = 200 * time.Microsecond

// NewPool starts n workers (n <= 0 means runtime.NumCPU()); the calling
// goroutine of For counts as one of them.
func NewPool(n int) *Pool {
	if n <= 0 {
		n = runtime.NumCPU()
	}
	p := &Pool{n: n, spin: 500 * time.Microsecond, wait: 100 * time.Microsecond, done: make(chan struct{}, 1)}
	for i := 1; i < n; i++ {
		w := &worker{wake: make(chan struct{}, 1), id: i}
		p.workers = append(p.workers, w)
		p.wg.Add(1)
		go p.run(w)
	}
	return p
}

func (p *Pool) run(w *worker) {
	defer p.wg.Done()
	// Not p.seq.Load(): the first job may be posted before this goroutine
	// starts running.
	var last uint32
	for {
		for p.seq.Load() == last {
			if p.closed.Load() {
				return
			}
			p.idle(w, last)
		}
		last = p.seq.Load()
		if j := p.job.Load(); j != nil {
			p.work(j, w.id)
		}
	}
}

// idle spins until the job sequence moves past last, the pool closes, or
// the spin runs out or is preempted, and then parks until woken.
func (p *Pool) idle(w *worker, last uint32) {
	start := time.Now()
	prev := start
	for spins := 1; p.seq.Load() == last && !p.closed.Load(); spins++ {
		if spins&255 == 0 {
			now := time.Now()
			if now.Sub(start) > p.spin || now.Sub(prev) > preempted {
				break
			}
			prev = now
		}
		spinPause()
	}
	if p.seq.Load() != last || p.closed.Load() {
		return
	}
	w.parked.Store(1)
	if p.seq.Load() == last && !p.closed.Load() {
		<-w.wake
	}
	w.parked.Store(0)
}

// work runs pieces of j until none is left: first from the span of thread
// id (the caller is 0; a worker past the job's spans has none), then from
// the other spans' back ends.
func (p *Pool) work(j *job, id int) {
	if id < len(j.spans) {
		s := &j.spans[id]
		for {
			lo, hi, ok := s.claimFront(j.grain, j.floor)
			if !ok {
				break
			}
			p.run1(j, lo, hi)
		}
	}
	for k := 1; k <= len(j.spans); k++ {
		s := &j.spans[(id+k)%len(j.spans)]
		for {
			lo, hi, ok := s.claimBack(j.grain)
			if !ok {
				break
			}
			p.run1(j, lo, hi)
		}
	}
}

func (p *Pool) run1(j *job, lo, hi int64) {
	j.fn(int(lo), int(hi))
	if j.left.Add(lo-hi) == 0 && p.waiting.Load() == 1 {
		select {
		case p.done <- struct{}{}:
		default:
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

// For runs fn over [0, n) in disjoint ranges that cover it, each a
// multiple of grain long but for the last, and returns when all have
// finished; the calling goroutine runs ranges too. A nil pool runs
// fn(0, n) inline, and so does a call made while the pool is busy (from
// inside fn, or from another goroutine), so For never deadlocks.
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
	if n > math.MaxUint32 {
		// Spans pack their bounds in 32 bits; no loop here comes near.
		for lo := 0; lo < n; lo += 1 << 30 {
			hi := min(n, lo+1<<30)
			p.mu.Unlock()
			p.For(hi-lo, grain, func(a, b int) { fn(lo+a, lo+b) })
			p.mu.Lock()
		}
		return
	}
	g := int64(grain)
	// The floor keeps a piece worth its claim (about 16 pieces a thread);
	// an owner's claims take a quarter of what is left of its span, so a
	// descheduled thread holds at most an eighth of the loop when two
	// threads share it.
	floor := (int64(n)/int64(16*parts) + g - 1) / g * g
	j := &job{fn: fn, grain: g, floor: max(g, floor)}
	j.spans = j.spare[:0]
	if parts > len(j.spare) {
		j.spans = make([]span, 0, parts)
	}
	j.spans = j.spans[:parts]
	units := (int64(n) + g - 1) / g
	for i := range j.spans {
		lo := min(int64(n), int64(i)*units/int64(parts)*g)
		hi := min(int64(n), int64(i+1)*units/int64(parts)*g)
		j.spans[i].set(lo, hi)
	}
	j.left.Store(int64(n))
	p.job.Store(j)
	p.seq.Add(1)
	for _, w := range p.workers[:parts-1] {
		if w.parked.Load() == 1 {
			select {
			case w.wake <- struct{}{}:
			default:
			}
		}
	}
	p.work(j, 0)
	p.finish(j)
}

// finish waits for the pieces other threads claimed: a short spin (they
// end within microseconds of ours when the machine is free), then a block
// so that, when the machine has fewer free CPUs than threads, the OS can
// run the worker we wait for on this CPU. A stale token on done only
// costs one more trip around the loop.
func (p *Pool) finish(j *job) {
	if j.left.Load() == 0 {
		return
	}
	start := time.Now()
	for spins := 1; j.left.Load() != 0; spins++ {
		if spins&15 == 0 && time.Since(start) > p.wait {
			p.waiting.Store(1)
			for j.left.Load() != 0 {
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
