package cluster

import (
	"testing"

	"pagoda/ring"
)

// TestZigzagOwner: the coordinator's owner of each row is the rank whose
// ring.Zigzag share holds it, for every length up to 300 over 2 to 6
// ranks (short steps leave ranks without rows).
func TestZigzagOwner(t *testing.T) {
	for P := 2; P <= 6; P++ {
		for T := 1; T <= 300; T++ {
			want := make([]int, T)
			for i := range want {
				want[i] = -1
			}
			for r := range P {
				for _, run := range ring.Zigzag(T, P, r) {
					for i := run[0]; i < run[1]; i++ {
						if want[i] >= 0 {
							t.Fatalf("T=%d P=%d: row %d in ranks %d and %d", T, P, i, want[i], r)
						}
						want[i] = r
					}
				}
			}
			for i, w := range want {
				if got := zigzagOwner(i, T, P); got != w {
					t.Fatalf("T=%d P=%d: row %d owned by rank %d, want %d", T, P, i, got, w)
				}
			}
		}
	}
}
