package kernels

import (
	"fmt"
	"sync/atomic"
	"time"
)

// Int8Peak measures the int8 multiply-add rate of every thread of p
// running nothing but independent VPDPBUSD instructions for about d: the
// compute limit of the quantized matrix products (each weight of a Q4_0
// or Q8_0 matrix is one u8×s8 multiply-add per activation row), against
// which prefill and batched decode are measured. It is an error on a set
// without the VNNI kernels.
func (o *Ops) Int8Peak(p *Pool, d time.Duration) (macsPerSec float64, err error) {
	if o.peak.loop == nil {
		return 0, fmt.Errorf("kernels: no int8 peak probe for the %s set", o.name)
	}
	const iters = 1 << 14 // 16M multiply-adds, a few ms a call
	n := p.Threads()
	var calls atomic.Int64
	var sink atomic.Int32
	start := time.Now()
	stop := start.Add(d)
	p.For(n, 1, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			for time.Now().Before(stop) {
				sink.Add(o.peak.loop(iters))
				calls.Add(1)
			}
		}
	})
	el := time.Since(start)
	if sink.Load() != int32(calls.Load()*iters*64) {
		return 0, fmt.Errorf("kernels: int8 peak probe summed %d over %d calls", sink.Load(), calls.Load())
	}
	return float64(calls.Load()) * iters * 1024 / el.Seconds(), nil
}
