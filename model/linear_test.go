package model

import (
	"math"
	"math/rand"
	"strings"
	"sync"
	"testing"

	"pagoda/arch"
	"pagoda/kernels"
	"pagoda/quant"
)

func randVec(r *rand.Rand, n int, scale float32) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = (r.Float32()*2 - 1) * scale
	}
	return v
}

func testMatrix(t *testing.T, typ quant.Type, w []float32, rows, cols int) *kernels.Matrix {
	t.Helper()
	var b []byte
	var err error
	if typ == quant.F32 {
		return f32Matrix(w, rows, cols)
	}
	b, err = quant.Quantize(typ, w)
	if err != nil {
		t.Fatal(err)
	}
	m, err := kernels.NewMatrix(typ, rows, cols, b)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// closeTo reports the first element of got farther from want than tol
// relative to want's largest magnitude.
func closeTo(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	var scale float64
	for _, v := range want {
		scale = max(scale, math.Abs(float64(v)))
	}
	for i := range want {
		if d := math.Abs(float64(got[i] - want[i])); d > tol*scale || math.IsNaN(float64(got[i])) {
			t.Fatalf("%s: [%d] = %g, want %g (|Δ| %.3g, scale %.3g)", what, i, got[i], want[i], d, scale)
		}
	}
}

// runRanks runs fn for every rank of a fresh LocalGroup, each on its own
// goroutine, as tensor-parallel workers would.
func runRanks(n int, fn func(rank int, be *cpuBackend)) {
	g := NewLocalGroup(n)
	pool := kernels.NewPool(1)
	defer pool.Close()
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			fn(r, &cpuBackend{ops: kernels.Best(), pool: pool, group: g, rank: r})
		}(r)
	}
	wg.Wait()
}

// TestTwoShardToy: a matrix split by rows (column-parallel, outputs
// gathered) and by columns (row-parallel, partial sums all-reduced in
// process) gives the whole matrix's product, bias included once, for F32
// and block-quantized weights.
func TestTwoShardToy(t *testing.T) {
	const out, in, rows, ranks = 48, 256, 3, 2
	r := rand.New(rand.NewSource(1))
	wf, x, bias := randVec(r, out*in, 1), randVec(r, rows*in, 1), randVec(r, out, 1)
	for _, typ := range []quant.Type{quant.F32, quant.Q8_0, quant.Q4_0} {
		w := testMatrix(t, typ, wf, out, in)
		whole := make([]float32, rows*out)
		one := &cpuBackend{ops: kernels.Best(), pool: kernels.NewPool(1)}
		one.MatMul(&Linear{W: w, Bias: bias, Shard: shardOf(arch.Column, out, 0, 1)}, x, whole, rows)
		one.pool.Close()

		// Column-parallel: each rank its output rows and bias rows.
		gathered := make([][]float32, ranks)
		runRanks(ranks, func(rank int, be *cpuBackend) {
			sh := shardOf(arch.Column, out, rank, ranks)
			sw, err := shardMatrix("toy", w, sh)
			if err != nil {
				t.Error(err)
				return
			}
			l := &Linear{W: sw, Bias: bias[sh.Lo:sh.Hi], Shard: sh}
			part := make([]float32, rows*sw.Rows)
			be.MatMul(l, x, part, rows)
			gathered[rank] = make([]float32, rows*out)
			be.AllGather(part, gathered[rank], rows)
		})
		for rank := range gathered {
			closeTo(t, typ.String()+" column-parallel", gathered[rank], whole, 1e-6)
		}

		// Row-parallel: each rank its input columns and the matching
		// slice of x; the bias is added once.
		reduced := make([][]float32, ranks)
		runRanks(ranks, func(rank int, be *cpuBackend) {
			sh := shardOf(arch.Row, in, rank, ranks)
			sw, err := shardMatrix("toy", w, sh)
			if err != nil {
				t.Error(err)
				return
			}
			if sw.Cols != in/ranks || sw.Rows != out {
				t.Errorf("row shard %d×%d", sw.Rows, sw.Cols)
			}
			xs := make([]float32, 0, rows*sw.Cols)
			for i := 0; i < rows; i++ {
				xs = append(xs, x[i*in+sh.Lo:i*in+sh.Hi]...)
			}
			l := &Linear{W: sw, Bias: bias, Shard: sh}
			reduced[rank] = make([]float32, rows*out)
			be.MatMul(l, xs, reduced[rank], rows)
			be.AllReduce(reduced[rank])
		})
		for rank := range reduced {
			closeTo(t, typ.String()+" row-parallel", reduced[rank], whole, 1e-5)
		}
	}
}

// TestShardRefusesSplitBlocks: a column split that would cut a
// quantization block names the tensor and the block size.
func TestShardRefusesSplitBlocks(t *testing.T) {
	r := rand.New(rand.NewSource(2))
	w := testMatrix(t, quant.Q4_K, randVec(r, 4*768, 1), 4, 768)
	if _, err := shardMatrix("blk.0.ffn_down.weight", w, shardOf(arch.Row, 768, 1, 2)); err == nil ||
		!strings.Contains(err.Error(), "blk.0.ffn_down.weight") || !strings.Contains(err.Error(), "256") {
		t.Fatalf("Q4_K split at column 384: %v", err)
	}
	// Whole rows always split.
	if sw, err := shardMatrix("x", w, shardOf(arch.Column, 4, 1, 2)); err != nil || sw.Rows != 2 {
		t.Fatalf("row split: %v", err)
	}
	// The same columns in Q8_0 blocks (32) do split.
	w8 := testMatrix(t, quant.Q8_0, randVec(r, 4*768, 1), 4, 768)
	if _, err := shardMatrix("x", w8, shardOf(arch.Row, 768, 1, 2)); err != nil {
		t.Fatal(err)
	}
}

// TestLoRA: a layer with an F32 adapter computes what the merged weight
// W + scale·B·A does, whole and split both ways across two ranks.
func TestLoRA(t *testing.T) {
	const out, in, rank, rows = 40, 64, 4, 5
	const scale = 0.5
	r := rand.New(rand.NewSource(3))
	w, a, b := randVec(r, out*in, 1), randVec(r, rank*in, 1), randVec(r, out*rank, 1)
	x := randVec(r, rows*in, 1)
	merged := append([]float32(nil), w...)
	for o := 0; o < out; o++ {
		for i := 0; i < in; i++ {
			var s float32
			for k := 0; k < rank; k++ {
				s += b[o*rank+k] * a[k*in+i]
			}
			merged[o*in+i] += scale * s
		}
	}
	be := &cpuBackend{ops: kernels.Best(), pool: kernels.NewPool(1)}
	defer be.pool.Close()
	want := make([]float32, rows*out)
	be.MatMul(&Linear{W: f32Matrix(merged, out, in), Shard: shardOf(arch.Column, out, 0, 1)}, x, want, rows)

	l := &Linear{W: f32Matrix(w, out, in), Shard: shardOf(arch.Column, out, 0, 1)}
	if err := l.Attach(a, b, rank, scale); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, rows*out)
	be.MatMul(l, x, got, rows)
	closeTo(t, "adapter", got, want, 1e-5)
	base := make([]float32, rows*out)
	be.MatMul(&Linear{W: l.W}, x, base, rows)
	var moved bool
	for i := range base {
		moved = moved || math.Abs(float64(base[i]-want[i])) > 1e-3
	}
	if !moved {
		t.Fatal("the adapter changes nothing; the test would not see it missing")
	}
	if err := l.Attach(a[:len(a)-1], b, rank, scale); err == nil {
		t.Fatal("a short A was accepted")
	}

	for _, axis := range []arch.Split{arch.Column, arch.Row} {
		res := make([][]float32, 2)
		runRanks(2, func(rk int, be *cpuBackend) {
			full := out
			if axis == arch.Row {
				full = in
			}
			sh := shardOf(axis, full, rk, 2)
			sw, err := shardMatrix("toy", f32Matrix(w, out, in), sh)
			if err != nil {
				t.Error(err)
				return
			}
			l := &Linear{W: sw, Shard: sh}
			if err := l.Attach(a, b, rank, scale); err != nil {
				t.Error(err)
				return
			}
			xs := x
			if axis == arch.Row {
				xs = nil
				for i := 0; i < rows; i++ {
					xs = append(xs, x[i*in+sh.Lo:i*in+sh.Hi]...)
				}
			}
			part := make([]float32, rows*sw.Rows)
			be.MatMul(l, xs, part, rows)
			res[rk] = make([]float32, rows*out)
			if axis == arch.Row {
				copy(res[rk], part)
				be.AllReduce(res[rk])
			} else {
				be.AllGather(part, res[rk], rows)
			}
		})
		for rk := range res {
			closeTo(t, axis.String()+"-parallel adapter", res[rk], want, 1e-5)
		}
	}
}

// TestBackendRowOps: the batched norm and rope equal the kernels' per-row
// calls they wrap.
func TestBackendRowOps(t *testing.T) {
	const rows, heads, hd = 3, 4, 16
	r := rand.New(rand.NewSource(4))
	ops := kernels.Best()
	be := &cpuBackend{ops: ops}
	x, w := randVec(r, rows*heads*hd, 2), randVec(r, heads*hd, 1)
	got, want := make([]float32, len(x)), make([]float32, len(x))
	be.RMSNorm(got, x, w, rows, 1e-5)
	d := heads * hd
	for i := 0; i < rows; i++ {
		ops.RMSNorm(want[i*d:(i+1)*d], x[i*d:(i+1)*d], w, 1e-5)
	}
	closeTo(t, "rmsnorm", got, want, 0)
	freqs := (&Config{RopeTheta: 10000, RopeDim: hd, HeadDim: hd}).Freqs()
	pos := []int32{0, 7, 300}
	for _, neox := range []bool{false, true} {
		copy(got, x)
		copy(want, x)
		be.RoPE(got, pos, heads, hd, freqs, neox)
		for i, p := range pos {
			for h := 0; h < heads; h++ {
				ops.RoPE(want[i*d+h*hd:i*d+(h+1)*hd], int(p), freqs, neox)
			}
		}
		closeTo(t, "rope", got, want, 0)
	}
}
