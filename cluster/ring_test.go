package cluster

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
)

// TestMeshRingAllReduce: an all-reduce of a large buffer among three or
// four ranks goes around the ring (reduce-scatter, all-gather): every
// rank ends with the same bits, the sum is the float64 sum of the ranks'
// values (as they travel, rounded to the wire form) within rounding, each
// rank sends 2(N−1)/N of the buffer plus the steps' headers instead of
// (N−1) buffers, and a size that does not split evenly works.
func TestMeshRingAllReduce(t *testing.T) {
	for _, tc := range []struct {
		n    int
		wire WireDType
		size int
	}{
		{3, WireF32, 40000},
		{4, WireF32, 65539},
		{4, WireF16, 70001},
		{3, WireBF16, 50000},
	} {
		t.Run(fmt.Sprintf("%d/%s/%d", tc.n, tc.wire, tc.size), func(t *testing.T) {
			wires := make([]WireDType, tc.n)
			for i := range wires {
				wires[i] = tc.wire
			}
			ms := meshes(t, wires)
			rng := rand.New(rand.NewPCG(uint64(tc.n), uint64(tc.size)))
			xs := make([][]float32, tc.n)
			want := make([]float64, tc.size)
			for r := range xs {
				xs[r] = make([]float32, tc.size)
				for i := range xs[r] {
					xs[r][i] = float32(rng.NormFloat64())
				}
				rounded := append([]float32(nil), xs[r]...)
				ms[r].wire.round(rounded)
				for i, v := range rounded {
					want[i] += float64(v)
				}
			}
			var wg sync.WaitGroup
			for r, m := range ms {
				wg.Go(func() { m.AllReduce(0, xs[r]) })
			}
			wg.Wait()
			for r, m := range ms {
				if err := m.Err(); err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
			}
			tol := 1e-5
			if tc.wire != WireF32 {
				tol = 0.05 // partial sums rounded at each hop
			}
			for i, w := range want {
				for r := range xs {
					if math.Float32bits(xs[r][i]) != math.Float32bits(xs[0][i]) {
						t.Fatalf("value %d: rank %d has %v, rank 0 %v", i, r, xs[r][i], xs[0][i])
					}
				}
				if d := math.Abs(float64(xs[0][i]) - w); d > tol*max(1, math.Abs(w)) {
					t.Fatalf("value %d: %v, want %v", i, xs[0][i], w)
				}
			}
			// Each rank sends N−1 chunks in each phase: 2(N−1)/N of the
			// buffer, and a 10-byte header per step.
			for r, m := range ms {
				payload := 0
				for s := 0; s < tc.n-1; s++ {
					payload += tc.size*((r-s+2*tc.n)%tc.n+1)/tc.n - tc.size*((r-s+2*tc.n)%tc.n)/tc.n
					payload += tc.size*((r+1-s+2*tc.n)%tc.n+1)/tc.n - tc.size*((r+1-s+2*tc.n)%tc.n)/tc.n
				}
				want := int64(payload*tc.wire.Size() + 2*(tc.n-1)*10)
				if got := m.Sent(); got != want {
					t.Errorf("rank %d sent %d bytes, want %d (the mesh would send %d)", r, got, want, (tc.n-1)*(tc.size*tc.wire.Size()+10))
				}
			}
		})
	}
}
