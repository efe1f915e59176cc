package ring

import (
	"math"
	"math/rand/v2"
	"testing"

	"pagoda/kernels"
)

// problem is one sequence's attention: T positions from Start, each with a
// query row and a key/value row.
type problem struct {
	s     Shape
	start int
	q     []float32 // T × QDim
	k, v  []float32 // T × KVDim
	pos   []int32
}

func newProblem(r *rand.Rand, s Shape, start, T int) *problem {
	p := &problem{s: s, start: start, q: make([]float32, T*s.QDim()), k: make([]float32, T*s.KVDim()), v: make([]float32, T*s.KVDim()), pos: make([]int32, T)}
	// Spread scores over a few units so the softmax is neither flat nor
	// one-hot, and so the running max changes between blocks.
	for i := range p.q {
		p.q[i] = float32(r.NormFloat64()) * 1.5
	}
	for i := range p.k {
		p.k[i] = float32(r.NormFloat64())
		p.v[i] = float32(r.NormFloat64())
	}
	for i := range p.pos {
		p.pos[i] = int32(start + i)
	}
	return p
}

// reference is causal softmax attention in float64, written out plainly.
func (p *problem) reference() []float64 {
	rows := make([]int, len(p.pos))
	for i := range rows {
		rows[i] = i
	}
	return p.referenceRows(rows)
}

// referenceRows is reference for the query rows listed only (the others
// are left zero), for sequences too long to check every row in float64.
func (p *problem) referenceRows(rows []int) []float64 {
	s := p.s
	hd, qd, kvd, group := s.HeadDim, s.QDim(), s.KVDim(), s.NHead/s.NKVHead
	out := make([]float64, len(p.q))
	for _, i := range rows {
		pos := p.pos[i]
		for h := 0; h < s.NHead; h++ {
			kh := h / group
			var w []float64
			var ts []int
			m := math.Inf(-1)
			for t := range p.pos {
				tp := p.start + t
				if tp > int(pos) || (s.Window > 0 && tp <= int(pos)-s.Window) {
					continue
				}
				var d float64
				for j := 0; j < hd; j++ {
					d += float64(p.q[i*qd+h*hd+j]) * float64(p.k[t*kvd+kh*hd+j])
				}
				d *= float64(s.Scale)
				w, ts = append(w, d), append(ts, t)
				m = max(m, d)
			}
			var sum float64
			for j := range w {
				w[j] = math.Exp(w[j] - m)
				sum += w[j]
			}
			for j, t := range ts {
				for c := 0; c < hd; c++ {
					out[i*qd+h*hd+c] += w[j] / sum * float64(p.v[t*kvd+kh*hd+c])
				}
			}
		}
	}
	return out
}

// cuts splits n into pieces uneven parts (some may be empty when n is small).
func cuts(r *rand.Rand, n, pieces int) []int {
	c := []int{0}
	for i := 1; i < pieces; i++ {
		c = append(c, r.IntN(n+1))
	}
	c = append(c, n)
	for i := 1; i < len(c); i++ { // sort: few elements
		for j := i; j > 0 && c[j] < c[j-1]; j-- {
			c[j], c[j-1] = c[j-1], c[j]
		}
	}
	return c
}

func (p *problem) block(lo, hi int) Block {
	kvd := p.s.KVDim()
	return Block{Start: p.start + lo, K: p.k[lo*kvd : hi*kvd], V: p.v[lo*kvd : hi*kvd]}
}

// maxErr is the largest |got − want| relative to the largest |want| (at
// least 1).
func maxErr(got []float32, want []float64) float64 {
	var e, scale float64 = 0, 1
	for i, w := range want {
		e = max(e, math.Abs(float64(got[i])-w))
		scale = max(scale, math.Abs(w))
	}
	return e / scale
}

var shapes = []Shape{
	{NHead: 1, NKVHead: 1, HeadDim: 8},
	{NHead: 4, NKVHead: 2, HeadDim: 8},
	{NHead: 8, NKVHead: 2, HeadDim: 32},
	{NHead: 6, NKVHead: 1, HeadDim: 64},
	{NHead: 4, NKVHead: 4, HeadDim: 64, Window: 13},
	{NHead: 8, NKVHead: 2, HeadDim: 32, Window: 40},
}

// TestPartialMatchesReference splits keys into P = 1..4 uneven blocks and
// queries into uneven chunks; each chunk's partials, built per block and
// merged in a scrambled order, or accumulated block by block, give the
// float64 reference.
func TestPartialMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	worst := 0.0
	for _, ops := range []*kernels.Ops{kernels.Best(), kernels.Generic()} {
		for si, s := range shapes {
			s.Scale = float32(1 / math.Sqrt(float64(s.HeadDim)))
			for _, T := range []int{1, 7, 61, 150} {
				p := newProblem(r, s, r.IntN(3)*5, T)
				want := p.reference()
				for P := 1; P <= 4; P++ {
					kc, qc := cuts(r, T, P), cuts(r, T, 1+r.IntN(3))
					got := make([]float32, len(p.q))
					for c := 0; c+1 < len(qc); c++ {
						lo, hi := qc[c], qc[c+1]
						if lo == hi {
							continue
						}
						qd := s.QDim()
						q, pos := p.q[lo*qd:hi*qd], p.pos[lo:hi]
						// Merged: one partial per key block, merged last to first.
						var acc Partial
						acc.Reset(s, hi-lo)
						for b := P - 1; b >= 0; b-- {
							var one Partial
							one.Reset(s, hi-lo)
							one.Attend(ops, q, pos, p.block(kc[b], kc[b+1]))
							if err := acc.Merge(&one); err != nil {
								t.Fatal(err)
							}
						}
						acc.Out(got[lo*qd : hi*qd])
						// Streamed: blocks attended into one partial.
						var run Partial
						run.Reset(s, hi-lo)
						for b := 0; b < P; b++ {
							run.Attend(ops, q, pos, p.block(kc[b], kc[b+1]))
						}
						streamed := make([]float32, (hi-lo)*qd)
						run.Out(streamed)
						if e := maxErr(streamed, want[lo*qd:hi*qd]); e > 1e-5 {
							t.Fatalf("%s shape %d T=%d P=%d: streamed error %.3g", ops.Name(), si, T, P, e)
						}
					}
					e := maxErr(got, want)
					worst = max(worst, e)
					if e > 1e-5 {
						t.Fatalf("%s shape %d %+v T=%d P=%d cuts %v: max error %.3g", ops.Name(), si, s, T, P, kc, e)
					}
				}
			}
		}
	}
	t.Logf("worst error relative to max |reference|: %.3g", worst)
}

// TestPartialMergeRefusesOtherShape: merging partials of different queries
// is a programming error reported, not mixed numbers.
func TestPartialMergeRefusesOtherShape(t *testing.T) {
	var a, b Partial
	a.Reset(Shape{NHead: 2, NKVHead: 1, HeadDim: 8, Scale: 1}, 3)
	b.Reset(Shape{NHead: 2, NKVHead: 1, HeadDim: 8, Scale: 1}, 4)
	if err := a.Merge(&b); err == nil {
		t.Fatal("merged partials of 3 and 4 rows")
	}
	if err := (Shape{NHead: 3, NKVHead: 2, HeadDim: 8}).Check(); err == nil {
		t.Fatal("accepted 3 heads over 2 kv heads")
	}
}
