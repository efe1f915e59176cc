package kernels

import (
	"math/rand/v2"
	"testing"
	"unsafe"

	"pagoda/quant"
)

// TestHugeWeights: a packed layout over 2 MB lands on a 2 MB boundary with
// its exact length, and products through it match, bit for bit, those
// through an ordinary allocation of the same layout.
func TestHugeWeights(t *testing.T) {
	var o *Ops
	for _, s := range isaSets {
		if s.packed {
			o = s
			break
		}
	}
	if o == nil {
		t.Skip("no packed layout on this CPU")
	}
	r := rand.New(rand.NewPCG(3, 4))
	pool := NewPool(2)
	defer pool.Close()
	// 1040 rows of Q8_0: 65 groups of 64 tiles, ~2.3 MB, not a multiple
	// of 2 MB.
	const rows, cols = 1040, 2048
	a, _ := randMatrix(t, r, quant.Q8_0, rows, cols)
	b := *a
	o.Prepack(pool, a)
	pa := a.packedFor(o.avx2)
	// b gets the same layout copied into an ordinary allocation.
	pb := *pack(pool, &b, o.avx2)
	pb.data = append(make([]byte, 0, len(pb.data)), pb.data...)
	b.pk[packSlot(o.avx2)] = unsafe.Pointer(&pb)
	if &pa.data[0] == &pb.data[0] {
		t.Fatal("both matrices share one packed layout")
	}
	if len(pa.data) != pa.groups*pa.groupBytes || len(pa.data) < hugePage {
		t.Fatalf("packed %d bytes, want %d (≥ %d)", len(pa.data), pa.groups*pa.groupBytes, hugePage)
	}
	if addr := uintptr(unsafe.Pointer(&pa.data[0])); addr%hugePage != 0 {
		t.Errorf("packed data at %#x, not 2 MB aligned", addr)
	}
	for _, batch := range []int{1, 3} {
		x := randF32(r, batch*cols)
		oa, ob := make([]float32, batch*rows), make([]float32, batch*rows)
		o.MatMul(pool, a, x, oa, batch)
		o.MatMul(pool, &b, x, ob, batch)
		for i := range oa {
			if oa[i] != ob[i] {
				t.Fatalf("b%d out[%d] = %g with huge pages, %g without", batch, i, oa[i], ob[i])
			}
		}
	}
}
