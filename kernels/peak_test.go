package kernels

import (
	"testing"
	"time"
)

// TestInt8Peak: the probe runs on every thread and reports a rate within
// what a core can do (VPDPBUSD: 64 multiply-adds, at most two a cycle at
// no more than 6 GHz), or refuses on a set without it.
func TestInt8Peak(t *testing.T) {
	p := NewPool(2)
	defer p.Close()
	for _, o := range isaSets {
		r, err := o.Int8Peak(p, 50*time.Millisecond)
		if o.peak.loop == nil {
			if err == nil {
				t.Errorf("%s: no probe, but no error", o.name)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", o.name, err)
		}
		if hi := 2.0 * 64 * 2 * 6e9; !(r > 1e9 && r < hi) {
			t.Errorf("%s: %.3g multiply-adds/s, want within (1e9, %.3g)", o.name, r, hi)
		}
		t.Logf("%s: %.1f G int8 multiply-adds/s on %d threads", o.name, r/1e9, p.Threads())
	}
}
