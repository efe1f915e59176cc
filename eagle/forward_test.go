package eagle

import (
	"math"
	"testing"

	"pagoda/kernels"
	"pagoda/train"
)

func randomDraft(t *testing.T, seed uint64) *Draft {
	t.Helper()
	m, p := openStories(t)
	d, err := newDraft(ShapeOf(&m.Config, 0), m, p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	d.init(seed)
	rng := train.NewRNG(seed + 1)
	for i := range d.Params {
		d.Params[i] += float32(0.05 * rng.Normal())
	}
	return d
}

func maxDiff(a, b []float32) float64 {
	var m float64
	for i := range a {
		m = math.Max(m, math.Abs(float64(a[i]-b[i])))
	}
	return m
}

// fillInputs writes random [e; f] rows.
func fillInputs(xin []float32, rng *train.RNG) {
	for i := range xin {
		xin[i] = float32(rng.Normal())
	}
}

// TestForwardConsistency: decoding one row at a time against the draft's
// KV cache gives the full causal pass's outputs, and a tree of rows
// expanded in one masked pass gives, at every node, what running its path
// alone as a chain after the cache gives.
func TestForwardConsistency(t *testing.T) {
	d := randomDraft(t, 11)
	s := d.Shape
	dd, kvd := s.D, s.KVHeads*s.HeadDim
	rng := train.NewRNG(4)
	const T = 9
	var full pass
	full.size(s, T)
	fillInputs(full.xin, rng)
	pos, par := make([]int32, T), make([]int32, T)
	for i := range T {
		pos[i], par[i] = int32(i), int32(i-1)
	}
	d.forward(&full, &d.w, pos, nil, par, nil, nil, full.k, full.v, 0)

	ck, cv := make([]float32, T*kvd), make([]float32, T*kvd)
	tk, tv := make([]float32, kvd), make([]float32, kvd)
	var one pass
	for j := range T {
		one.size(s, 1)
		copy(one.xin, full.xin[j*2*dd:(j+1)*2*dd])
		d.forward(&one, &d.w, pos[j:j+1], []int32{int32(j)}, []int32{-1}, ck, cv, tk, tv, 0)
		copy(ck[j*kvd:], tk)
		copy(cv[j*kvd:], tv)
		if md := maxDiff(one.out[:dd], full.out[j*dd:(j+1)*dd]); md > 1e-4 {
			t.Errorf("row %d: incremental decode differs from the full pass by %g", j, md)
		}
	}

	// A tree after the first L rows: A, B children of the root; C, D of A;
	// E of C.
	const L = 5
	tpar := []int32{-1, -1, 0, 0, 2}
	depth := []int32{1, 1, 2, 2, 3}
	n := len(tpar)
	var tree pass
	tree.size(s, n)
	fillInputs(tree.xin, rng)
	tpos, tctx := make([]int32, n), make([]int32, n)
	for i := range n {
		tpos[i], tctx[i] = int32(L)+depth[i]-1, L
	}
	ttk, ttv := make([]float32, n*kvd), make([]float32, n*kvd)
	d.forward(&tree, &d.w, tpos, tctx, tpar, ck, cv, ttk, ttv, 0)
	for i := range n {
		var path []int
		for r := i; r >= 0; r = int(tpar[r]) {
			path = append([]int{r}, path...)
		}
		var ch pass
		ch.size(s, len(path))
		cpos, cctx, cpar := make([]int32, len(path)), make([]int32, len(path)), make([]int32, len(path))
		for k, r := range path {
			copy(ch.xin[k*2*dd:(k+1)*2*dd], tree.xin[r*2*dd:(r+1)*2*dd])
			cpos[k], cctx[k], cpar[k] = tpos[r], L, int32(k-1)
		}
		ak, av := make([]float32, len(path)*kvd), make([]float32, len(path)*kvd)
		d.forward(&ch, &d.w, cpos, cctx, cpar, ck, cv, ak, av, 0)
		last := len(path) - 1
		if md := maxDiff(ch.out[last*dd:(last+1)*dd], tree.out[i*dd:(i+1)*dd]); md > 1e-4 {
			t.Errorf("tree node %d: masked expansion differs from its path run alone by %g", i, md)
		}
	}
}

// TestRoPEMatchesTarget: the draft rotates as the target's kernels do.
func TestRoPEMatchesTarget(t *testing.T) {
	d := randomDraft(t, 2)
	hd := d.Shape.HeadDim
	x := make([]float32, hd)
	for i := range x {
		x[i] = float32(i) - 3.5
	}
	y := append([]float32(nil), x...)
	d.rope(y, 37, false)
	z := append([]float32(nil), x...)
	ropeRef(z, 37, d.freqs, d.neox)
	if md := maxDiff(y, z); md > 1e-5 {
		t.Fatalf("draft RoPE differs from kernels.RoPERef by %g", md)
	}
	d.rope(y, 37, true)
	if md := maxDiff(y, x); md > 1e-5 {
		t.Fatalf("inverse RoPE does not undo it (%g)", md)
	}
}

func ropeRef(x []float32, pos int, freqs []float32, neox bool) { kernels.RoPERef(x, pos, freqs, neox) }
