package speed

import (
	"fmt"
	"sort"
	"time"

	"pagoda/kernels"
)

// Bandwidth is a memory read-bandwidth measurement: the ceiling a
// bandwidth-bound decode step can reach on this machine with these threads.
type Bandwidth struct {
	Threads int     `json:"threads"`
	Bytes   int64   `json:"bytes"`    // size of the buffer streamed per pass
	GBps    float64 `json:"gb_per_s"` // best pass
	Median  float64 `json:"median_gb_per_s"`
}

// probeChunk is the stretch of the big buffer dotted against a small
// vector that stays in L1, so each pass reads the buffer from memory once
// and little else.
const probeChunk = 4096

// ReadBandwidth streams a buffer of the given size (rounded to whole
// chunks; it should dwarf the last-level cache) through the SIMD dot
// kernel on every thread of p, reps times, and reports the best and median
// rates, as STREAM does. Decode reads weights the same way: once per token,
// in order, split across the threads.
func ReadBandwidth(p *kernels.Pool, ops *kernels.Ops, size int64, reps int) (*Bandwidth, error) {
	rp, err := NewReadProbe(size)
	if err != nil {
		return nil, err
	}
	return rp.Run(p, ops, reps)
}

// ReadProbe is ReadBandwidth's buffer, kept for probes repeated in one
// run (bench's paired probes): the buffer is allocated and touched once.
type ReadProbe struct {
	buf, y, sums []float32
}

// NewReadProbe allocates and touches a probe buffer of size bytes
// (rounded to whole chunks).
func NewReadProbe(size int64) (*ReadProbe, error) {
	n := int(size / 4 / probeChunk)
	if n < 1 {
		return nil, fmt.Errorf("speed: bandwidth probe needs at least %d bytes", probeChunk*4)
	}
	rp := &ReadProbe{buf: make([]float32, n*probeChunk), y: make([]float32, probeChunk), sums: make([]float32, n)}
	for i := range rp.buf {
		rp.buf[i] = float32(i&1023) * 1e-3 // touch every page before timing
	}
	for i := range rp.y {
		rp.y[i] = 1
	}
	return rp, nil
}

// Run streams the buffer reps times (after a warm-up pass) on every
// thread of p and reports the best and median rates.
func (rp *ReadProbe) Run(p *kernels.Pool, ops *kernels.Ops, reps int) (*Bandwidth, error) {
	if reps < 1 {
		return nil, fmt.Errorf("speed: bandwidth probe needs at least one repetition")
	}
	buf, y, sums := rp.buf, rp.y, rp.sums
	n := len(sums)
	var rates []float64
	for r := 0; r <= reps; r++ {
		start := time.Now()
		p.For(n, 16, func(lo, hi int) {
			for c := lo; c < hi; c++ {
				sums[c] = ops.DotF32(buf[c*probeChunk:(c+1)*probeChunk], y)
			}
		})
		d := time.Since(start)
		if r > 0 { // the first pass warms the threads and the TLB
			rates = append(rates, float64(len(buf))*4/d.Seconds()/1e9)
		}
	}
	var sink float32
	for _, s := range sums {
		sink += s
	}
	if sink != sink { // keep the sums live; a NaN would mean a broken kernel
		return nil, fmt.Errorf("speed: bandwidth probe computed NaN")
	}
	b := &Bandwidth{Threads: p.Threads(), Bytes: int64(len(buf)) * 4}
	_, _, _, b.GBps = stats(rates)
	b.Median = median(rates)
	return b, nil
}

func median(x []float64) float64 {
	s := append([]float64(nil), x...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Int8Peak is the machine's int8 multiply-add rate with these threads
// (kernels.Ops.Int8Peak): the ceiling of the quantized matrix products,
// which prefill and batched decode approach.
type Int8Peak struct {
	Threads int     `json:"threads"`
	MACps   float64 `json:"macs_per_s"` // best of the repetitions
	Median  float64 `json:"median_macs_per_s"`
}

// MeasureInt8Peak runs the probe reps times for d each on every thread
// of p.
func MeasureInt8Peak(p *kernels.Pool, ops *kernels.Ops, d time.Duration, reps int) (*Int8Peak, error) {
	var rates []float64
	for range max(reps, 1) {
		r, err := ops.Int8Peak(p, d)
		if err != nil {
			return nil, err
		}
		rates = append(rates, r)
	}
	pk := &Int8Peak{Threads: p.Threads(), Median: median(rates)}
	_, _, _, pk.MACps = stats(rates)
	return pk, nil
}
