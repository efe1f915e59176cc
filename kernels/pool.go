package kernels

import (
	"runtime"
	"sync"
)

// Pool is a persistent set of worker goroutines for data-parallel loops.
// Spawning goroutines per matrix-vector product costs more than the work on
// small models, so the workers live as long as the pool.
type Pool struct {
	n    int
	work chan task
	wg   sync.WaitGroup
}

type task struct {
	fn     func(lo, hi int)
	lo, hi int
	done   *sync.WaitGroup
}

// NewPool starts n workers (n <= 0 means runtime.NumCPU()).
func NewPool(n int) *Pool {
	if n <= 0 {
		n = runtime.NumCPU()
	}
	p := &Pool{n: n, work: make(chan task, n)}
	for i := 1; i < n; i++ {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			for t := range p.work {
				t.fn(t.lo, t.hi)
				t.done.Done()
			}
		}()
	}
	return p
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
// goroutine takes the first range. A nil pool runs fn(0, n) inline.
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
	if parts <= 1 {
		fn(0, n)
		return
	}
	var done sync.WaitGroup
	done.Add(parts - 1)
	chunk := (n + parts - 1) / parts
	for i := 1; i < parts; i++ {
		lo, hi := i*chunk, min((i+1)*chunk, n)
		if lo >= hi {
			done.Done()
			continue
		}
		p.work <- task{fn, lo, hi, &done}
	}
	fn(0, min(chunk, n))
	done.Wait()
}

// Close stops the workers.
func (p *Pool) Close() {
	if p == nil {
		return
	}
	close(p.work)
	p.wg.Wait()
}
