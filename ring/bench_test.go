package ring_test

import (
	"math/rand/v2"
	"sync"
	"syscall"
	"testing"
	"time"

	"pagoda/ring"
)

// BenchmarkAttention4k times one layer's causal attention over a 4096-token
// prompt (8 heads over 2 KV heads of 64): the flat KV cache in one
// goroutine, Ring Attention with P=2 ranks over TCP on 127.0.0.1
// (contiguous halves, and the zigzag split), and the partial math alone. All ranks share this
// machine's cores, so it measures overheads, not a speed-up; cpu-s/op is
// the process's CPU time per operation (all goroutines), which a loaded
// machine disturbs less than the wall time.
func BenchmarkAttention4k(b *testing.B) {
	s := ring.Shape{NHead: 8, NKVHead: 2, HeadDim: 64, Scale: 0.125}
	const T = 4096
	p := ring.NewProblem(rand.New(rand.NewPCG(9, 10)), s, 0, T)
	qd := s.QDim()
	b.Run("flat-1", func(b *testing.B) {
		defer cpuPerOp(b)()
		for b.Loop() {
			flatAttention(b, s, p.Q(), p.K(), p.V(), T)
		}
	})
	b.Run("ring-P2", func(b *testing.B) {
		links := startRing(b, 2, time.Minute)
		rings := []*ring.Ring{ring.New(links[0], nil), ring.New(links[1], nil)}
		out := make([]float32, T*qd)
		defer cpuPerOp(b)()
		for b.Loop() {
			var wg sync.WaitGroup
			for rk := range 2 {
				lo, hi := rk*T/2, (rk+1)*T/2
				wg.Go(func() {
					if err := rings[rk].Prefill(s, p.Q()[lo*qd:hi*qd], p.Pos()[lo:hi], p.Block(lo, hi), out[lo*qd:hi*qd]); err != nil {
						b.Error(err)
					}
				})
			}
			wg.Wait()
		}
	})
	b.Run("ring-P2-zigzag", func(b *testing.B) {
		links := startRing(b, 2, time.Minute)
		rings := []*ring.Ring{ring.New(links[0], nil), ring.New(links[1], nil)}
		type rank struct {
			q   []float32
			pos []int32
			own []ring.Block
			out []float32
		}
		var rs [2]rank
		for rk := range rs {
			for _, c := range ring.Zigzag(T, 2, rk) {
				rs[rk].q = append(rs[rk].q, p.Q()[c[0]*qd:c[1]*qd]...)
				rs[rk].pos = append(rs[rk].pos, p.Pos()[c[0]:c[1]]...)
				rs[rk].own = append(rs[rk].own, p.Block(c[0], c[1]))
			}
			rs[rk].out = make([]float32, len(rs[rk].q))
		}
		defer cpuPerOp(b)()
		for b.Loop() {
			var wg sync.WaitGroup
			for rk := range 2 {
				wg.Go(func() {
					if err := rings[rk].PrefillBlocks(s, rs[rk].q, rs[rk].pos, rs[rk].own, rs[rk].out); err != nil {
						b.Error(err)
					}
				})
			}
			wg.Wait()
		}
	})
	b.Run("partial-1", func(b *testing.B) {
		// The ring's arithmetic in one goroutine, no transport: both
		// blocks into one partial.
		var part ring.Partial
		out := make([]float32, T*qd)
		defer cpuPerOp(b)()
		for b.Loop() {
			part.Reset(s, T)
			part.Attend(nil, p.Q(), p.Pos(), p.Block(0, T/2))
			part.Attend(nil, p.Q(), p.Pos(), p.Block(T/2, T))
			part.Out(out)
		}
	})
}

// cpuPerOp reports the process's CPU seconds per operation from now until
// the returned function runs.
func cpuPerOp(b *testing.B) func() {
	cpu := func() float64 {
		var ru syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
	}
	start := cpu()
	return func() { b.ReportMetric((cpu()-start)/float64(b.N), "cpu-s/op") }
}
