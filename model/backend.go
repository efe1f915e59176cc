package model

import (
	"sync"

	"pagoda/arch"
	"pagoda/kernels"
)

// Backend is what the layer code computes with, a batch at a time: one
// call per matrix product (however many rows), per norm over the batch,
// per attention. The CPU kernels are the first implementation (cpuBackend);
// a GPU backend implements the same calls over device buffers.
type Backend interface {
	// MatMul writes out (rows × l.W.Rows) = x (rows × l.W.Cols) · Wᵀ,
	// adding l's bias (on one rank of a row-parallel layer) and adapter.
	// It does not reduce: the layer code calls AllReduce on a row-parallel
	// layer's output.
	MatMul(l *Linear, x, out []float32, rows int)
	// MatMulN is MatMul for linears that share the input (q/k/v,
	// gate/up), in one pass over it.
	MatMulN(ls []*Linear, x []float32, outs [][]float32, rows int)
	// RMSNorm normalises each of the rows of x (width len(w)) into out.
	RMSNorm(out, x, w []float32, rows int, eps float32)
	// RoPE rotates each row of x (rows of heads × hd values) at its
	// position pos[row].
	RoPE(x []float32, pos []int32, heads, hd int, freqs []float32, neox bool)
	// Attend stores layer li's k and v rows in the KV storage and writes
	// every row's attention output to att.
	Attend(li int, b *Batch, kv KVCache, q, k, v, att []float32, ap AttnParams)
	// AllReduce sums x over the ranks of the tensor-parallel group, in
	// place; the identity on one process.
	AllReduce(x []float32)
	// AllGather concatenates, per row, every rank's columns of part
	// (rows × its width) into full (rows × the sum of the widths), rank
	// order; a copy on one process.
	AllGather(part, full []float32, rows int)
}

// Collective is a tensor-parallel group's exchange as one rank sees it:
// the in-process LocalGroup, or one over a wire. Every rank calls each
// operation in the same order.
type Collective interface {
	AllReduce(rank int, x []float32)
	AllGather(rank int, part, full []float32, rows int)
}

// cpuBackend runs the kernels on the model's pool. It holds one rank's
// view of the group; group is nil on one process.
type cpuBackend struct {
	m     *Model
	ops   *kernels.Ops
	pool  *kernels.Pool
	group Collective
	rank  int
	// ws and tmp are scratch, reused across calls (Forward runs one step
	// at a time).
	ws  []*kernels.Matrix
	tmp []float32
}

func (c *cpuBackend) MatMul(l *Linear, x, out []float32, rows int) {
	c.ops.MatMul(c.pool, l.W, x, out, rows)
	c.finish(l, x, out, rows)
}

func (c *cpuBackend) MatMulN(ls []*Linear, x []float32, outs [][]float32, rows int) {
	c.ws = c.ws[:0]
	for _, l := range ls {
		c.ws = append(c.ws, l.W)
	}
	c.ops.MatMulN(c.pool, c.ws, x, outs, rows)
	for i, l := range ls {
		c.finish(l, x, outs[i], rows)
	}
}

// finish adds the bias and the adapter's term to a product.
func (c *cpuBackend) finish(l *Linear, x, out []float32, rows int) {
	n := l.W.Rows
	if l.Bias != nil && (l.Shard.Axis != arch.Row || l.Shard.Rank == 0) {
		for r := 0; r < rows; r++ {
			addTo(out[r*n:(r+1)*n], l.Bias)
		}
	}
	if a := l.LoRA; a != nil {
		// Two thin products: t = x·Aᵀ (rows × r), out += Scale · t·Bᵀ.
		k := a.A.Rows
		c.tmp = grow(c.tmp, rows*(k+n))
		t, d := c.tmp[:rows*k], c.tmp[rows*k:]
		c.ops.MatMul(c.pool, a.A, x, t, rows)
		c.ops.MatMul(c.pool, a.B, t, d, rows)
		for i, v := range d {
			out[i] += a.Scale * v
		}
	}
}

func (c *cpuBackend) RMSNorm(out, x, w []float32, rows int, eps float32) {
	d := len(w)
	for i := 0; i < rows; i++ {
		c.ops.RMSNorm(out[i*d:(i+1)*d], x[i*d:(i+1)*d], w, eps)
	}
}

func (c *cpuBackend) RoPE(x []float32, pos []int32, heads, hd int, freqs []float32, neox bool) {
	w := heads * hd
	for i, p := range pos {
		for h := 0; h < heads; h++ {
			c.ops.RoPE(x[i*w+h*hd:i*w+(h+1)*hd], int(p), freqs, neox)
		}
	}
}

func (c *cpuBackend) Attend(li int, b *Batch, kv KVCache, q, k, v, att []float32, ap AttnParams) {
	c.m.attend(li, b, kv, q, k, v, att, ap)
}

func (c *cpuBackend) AllReduce(x []float32) {
	if c.group != nil {
		c.group.AllReduce(c.rank, x)
	}
}

func (c *cpuBackend) AllGather(part, full []float32, rows int) {
	if c.group != nil {
		c.group.AllGather(c.rank, part, full, rows)
		return
	}
	copy(full, part)
}

// LocalGroup is a Collective for ranks that are goroutines of one
// process (tests, and a single machine's workers before a wire exists).
// Each operation is a rendezvous: every rank posts its buffer, each then
// computes the result from all of them in rank order (so every rank gets
// the same bits), and none leaves before all have read.
type LocalGroup struct {
	n    int
	mu   sync.Mutex
	cond *sync.Cond
	bufs [][]float32
	gen  uint64
	in   int // ranks posted in this generation
	out  int // ranks done reading in this generation
}

// NewLocalGroup is a group of n in-process ranks.
func NewLocalGroup(n int) *LocalGroup {
	g := &LocalGroup{n: n, bufs: make([][]float32, n)}
	g.cond = sync.NewCond(&g.mu)
	return g
}

// Ranks is the group's size.
func (g *LocalGroup) Ranks() int { return g.n }

// exchange posts x as rank's buffer, waits for every rank, runs read over
// all the buffers, and waits until every rank has read before returning
// (so no rank overwrites its buffer while another still reads it).
func (g *LocalGroup) exchange(rank int, x []float32, read func(bufs [][]float32)) {
	g.mu.Lock()
	gen := g.gen
	g.bufs[rank] = x
	g.in++
	if g.in == g.n {
		g.cond.Broadcast()
	}
	for g.in < g.n && g.gen == gen {
		g.cond.Wait()
	}
	bufs := append([][]float32(nil), g.bufs...)
	g.mu.Unlock()

	read(bufs)

	g.mu.Lock()
	g.out++
	if g.out == g.n {
		g.in, g.out = 0, 0
		g.gen++
		g.cond.Broadcast()
	}
	for g.gen == gen {
		g.cond.Wait()
	}
	g.mu.Unlock()
}

// AllReduce sums x over the ranks in place.
func (g *LocalGroup) AllReduce(rank int, x []float32) {
	sum := make([]float32, len(x))
	g.exchange(rank, x, func(bufs [][]float32) {
		for _, b := range bufs {
			for i, v := range b[:len(sum)] {
				sum[i] += v
			}
		}
	})
	copy(x, sum)
}

// AllGather concatenates the ranks' columns of part, per row, into full.
func (g *LocalGroup) AllGather(rank int, part, full []float32, rows int) {
	g.exchange(rank, part, func(bufs [][]float32) {
		if rows == 0 {
			return
		}
		width := 0
		for _, b := range bufs {
			width += len(b) / rows
		}
		off := 0
		for _, b := range bufs {
			w := len(b) / rows
			for r := 0; r < rows; r++ {
				copy(full[r*width+off:r*width+off+w], b[r*w:(r+1)*w])
			}
			off += w
		}
	})
}
