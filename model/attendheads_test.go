package model

import (
	"sync"
	"testing"

	"pagoda/kernels"
)

// headCache records which (row, KV head) pairs AttendHeads computed and
// writes each query head's output from its own inputs, so a head attended
// twice, never, or into the wrong rows shows.
type headCache struct {
	mu       sync.Mutex
	seen     map[[2]int]int
	parallel bool
	attends  int
}

func (c *headCache) Begin(*Batch) error                   { return nil }
func (c *headCache) Store(int, int, []float32, []float32) {}
func (c *headCache) ParallelAttend() bool                 { return true }
func (c *headCache) HeadParallel(int, int) bool           { return c.parallel }

func (c *headCache) Attend(layer, lo, hi int, q, out []float32, p AttnParams) {
	c.mu.Lock()
	c.attends++
	c.mu.Unlock()
	c.AttendHeads(layer, lo, hi, 0, p.NKVHead, q, out, p)
}

func (c *headCache) AttendHeads(_, lo, hi, kh0, kh1 int, q, out []float32, p AttnParams) {
	g, qd := p.NHead/p.NKVHead, p.NHead*p.HeadDim
	for r := lo; r < hi; r++ {
		for kh := kh0; kh < kh1; kh++ {
			c.mu.Lock()
			c.seen[[2]int{r, kh}]++
			c.mu.Unlock()
			for i := (r-lo)*qd + kh*g*p.HeadDim; i < (r-lo)*qd+(kh+1)*g*p.HeadDim; i++ {
				out[i] = 2 * q[i]
			}
		}
	}
}

// TestAttendSplitsHeads: with fewer attention pieces than threads the
// model attends each piece's KV heads as separate tasks, every head once,
// and falls back to whole pieces when the cache forbids it.
func TestAttendSplitsHeads(t *testing.T) {
	ap := AttnParams{NHead: 8, NKVHead: 4, HeadDim: 4, Scale: 1}
	pool := kernels.NewPool(2)
	defer pool.Close()
	for _, parallel := range []bool{true, false} {
		m := &Model{pool: pool}
		m.buf.pieces = []attnPiece{{0, 1, 10}} // one decode row
		b := &Batch{Tokens: []int32{1}, Pos: []int32{9}, Seq: []int32{0}}
		qd, kvd := ap.NHead*ap.HeadDim, ap.NKVHead*ap.HeadDim
		q, att := make([]float32, qd), make([]float32, qd)
		for i := range q {
			q[i] = float32(i + 1)
		}
		c := &headCache{seen: map[[2]int]int{}, parallel: parallel}
		m.attend(0, b, c, q, make([]float32, kvd), make([]float32, kvd), att, ap)
		for kh := 0; kh < ap.NKVHead; kh++ {
			if c.seen[[2]int{0, kh}] != 1 {
				t.Fatalf("parallel=%v: head %d attended %d times", parallel, kh, c.seen[[2]int{0, kh}])
			}
		}
		for i := range att {
			if att[i] != 2*q[i] {
				t.Fatalf("parallel=%v: out[%d] = %v, want %v", parallel, i, att[i], 2*q[i])
			}
		}
		if want := map[bool]int{true: 0, false: 1}[parallel]; c.attends != want {
			t.Fatalf("parallel=%v: %d whole-piece Attend calls, want %d", parallel, c.attends, want)
		}
	}
}
