package kernels

import (
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
				var calls atomic.Int32
				p.For(n, grain, func(lo, hi int) {
					calls.Add(1)
					for i := lo; i < hi; i++ {
						atomic.AddInt32(&hits[i], 1)
					}
				})
				for i, h := range hits {
					if h != 1 {
						t.Fatalf("threads=%d n=%d grain=%d: index %d run %d times", threads, n, grain, i, h)
					}
				}
				if int(calls.Load()) > threads {
					t.Fatalf("threads=%d n=%d: %d ranges", threads, n, calls.Load())
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
