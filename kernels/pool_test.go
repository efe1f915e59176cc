package kernels

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestPoolFor(t *testing.T) {
	for _, threads := range []int{1, 2, 3, 5} {
		p := NewPool(threads)
		for _, n := range []int{0, 1, 2, 7, 64, 1000} {
			for _, grain := range []int{0, 1, 16, 5000} {
				hits := make([]int32, n)
				var mu sync.Mutex
				var bad string
				p.For(n, grain, func(lo, hi int) {
					g := max(grain, 1)
					if lo < 0 || hi > n || lo >= hi || lo%g != 0 || (hi != n && (hi-lo)%g != 0) {
						mu.Lock()
						bad = fmt.Sprintf("range [%d,%d)", lo, hi)
						mu.Unlock()
					}
					for i := lo; i < hi; i++ {
						atomic.AddInt32(&hits[i], 1)
					}
				})
				if bad != "" {
					t.Fatalf("threads=%d n=%d grain=%d: %s is not a grain-aligned piece", threads, n, grain, bad)
				}
				for i, h := range hits {
					if h != 1 {
						t.Fatalf("threads=%d n=%d grain=%d: index %d run %d times", threads, n, grain, i, h)
					}
				}
			}
		}
		p.Close()
	}
}

// TestPoolNestedAndConcurrent: For from inside For, and from several
// goroutines at once, completes and covers every index (runs inline when the
// pool is busy) — and parked workers wake up.
func TestPoolNestedAndConcurrent(t *testing.T) {
	p := NewPool(2)
	defer p.Close()
	var total atomic.Int64
	p.For(4, 1, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			p.For(10, 1, func(a, b int) { total.Add(int64(b - a)) })
		}
	})
	if total.Load() != 40 {
		t.Fatalf("nested: %d", total.Load())
	}
	var wg sync.WaitGroup
	total.Store(0)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < 200; k++ {
				p.For(100, 1, func(a, b int) { total.Add(int64(b - a)) })
			}
		}()
	}
	wg.Wait()
	if total.Load() != 4*200*100 {
		t.Fatalf("concurrent: %d", total.Load())
	}
	time.Sleep(2 * p.spin) // let the worker park
	var ran atomic.Int32
	p.For(2, 1, func(lo, hi int) { ran.Add(1) })
	if ran.Load() != 2 {
		t.Fatalf("after parking: %d ranges", ran.Load())
	}
}

// BenchmarkPoolFor measures the hand-off latency of an empty parallel loop.
func BenchmarkPoolFor(b *testing.B) {
	p := NewPool(2)
	defer p.Close()
	for b.Loop() {
		p.For(2, 1, func(lo, hi int) {})
	}
}

// TestPoolStalledThread: a thread stuck in its piece (as when the OS
// deschedules it) holds up only that piece; the other thread runs the rest
// of the loop meanwhile, and the stuck piece is at most a quarter of the
// loop per thread.
func TestPoolStalledThread(t *testing.T) {
	p := NewPool(2)
	defer p.Close()
	const n = 1024
	var done, stuck atomic.Int64
	var first atomic.Bool
	othersFinished := false
	p.For(n, 1, func(lo, hi int) {
		if first.CompareAndSwap(false, true) {
			stuck.Store(int64(hi - lo))
			deadline := time.Now().Add(5 * time.Second)
			for done.Load() < n-int64(hi-lo) && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			othersFinished = done.Load() == n-int64(hi-lo)
		}
		done.Add(int64(hi - lo))
	})
	if !othersFinished {
		t.Fatalf("the rest of the loop did not run while one piece was stuck (%d of %d rows done)", done.Load()-stuck.Load(), n-stuck.Load())
	}
	if s := stuck.Load(); s > n/(4*2) {
		t.Fatalf("the stuck piece held %d of %d rows", s, n)
	}
}
