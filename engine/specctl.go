package engine

import (
	"fmt"
	"math"
	"time"
)

// SpecControl tunes the controller that decides, from realised
// throughput, whether the engine speculates at all at the current load.
// The cost model (spec.Cost) times schedule→update only and picks γ per
// sequence; whatever else an iteration of the engine costs (streaming,
// detokenizing, the HTTP side sharing the cores) it cannot see, and at 8
// in flight it speculated when plain decoding was faster. So for each
// load bucket (decoding sequences in the step: 1, 2, 3-4, 5-8, ...) the
// controller measures committed output tokens per wall-clock second of
// whole iterations, in windows of consecutive steps run with speculation
// (the "spec" arm: the cost model's γ per sequence) or without (the
// "plain" arm: no proposer call, no drafts), and exploits the arm that
// realises more, probing the other one window in ProbeEvery. It compares
// the arms by the ratio of adjacent windows (a probe and the windows
// either side of it), so a slow drift in what the machine gives the
// engine (other jobs, the request mix) cancels. Speculation must beat
// plain by Margin to be chosen. Which arm runs changes only how
// many positions one pass verifies, never which tokens come out.
type SpecControl struct {
	Off        bool          // no controller: the cost model alone decides (as before)
	Window     int           // measured steps per window; 0 = 24
	ProbeEvery int           // one window in ProbeEvery runs the other arm; 0 = 8
	Margin     float64       // spec must realise this fraction more than plain; 0 = 0.03
	Stale      time.Duration // a bucket unseen this long explores afresh; 0 = 30s
}

const (
	armPlain = 0
	armSpec  = 1
	// ctlMinWindows: windows each arm gets in a bucket before the
	// controller exploits one (they alternate, spec first).
	ctlMinWindows = 2
	// ctlBeta is the weight of a window's rate in its arm's running
	// estimate, and of a pair's ratio in the ratio's.
	ctlBeta = 0.35
	// ctlBuckets: 1, 2, 3-4, 5-8, 9-16, 17-32, 33-64, 65+ decoding sequences.
	ctlBuckets = 8
)

var armNames = [2]string{"plain", "spec"}

// ctlBucket returns the load bucket of a step decoding n sequences (n ≥ 1).
func ctlBucket(n int) int {
	b := 0
	for n > 1 && b < ctlBuckets-1 {
		n = (n + 1) / 2
		b++
	}
	return b
}

// ctlBucketName is bucket b's label: "1", "2", "3-4", ..., "65+".
func ctlBucketName(b int) string {
	switch {
	case b == 0:
		return "1"
	case b == 1:
		return "2"
	case b == ctlBuckets-1:
		return fmt.Sprintf("%d+", 1<<(b-1)+1)
	}
	return fmt.Sprintf("%d-%d", 1<<(b-1)+1, 1<<b)
}

// ctlWin is a completed window: its number, arm and rate.
type ctlWin struct {
	n    uint64
	arm  int
	rate float64
}

// specCtl is the controller; it keeps no clock of its own (its callers
// pass the time), so it can be tested with a fake one.
type specCtl struct {
	cfg SpecControl
	b   [ctlBuckets]ctlState

	steps  [2]uint64 // measured steps by arm
	probes uint64    // measured steps of probe windows

	// The engine's side (ctlBegin, ctlEnd): the step being measured, and
	// the step counts already added to the metrics.
	cur ctlStep
	pub [3]uint64
}

type ctlState struct {
	rate [2]float64 // running estimate of tokens/s by arm
	wins [2]int     // windows measured by arm (since the last reset)
	// ratio is the running estimate of log(spec/plain), each sample a
	// window against the geometric mean of its neighbours of the other
	// arm (a probe and the windows either side); samples is how many it
	// has seen. The bracketing cancels what drifts slowly (other jobs on
	// the cores, the mix of requests), linearly in the log.
	ratio   float64
	samples int
	prev    [2]ctlWin // the last two completed windows, newest first
	arm     int       // the arm exploited
	win     int       // the arm of the window in progress
	probe   bool      // the window in progress is a probe
	left    int       // measured steps left in it (0: none in progress)
	tok     float64   // its tokens and seconds so far
	sec     float64
	n       uint64    // windows started: the probes' clock
	last    time.Time // when a step last asked for this bucket
}

func newSpecCtl(c SpecControl) *specCtl {
	if c.Window <= 0 {
		c.Window = 24
	}
	if c.ProbeEvery <= 1 {
		c.ProbeEvery = 8
	}
	if c.Margin <= 0 {
		c.Margin = 0.03
	}
	if c.Stale <= 0 {
		c.Stale = 30 * time.Second
	}
	ctl := &specCtl{cfg: c}
	for i := range ctl.b {
		ctl.b[i].arm = armSpec
	}
	return ctl
}

// choose is the arm a step decoding n sequences runs at time now.
func (c *specCtl) choose(n int, now time.Time) int {
	s := &c.b[ctlBucket(n)]
	if !s.last.IsZero() && now.Sub(s.last) > c.cfg.Stale {
		// The load comes back after a long time: what was measured then
		// may not hold now.
		*s = ctlState{arm: armSpec}
	}
	s.last = now
	if s.left > 0 {
		return s.win
	}
	s.n++
	s.probe = false
	switch {
	case s.wins[armSpec] < ctlMinWindows && s.wins[armSpec] <= s.wins[armPlain]:
		s.win = armSpec
	case s.wins[armPlain] < ctlMinWindows:
		s.win = armPlain
	case s.n%uint64(c.cfg.ProbeEvery) == 0:
		s.win, s.probe = 1-s.arm, true
	default:
		s.win = s.arm
	}
	s.left = c.cfg.Window
	s.tok, s.sec = 0, 0
	return s.win
}

// observe records a step that decoded n sequences with arm: it committed
// tokens output tokens in seconds of wall clock, the whole iteration of
// the engine (proposing, the pass, sampling, streaming, the loop's
// bookkeeping) included.
func (c *specCtl) observe(n, arm, tokens int, seconds float64) {
	s := &c.b[ctlBucket(n)]
	if s.left <= 0 || arm != s.win || seconds <= 0 {
		return // a window was reset under the step
	}
	c.steps[arm]++
	if s.probe {
		c.probes++
	}
	s.tok += float64(tokens)
	s.sec += seconds
	if s.left--; s.left > 0 {
		return
	}
	r := s.tok / s.sec
	if s.wins[arm] == 0 {
		s.rate[arm] = r
	} else {
		s.rate[arm] += ctlBeta * (r - s.rate[arm])
	}
	s.wins[arm]++
	w, p := ctlWin{s.n, arm, r}, s.prev
	if p[0].n+1 == w.n && p[1].n+2 == w.n && p[1].arm == arm && p[0].arm != arm && r > 0 && p[0].rate > 0 && p[1].rate > 0 {
		lr := math.Log(p[0].rate) - (math.Log(p[1].rate)+math.Log(r))/2
		if p[0].arm == armPlain {
			lr = -lr
		}
		if s.samples == 0 {
			s.ratio = lr
		} else {
			s.ratio += ctlBeta * (lr - s.ratio)
		}
		s.samples++
	}
	s.prev = [2]ctlWin{w, p[0]}
	if s.wins[armSpec] < ctlMinWindows || s.wins[armPlain] < ctlMinWindows || s.samples == 0 {
		return
	}
	// Hysteresis: speculation starts above plain·(1+2·Margin) and stops
	// below plain·(1+Margin), so noise around the threshold does not flip
	// the arm every window.
	enter := 1 + c.cfg.Margin
	if s.arm == armPlain {
		enter += c.cfg.Margin
	}
	if s.ratio > math.Log(enter) {
		s.arm = armSpec
	} else {
		s.arm = armPlain
	}
}

// ctlStep is the step whose wall time the engine measures for the
// controller: it began at t0 with gen0 output tokens committed.
type ctlStep struct {
	ok   bool // a step is being measured
	done bool // it ran to its update, and the scheduler was not left idle
	n    int  // decoding sequences
	arm  int
	t0   time.Time
	gen0 uint64
}

// ctlBegin closes the measurement of the previous step, now that the
// iteration it began has ended, and returns the arm of the step that
// begins, for n decoding sequences (mixed: it also carries prefill, which
// costs time the arm does not decide, so it is not measured).
func (e *Engine) ctlBegin(n int, mixed bool) int {
	c := e.ctl
	now := time.Now()
	if p := &c.cur; p.ok && p.done {
		c.observe(p.n, p.arm, int(e.st.GenerationTokens-p.gen0), now.Sub(p.t0).Seconds())
	}
	c.cur = ctlStep{}
	if mixed || n == 0 {
		return armSpec
	}
	arm := c.choose(n, now)
	c.cur = ctlStep{ok: true, n: n, arm: arm, t0: now, gen0: e.st.GenerationTokens}
	return arm
}

// ctlEnd marks the step being measured as run to its update; an
// iteration after which the loop waits for work is not measured.
func (e *Engine) ctlEnd() {
	c := e.ctl
	if c == nil {
		return
	}
	if c.cur.ok {
		c.cur.done = !e.sch.idle()
	}
	e.ctlMetrics()
}

// ctlMetrics publishes the controller's state.
func (e *Engine) ctlMetrics() {
	m, c := e.m, e.ctl
	for i := range c.b {
		m.specCtlArm[i].Set(float64(c.b[i].arm))
		for a := range 2 {
			m.specCtlRate[i][a].Set(c.b[i].rate[a])
		}
	}
	for a := range 2 {
		m.specCtlSteps[a].Add(float64(c.steps[a] - c.pub[a]))
		c.pub[a] = c.steps[a]
	}
	m.specCtlProbes.Add(float64(c.probes - c.pub[2]))
	c.pub[2] = c.probes
}

// load is what the controller keys its buckets on: the running sequences
// that decode this step, and whether the step is mixed, also forwarding
// prompt tokens (a prompt in flight, or a waiting one with room to start).
func (sc *scheduler) load() (decodes int, mixed bool) {
	for _, s := range sc.running {
		if s.finished {
			continue
		}
		if len(s.tokens)-s.numComputed == 1 && len(s.tokens) > len(s.req.r.Prompt) {
			decodes++
		} else {
			mixed = true
		}
	}
	if len(sc.waiting) > 0 && len(sc.running) < sc.cfg.MaxNumSeqs {
		mixed = true
	}
	return decodes, mixed
}
