package engine

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"pagoda/spec"
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
//
// For a proposer of trees (spec.TreeShaper: Medusa, EAGLE) the spec arm
// is a ladder of tree budgets (treeLadder: the full tree, half and a
// quarter of its nodes, chains), each an arm of its own: exploring a
// load, the controller climbs the ladder from its cheapest rung, each
// against plain, for as long as the rungs get better; it exploits the
// arm that realises the most tokens/s, and its probes visit plain and
// the rungs next to the exploited one, so the tree shrinks as the load
// makes verifying nodes dear and grows back when it gets cheap.
type SpecControl struct {
	Off        bool          // no controller: the cost model alone decides (as before)
	Window     int           // measured steps per window; 0 = 24
	ProbeEvery int           // one window in ProbeEvery runs the other arm; 0 = 8
	Margin     float64       // spec must realise this fraction more than plain; 0 = 0.03
	Stale      time.Duration // a bucket unseen this long explores afresh; 0 = 30s
}

const (
	armPlain = 0
	armSpec  = 1 // speculation; with a tree ladder its first, largest rung
	// ctlRungs is the most rungs a tree ladder has; arm armSpec+i runs
	// rung i.
	ctlRungs = 5
	ctlArms  = 1 + ctlRungs
	// ctlMinWindows: windows each arm gets in a bucket before the
	// controller exploits one (they alternate, spec first).
	ctlMinWindows = 2
	// ctlBeta is the weight of a window's rate in its arm's running
	// estimate, and of a pair's ratio in the ratio's.
	ctlBeta = 0.35
	// ctlBuckets: 1, 2, 3-4, 5-8, 9-16, 17-32, 33-64, 65+ decoding sequences.
	ctlBuckets = 8
)

// treeBudget is a rung of the tree ladder: the most nodes, children per
// node and path length a proposal may have.
type treeBudget struct{ nodes, topK, depth int }

// treeLadder is what the controller chooses from for a proposer whose
// largest tree has nodes nodes, topK children per node and depth levels:
// the full tree; half its nodes at half the width; a quarter of them at
// a quarter of the width, one level shallower; chains (top-1) of the
// full and half depth; dearest first. Verifying a node costs a row of the
// target's pass, and drafting a level costs the proposer a pass over
// topK rows (EAGLE), so which pays depends on the machine and the load,
// and is measured, not modelled. Narrowing a tree with its node count
// keeps the nodes deep: on the KJV model a 4-node tree of top-4 levels
// accepted 2.5 tokens per verification, a 5-node chain 4.1. No rung asks
// for a deeper or wider tree than its nodes can fill.
func treeLadder(nodes, topK, depth int) []treeBudget {
	h := (depth + 1) / 2
	cand := []treeBudget{{nodes, topK, depth}, {nodes / 2, (topK + 1) / 2, depth},
		{nodes / 4, (topK + 3) / 4, max(1, depth-1)}, {min(nodes, depth), 1, depth}, {min(nodes, h), 1, h}}
	var l []treeBudget
	for _, b := range cand {
		b.depth, b.topK = min(b.depth, b.nodes), min(b.topK, b.nodes)
		if b.nodes < 1 || b.depth < 1 || slices.Contains(l, b) {
			continue
		}
		l = append(l, b)
	}
	slices.SortStableFunc(l, func(a, b treeBudget) int {
		return cmp.Or(b.rows()-a.rows(), b.nodes-a.nodes, b.topK-a.topK, b.depth-a.depth)
	})
	return l[:min(len(l), ctlRungs)]
}

// rows is what a rung costs, roughly: the nodes verified plus the rows an
// EAGLE-2 proposal runs (the root and topK per further level). The
// ladder is ordered by it, dearest first, so that neighbouring rungs
// differ a little in cost and the controller can climb it.
func (b treeBudget) rows() int {
	return b.nodes + b.topK*(b.depth-1) + 1
}

// ladderFor is the tree ladder for proposer p drafting at most nodes
// nodes (nil: p drafts chains, or the engine verifies no trees; the
// spec arm is then the cost model's γ per sequence).
func ladderFor(p spec.Proposer, trees bool, nodes int) []treeBudget {
	ts, ok := p.(spec.TreeShaper)
	if !ok || !trees {
		return nil
	}
	k, d := ts.TreeShape()
	if m, ok := p.(interface{ Nodes() int }); ok {
		nodes = min(nodes, m.Nodes())
	}
	if k < 1 || d < 1 || nodes < 1 {
		return nil
	}
	return treeLadder(nodes, k, d)
}

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
	cfg    SpecControl
	ladder []treeBudget // the spec arms' tree budgets (empty: one spec arm)
	arms   int          // plain and the spec arms
	b      [ctlBuckets]ctlState

	steps  [2]uint64       // measured steps, plain and spec
	byArm  [ctlArms]uint64 // measured steps by arm (the spec ones by rung)
	probes uint64          // measured steps of probe windows

	// The engine's side (ctlBegin, ctlEnd): the step being measured, and
	// the step counts already added to the metrics.
	cur ctlStep
	pub [3]uint64
}

type ctlState struct {
	rate [ctlArms]float64 // running estimate of tokens/s by arm
	wins [ctlArms]int     // windows measured by arm (since the last reset)
	// ratio[a] is the running estimate of log(arm a/plain), each sample a
	// window against the geometric mean of its neighbours of another arm
	// (a probe and the windows either side); samples[a] is how many it
	// has seen. The bracketing cancels what drifts slowly (other jobs on
	// the cores, the mix of requests), linearly in the log. Between two
	// spec arms a sample measures one against the other, and is anchored
	// on the other's own estimate against plain.
	ratio   [ctlArms]float64
	samples [ctlArms]int
	probes  uint64 // probe windows started: their rotation
	// Exploration climbs the ladder from its cheapest rung: up is how
	// many rungs above it the rung being explored is, and climbed that
	// the climb has stopped.
	up      int
	climbed bool
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

func newSpecCtl(c SpecControl, ladder []treeBudget) *specCtl {
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
	ctl := &specCtl{cfg: c, ladder: ladder, arms: 1 + max(1, len(ladder))}
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
	case c.exploring(s):
		s.win = c.explore(s)
	case s.n%uint64(c.probeEvery(s)) == 0:
		s.win, s.probe = c.probeArm(s), true
	default:
		s.win = s.arm
	}
	s.left = c.cfg.Window
	s.tok, s.sec = 0, 0
	return s.win
}

// ctlClimbFloor: exploration tries dearer rungs of the ladder only while
// the cheapest realises at least this fraction of plain's tokens/s (the
// probes still look one rung further).
const ctlClimbFloor = 0.8

// exploring reports whether the bucket is still exploring: plain and the
// spec arms together need ctlMinWindows windows each, and the climb up
// the ladder must have stopped.
func (c *specCtl) exploring(s *ctlState) bool {
	spec := 0
	for a := armSpec; a < c.arms; a++ {
		spec += s.wins[a]
	}
	return s.wins[armPlain] < ctlMinWindows || spec < ctlMinWindows || !s.climbed
}

// explore is the arm of the next window while exploring: plain after a
// spec window, else the rung being explored. Each spec window thus sits
// between two plain ones, the bracket its ratio sample needs. Without a
// ladder this alternates spec and plain.
func (c *specCtl) explore(s *ctlState) int {
	if s.n > 1 && s.win != armPlain {
		return armPlain
	}
	return c.arms - 1 - s.up
}

// climb decides, after a sample of the rung being explored, whether
// exploration goes on to the next dearer rung: only while this one is
// not worse than a cheaper one by Margin, and the cheapest is within
// ctlClimbFloor of plain. A load where even the cheapest rung loses
// clearly thus explores no more than the controller without a ladder.
func (c *specCtl) climb(s *ctlState, a int) {
	if s.climbed || a != c.arms-1-s.up || s.samples[a] == 0 {
		return
	}
	worse := a == c.arms-1 && s.ratio[a] < math.Log(ctlClimbFloor)
	for b := a + 1; b < c.arms; b++ {
		worse = worse || s.ratio[a] < s.ratio[b]-math.Log(1+c.cfg.Margin)
	}
	if worse || a == armSpec {
		s.climbed = true
		return
	}
	s.up++
}

// bestSpec is the measured spec arm with the highest ratio to plain
// (armSpec while none is measured).
func (c *specCtl) bestSpec(s *ctlState) int {
	best := -1
	for a := armSpec; a < c.arms; a++ {
		if s.samples[a] > 0 && (best < 0 || s.ratio[a] > s.ratio[best]) {
			best = a
		}
	}
	return max(best, armSpec)
}

// ctlBackoff: while plain is exploited and the best spec arm realises
// less than ctlBackoffBelow of plain's tokens/s, probes come ctlBackoff
// times rarer. Verifying trees at 8 in flight on the KJV model realised
// half of plain, so a probe window costs two plain ones: probing one
// window in ProbeEvery (8) costs about 11% of plain's throughput, and
// the issue asks for never slower than plain there. A load whose spec
// arm is within the threshold keeps probing at the full rate, so a
// change in the machine is seen as soon.
const (
	ctlBackoff      = 4
	ctlBackoffBelow = 0.6
)

// probeEvery is one in how many windows is a probe.
func (c *specCtl) probeEvery(s *ctlState) int {
	if b := c.bestSpec(s); s.arm == armPlain && s.samples[b] > 0 && s.ratio[b] < math.Log(ctlBackoffBelow) {
		return c.cfg.ProbeEvery * ctlBackoff
	}
	return c.cfg.ProbeEvery
}

// probeArm is the arm of a probe window: in turn, the arms next to the
// exploited one on the ladder and plain (when plain is exploited: the
// best spec arm and its neighbours). A far rung is only probed again
// once the arms between have moved towards it, which keeps the probes
// of a long ladder cheap.
func (c *specCtl) probeArm(s *ctlState) int {
	x := s.arm
	var cand [3]int
	k := 0
	if x == armPlain {
		x = c.bestSpec(s)
		cand[k], k = x, k+1
	} else {
		cand[k], k = armPlain, k+1
	}
	if x-1 >= armSpec {
		cand[k], k = x-1, k+1
	}
	if x+1 < c.arms {
		cand[k], k = x+1, k+1
	}
	s.probes++
	return cand[(s.probes-1)%uint64(k)]
}

// sample records lr, the log of a window of arm mid over the geometric
// mean of the windows of arm out either side of it; it returns the arm
// whose ratio it moved (-1: none).
func (s *ctlState) sample(mid, out int, lr float64) int {
	a, v := mid, lr
	switch {
	case out == armPlain:
	case mid == armPlain:
		a, v = out, -lr
	case s.samples[out] > 0:
		v = s.ratio[out] + lr
	default:
		return -1
	}
	if s.samples[a] == 0 {
		s.ratio[a] = v
	} else {
		s.ratio[a] += ctlBeta * (v - s.ratio[a])
	}
	s.samples[a]++
	return a
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
	c.steps[min(arm, armSpec)]++
	c.byArm[arm]++
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
		a := s.sample(p[0].arm, arm, math.Log(p[0].rate)-(math.Log(p[1].rate)+math.Log(r))/2)
		c.climb(s, a)
	}
	s.prev = [2]ctlWin{w, p[0]}
	if !c.exploring(s) {
		c.decide(s)
	}
}

// decide picks the arm to exploit from the ratios. Hysteresis: another
// spec arm must beat the exploited one by Margin, and speculation starts
// above plain·(1+2·Margin) and stops below plain·(1+Margin), so noise
// around a threshold does not flip the arm every window.
func (c *specCtl) decide(s *ctlState) {
	m := math.Log(1 + c.cfg.Margin)
	best := c.bestSpec(s)
	if s.arm != armPlain && s.samples[s.arm] > 0 && s.ratio[best] < s.ratio[s.arm]+m {
		best = s.arm
	}
	enter := 1 + c.cfg.Margin
	if s.arm == armPlain {
		enter += c.cfg.Margin
	}
	if s.ratio[best] > math.Log(enter) {
		s.arm = best
	} else {
		s.arm = armPlain
	}
}

// budget is the tree budget of spec arm arm (zero: no ladder).
func (c *specCtl) budget(arm int) treeBudget {
	if arm < armSpec || arm-armSpec >= len(c.ladder) {
		return treeBudget{}
	}
	return c.ladder[arm-armSpec]
}

// mixedArm is the arm of a step that also forwards prompt tokens (not
// measured). Without a ladder it speculates, and the cost model sizes
// the drafts; with one it is the arm exploited at its load, plain while
// that is still being explored, so that a load where plain pays does
// not draft a tree per decoding sequence in every step that starts a
// request.
func (c *specCtl) mixedArm(n int) int {
	if n == 0 || len(c.ladder) == 0 {
		return armSpec
	}
	s := &c.b[ctlBucket(n)]
	if c.exploring(s) {
		return armPlain
	}
	return s.arm
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
		return c.mixedArm(n)
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
		s := &c.b[i]
		sa := s.arm
		if sa == armPlain {
			sa = c.bestSpec(s)
		}
		m.specCtlArm[i].Set(float64(min(s.arm, armSpec)))
		m.specCtlRate[i][armPlain].Set(s.rate[armPlain])
		m.specCtlRate[i][armSpec].Set(s.rate[sa])
		tb := c.budget(s.arm)
		m.specCtlTree[i][0].Set(float64(tb.nodes))
		m.specCtlTree[i][1].Set(float64(tb.depth))
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
