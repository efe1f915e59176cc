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
// (a "spec" arm: the cost model's γ per sequence, or a tree budget) or
// without (the "plain" arm: no proposer call, no drafts), and exploits
// the arm that realises more. It compares arms by the ratio of adjacent
// windows (a trial window of another arm between two of the exploited
// one), so a slow drift in what the machine gives the engine (other
// jobs, the request mix) cancels. Which arm runs changes only how many
// positions one pass verifies, never which tokens come out.
//
// Trying an arm that loses costs throughput, and in runs of a thousand
// steps that cost did not pay back (a ladder of trees explored at every
// load made EAGLE ×0.76 of plain at 8 in flight). So a bucket starts on
// plain, and a trial window runs only
//   - when the cost model predicts the arm gains (predict: the measured
//     plain rate of the bucket, the marginal cost of a row of the pass
//     and of a drafted token, and the measured tokens and rows per
//     sequence of the arm's steps; before they are measured, an upper
//     bound), and
//   - while trial windows, all buckets together, stay within Explore of
//     the measured steps (beyond ctlFreeWindows windows to start with).
//
// Unmeasured arms that the model favours are tried first, then measured
// ones at most one window in ProbeEvery; a trial that falls well behind
// the exploited arm ends early. Speculation is exploited only where it
// measured better than plain by Margin and the model does not predict a
// loss.
//
// For a proposer of trees (spec.TreeShaper: Medusa, EAGLE) the spec arm
// is a ladder of tree budgets (treeLadder: the full tree, half and a
// quarter of its nodes, chains), each an arm of its own, so the tree
// shrinks as the load makes verifying nodes dear and grows back when it
// gets cheap.
type SpecControl struct {
	Off        bool          // no controller: the cost model alone decides (as before)
	Window     int           // measured steps per window; 0 = 24
	ProbeEvery int           // a measured arm is tried again at most one window in ProbeEvery; 0 = 8
	Margin     float64       // spec must realise this fraction more than plain; 0 = 0.03
	Stale      time.Duration // a bucket unseen this long starts afresh; 0 = 30s
	Explore    float64       // most fraction of measured steps in trial windows; 0 = 0.03
}

const (
	armPlain = 0
	armSpec  = 1 // speculation; with a tree ladder its first, largest rung
	// ctlRungs is the most rungs a tree ladder has; arm armSpec+i runs
	// rung i.
	ctlRungs = 5
	ctlArms  = 1 + ctlRungs
	// ctlBeta is the weight of a window's rate in its arm's running
	// estimate, and of a pair's ratio in the ratio's.
	ctlBeta = 0.35
	// ctlBuckets: 1, 2, 3-4, 5-8, 9-16, 17-32, 33-64, 65+ decoding sequences.
	ctlBuckets = 8
	// ctlFreeWindows: trial windows a fresh controller may run before
	// the Explore fraction of its steps allows them, so that a short run
	// can still find speculation that pays.
	ctlFreeWindows = 1
	// ctlQuickExit: a trial window whose rate, after a quarter of it,
	// is below this fraction of the exploited arm's ends there.
	ctlQuickExit = 0.7
	// ctlAccDecay: the weight a step's tokens and rows per sequence keep
	// per later measured step (of any arm) in its arm's estimate; ctlPrior
	// is the weight, in sequences, of the guess the estimate is blended
	// with (shape).
	ctlAccDecay = 0.998
	ctlPrior    = 8
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
// differ a little in cost: the exploited rung's neighbours are the ones
// its trials revisit.
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

// ctlWin is a completed window: its number, arm, rate and duration.
type ctlWin struct {
	n         uint64
	arm       int
	rate, sec float64
}

// specCtl is the controller; it keeps no clock of its own (its callers
// pass the time, the cost model's figures and what each step did), so it
// can be tested with a fake one.
type specCtl struct {
	cfg      SpecControl
	ladder   []treeBudget // the spec arms' tree budgets (empty: one spec arm)
	arms     int          // plain and the spec arms
	maxDraft int          // drafts per sequence of the spec arm without a ladder
	b        [ctlBuckets]ctlState

	steps  [2]uint64       // measured steps, plain and spec
	byArm  [ctlArms]uint64 // measured steps by arm (the spec ones by rung)
	probes uint64          // measured steps of trial windows: the exploration spent
	total  uint64          // measured steps
	// trialSec and totalSec are the same in seconds: a trial step of a
	// tree at 8 in flight costs 2–4 plain ones, so the budget holds in
	// time as well as in steps.
	trialSec, totalSec float64

	// The cost model's figures (setCost): seconds per row of the
	// target's pass; costOK once the fit exists.
	rowSec float64
	costOK bool
	// dSec, dTok: decayed sums over measured steps of the proposer's
	// seconds and the tokens it drafted.
	dSec, dTok float64
	// ungated: try every arm whatever the model predicts (tests).
	ungated bool
	// acc[a]: decayed sums over arm a's steps of the sequences decoded,
	// the tokens they committed and the rows they forwarded.
	acc [ctlArms]struct{ seqs, tok, rows float64 }

	// The engine's side (ctlBegin, ctlEnd): the step being measured, and
	// the step counts already added to the metrics, and the arm the
	// engine's last step ran.
	cur     ctlStep
	pub     [3]uint64
	lastArm int
}

type ctlState struct {
	rate [ctlArms]float64 // running estimate of tokens/s by arm
	wins [ctlArms]int     // windows measured by arm (since the last reset)
	// ratio[a] is the running estimate of log(arm a/plain), each sample a
	// window against the geometric mean of its neighbours of another arm
	// (a trial and the windows either side); samples[a] is how many it
	// has seen. The bracketing cancels what drifts slowly (other jobs on
	// the cores, the mix of requests), linearly in the log. Between two
	// spec arms a sample measures one against the other, and is anchored
	// on the other's own estimate against plain.
	ratio   [ctlArms]float64
	samples [ctlArms]int
	probes  uint64    // trials of measured arms: their rotation
	prev    [2]ctlWin // the last two completed windows, newest first
	arm     int       // the arm exploited (the zero state: plain)
	win     int       // the arm of the window in progress
	probe   bool      // the window in progress is a trial
	left    int       // measured steps left in it (0: none in progress)
	steps   int       // measured steps in it so far
	tok     float64   // its tokens and seconds so far
	sec     float64
	featAt  int       // collect features from this many steps left on (featAt)
	n       uint64    // windows started: the probes' clock
	last    time.Time // when a step last asked for this bucket
}

func newSpecCtl(c SpecControl, ladder []treeBudget, maxDraft int) *specCtl {
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
	if c.Explore <= 0 {
		c.Explore = 0.03
	}
	return &specCtl{cfg: c, ladder: ladder, arms: 1 + max(1, len(ladder)), maxDraft: max(1, maxDraft)}
}

// choose is the arm a step decoding n sequences runs at time now.
func (c *specCtl) choose(n int, now time.Time) int {
	s := &c.b[ctlBucket(n)]
	if !s.last.IsZero() && now.Sub(s.last) > c.cfg.Stale {
		// The load comes back after a long time: what was measured then
		// may not hold now.
		*s = ctlState{}
	}
	s.last = now
	if s.left > 0 {
		return s.win
	}
	s.n++
	s.win, s.probe = s.arm, false
	if a := c.trial(s); a >= 0 {
		s.win, s.probe = a, true
	}
	s.left, s.steps = c.cfg.Window, 0
	s.featAt = c.featAt(s)
	s.tok, s.sec = 0, 0
	return s.win
}

// trial is the arm of a trial window that starts now, or -1 for the
// exploited arm. A trial sits between two windows of the exploited arm
// (the bracket its ratio sample needs) and within the exploration budget.
func (c *specCtl) trial(s *ctlState) int {
	if s.wins[s.arm] == 0 || s.prev[0].arm != s.arm || s.prev[0].n+1 != s.n {
		return -1
	}
	// A trial may take up to its window's time at the exploited arm's
	// pace over ctlQuickExit before it ends (losing).
	if est := s.prev[0].sec / ctlQuickExit; c.trialSec+est > c.cfg.Explore*c.totalSec+ctlFreeWindows*est {
		return -1
	}
	return c.trialArm(s, s.n, 0)
}

// trialArm is the arm of a trial in window n, or -1, by the step budget
// (ahead: measured steps still to come before the window starts) and
// the arms' predictions; the caller checks the rest (trial).
func (c *specCtl) trialArm(s *ctlState, n uint64, ahead int) int {
	if float64(c.probes)+float64(c.cfg.Window) > c.allowance()+c.cfg.Explore*float64(ahead) {
		return -1
	}
	if a := c.untried(s); a >= 0 {
		return a
	}
	if n%uint64(c.cfg.ProbeEvery) != 0 {
		return -1
	}
	return c.probeArm(s, n)
}

// ctlFeatLead is how many steps before a window that may speculate the
// engine starts collecting the target's features again while a load runs
// plain (featBook): the context an EAGLE draft restarts from. On the KJV
// model a 5-token chain drafted from the last 64 rows accepted ~12% less
// than from all of them, from 128 rows ~9% less (docs/eagle.md): a longer
// lead buys little for the collecting steps it costs.
const ctlFeatLead = 64

// featAt is, for the plain window that starts in s, the steps left in it
// (s.left) from which its steps collect features: those within
// ctlFeatLead steps of a later window that may be a trial, or all of it
// when it closes a trial's bracket (the controller may switch to the
// spec arm after it); 0 when none. Once per window: the predictions a
// trial needs cost tens of microseconds.
func (c *specCtl) featAt(s *ctlState) int {
	w := c.cfg.Window
	if s.win != armPlain || s.prev[0].arm != armPlain && s.prev[0].n+1 == s.n {
		return w
	}
	for k := 1; (k-1)*w < ctlFeatLead; k++ {
		if c.trialArm(s, s.n+uint64(k), k*w) >= 0 {
			return ctlFeatLead - (k-1)*w
		}
	}
	return 0
}

// wantsFeatures reports whether a step that runs arm for n decoding
// candidates (0: none; mixed: prompts in flight too) should collect the
// target's features for the proposer: without candidates, for the prompts
// alone; else when it speculates or its load may soon (leavesPlainSoon).
func (c *specCtl) wantsFeatures(n, arm int, mixed bool) bool {
	if n == 0 {
		return mixed
	}
	return arm != armPlain || c.leavesPlainSoon(n)
}

// leavesPlainSoon reports whether the load of a step decoding n ≥ 1
// sequences may speculate soon: its bucket exploits a spec arm (a plain
// step there is a trial), runs one, or its plain window may be followed
// by one within ctlFeatLead steps (featAt). Only then do plain steps pay
// for the features a proposal reads. A guess that misses costs the first
// spec step its drafts (that step is not measured: ctlObs.switched).
func (c *specCtl) leavesPlainSoon(n int) bool {
	s := &c.b[ctlBucket(n)]
	switch {
	case s.arm != armPlain || s.win != armPlain:
		return true
	case s.left == 0: // no window in progress: the next may be a trial
		return c.trialArm(s, s.n+1, 0) >= 0
	}
	return s.left <= s.featAt
}

// allowance is how many steps trial windows may have taken by now.
func (c *specCtl) allowance() float64 {
	return c.cfg.Explore*float64(c.total) + float64(ctlFreeWindows*c.cfg.Window)
}

// untried is the spec arm not yet measured at this load that the model
// predicts to beat the exploited arm by Margin the most, or -1.
func (c *specCtl) untried(s *ctlState) int {
	bar := 1 + c.cfg.Margin
	if s.arm != armPlain {
		bar *= max(1, c.predict(s, s.arm))
	}
	best, bp := -1, bar
	for a := c.arms - 1; a >= armSpec; a-- { // cheapest first: ties go to it
		if p := c.predict(s, a); s.samples[a] == 0 && a != s.arm && p > bp {
			best, bp = a, p
		}
	}
	return best
}

// probeArm is the arm of a trial of measured arms, or -1: while plain is
// exploited, the best spec arm the model does not rule out (ctlBackoff
// times rarer while it realised under ctlBackoffBelow of plain); while a
// spec arm is, in turn plain and the rungs next to it on the ladder.
func (c *specCtl) probeArm(s *ctlState, n uint64) int {
	if s.arm == armPlain {
		b := c.bestSpec(s, true)
		if b < 0 || !c.pays(s, b, false) || s.ratio[b] < math.Log(ctlBackoffBelow) && n%uint64(c.cfg.ProbeEvery*ctlBackoff) != 0 {
			return -1
		}
		return b
	}
	cand, k := [3]int{armPlain}, 1
	for _, a := range [2]int{s.arm - 1, s.arm + 1} {
		if a >= armSpec && a < c.arms && c.pays(s, a, false) {
			cand[k], k = a, k+1
		}
	}
	s.probes++
	return cand[(s.probes-1)%uint64(k)]
}

// ctlBackoff: while plain is exploited and the best spec arm realised
// less than ctlBackoffBelow of plain's tokens/s, it is tried again
// ctlBackoff times rarer.
const (
	ctlBackoff      = 4
	ctlBackoffBelow = 0.6
)

// setCost takes the cost model's figure: seconds per row of the
// target's pass (the slope of its fitted step time; ok false until the
// fit exists).
func (c *specCtl) setCost(rowSec float64, ok bool) {
	c.rowSec, c.costOK = rowSec, ok
}

// draftSec is the proposer's seconds per drafted token over the measured
// steps, blended with ctlPrior tokens' worth of nothing: it fades as the
// steps that measured it age, as the acceptance does (shape), and a
// proposal that drafted nothing does not make it infinite.
func (c *specCtl) draftSec() float64 {
	return c.dSec / (c.dTok + ctlPrior)
}

// shape is what arm a yields and costs per decoding sequence and step:
// tokens committed and rows forwarded, as measured over its steps,
// blended with ctlPrior sequences' worth of a guess. The guess takes its
// rows as its drafts plus one, and its tokens from the arm measured to
// accept best: each draft of a chain accepted with the probability α
// that fits that arm's tokens, a level of a tree of top-k with
// 1−(1−α)^k, as if its siblings were independent guesses (optimistic:
// EAGLE-2's trees accepted less than a chain of the same depth on the
// KJV model); with nothing measured, every draft accepted. Measurements
// fade with every measured step (ctlAccDecay), so an arm ruled out long
// ago drifts back towards the guess and gets another trial: acceptance
// changes as texts go on, and a chain proposer's spec arm is the cost
// model's γ, which may have drafted nothing when it was measured.
func (c *specCtl) shape(a int) (tok, rows float64) {
	nodes, depth, topK := c.maxDraft, c.maxDraft, 1
	if tb := c.budget(a); tb.nodes > 0 {
		nodes, depth, topK = tb.nodes, tb.depth, tb.topK
	}
	tok, rows = float64(1+depth), float64(1+nodes)
	alpha := -1.0
	for b := armSpec; b < c.arms; b++ {
		if x := &c.acc[b]; b != a && x.seqs >= 1 {
			al := chainAlpha(x.tok/x.seqs, c.depth(b))
			if k := c.budget(b).topK; k > 1 {
				al = 1 - math.Pow(1-al, 1/float64(k))
			}
			alpha = max(alpha, al)
		}
	}
	if alpha >= 0 {
		tok = chainLen(1-math.Pow(1-alpha, float64(topK)), depth)
	}
	x := &c.acc[a]
	return (x.tok + ctlPrior*tok) / (x.seqs + ctlPrior), (x.rows + ctlPrior*rows) / (x.seqs + ctlPrior)
}

// chainLen is the mean tokens a verification of a chain of depth drafts
// yields when each is accepted with probability alpha: 1+α+…+α^depth.
func chainLen(alpha float64, depth int) float64 {
	l, p := 1.0, 1.0
	for range depth {
		p *= alpha
		l += p
	}
	return l
}

// chainAlpha is the α for which chainLen(α, depth) is l.
func chainAlpha(l float64, depth int) float64 {
	lo, hi := 0.0, 1.0
	for range 40 {
		if m := (lo + hi) / 2; chainLen(m, depth) < l {
			lo = m
		} else {
			hi = m
		}
	}
	return (lo + hi) / 2
}

// depth is the longest path of drafts arm a verifies.
func (c *specCtl) depth(a int) int {
	if tb := c.budget(a); tb.depth > 0 {
		return tb.depth
	}
	return c.maxDraft
}

// predict is the model's ratio of arm a's tokens/s to plain's at this
// load: a plain step costs each sequence 1/rate[plain] seconds of the
// whole iteration and yields a token; arm a adds per sequence its extra
// rows and drafts at their marginal cost and yields tok tokens. On these
// cache-resident models a row of the pass costs nearly the same in a
// pass of 8 as of 48 rows, so the extra rows' cost is linear. +Inf while
// the model lacks a figure (no trial is ruled out then).
func (c *specCtl) predict(s *ctlState, a int) float64 {
	if a == armPlain {
		return 1
	}
	if c.ungated || !c.costOK || s.wins[armPlain] == 0 || s.rate[armPlain] <= 0 {
		return math.Inf(1)
	}
	tok, rows := c.shape(a)
	return tok / (1 + s.rate[armPlain]*(c.rowSec+c.draftSec())*max(0, rows-1))
}

// pays reports whether the model predicts arm a to beat plain by Margin
// (worth a trial), or with exploit, not to lose to it (worth exploiting
// where it measured better).
func (c *specCtl) pays(s *ctlState, a int, exploit bool) bool {
	if exploit {
		return c.predict(s, a) > 1
	}
	return c.predict(s, a) > 1+c.cfg.Margin
}

// bestSpec is the measured spec arm with the highest ratio to plain,
// among those the model does not rule out when gated (-1: none).
func (c *specCtl) bestSpec(s *ctlState, gated bool) int {
	best := -1
	for a := armSpec; a < c.arms; a++ {
		if s.samples[a] > 0 && (!gated || c.pays(s, a, true)) && (best < 0 || s.ratio[a] > s.ratio[best]) {
			best = a
		}
	}
	return best
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

// ctlObs is a measured step: it decoded n sequences with arm, committed
// tokens output tokens and forwarded rows rows in sec seconds of wall
// clock, the whole iteration of the engine (proposing, the pass,
// sampling, streaming, the loop's bookkeeping) included, of which the
// proposer took draftSec drafting drafted tokens. switched: the step
// before ran plain, so the proposer caught up on every token since.
type ctlObs struct {
	n, arm, tokens, rows, drafted int
	sec, draftSec                 float64
	switched                      bool
}

// observe records a measured step. A step that switched from plain to a
// spec arm counts against the exploration budget but is not measured:
// its catch-up (an EAGLE or draft model's KV over the tokens decoded
// without it; 9 ms against 1 ms for the KJV model's EAGLE chain after a
// plain window at 1 in flight) is paid once per switch, not per step of
// an arm that is exploited.
func (c *specCtl) observe(o ctlObs) {
	s := &c.b[ctlBucket(o.n)]
	if s.left <= 0 || o.arm != s.win || o.sec <= 0 {
		return // a window was reset under the step
	}
	c.total++
	c.totalSec += o.sec
	c.steps[min(o.arm, armSpec)]++
	c.byArm[o.arm]++
	if s.probe {
		c.probes++
		c.trialSec += o.sec
	}
	if o.switched && o.arm != armPlain {
		return
	}
	c.dSec, c.dTok = c.dSec*ctlAccDecay+o.draftSec, c.dTok*ctlAccDecay+float64(o.drafted)
	for a := armSpec; a < c.arms; a++ {
		x := &c.acc[a]
		x.seqs, x.tok, x.rows = x.seqs*ctlAccDecay, x.tok*ctlAccDecay, x.rows*ctlAccDecay
	}
	if x := &c.acc[o.arm]; o.arm != armPlain && o.n > 0 {
		x.seqs += float64(o.n)
		x.tok += float64(o.tokens)
		x.rows += float64(o.rows)
	}
	s.tok += float64(o.tokens)
	s.sec += o.sec
	s.steps++
	if s.left--; s.left > 0 && !c.losing(s) {
		return
	}
	s.left = 0
	c.endWindow(s, o.arm, s.tok/s.sec)
}

// losing reports whether the trial in progress has fallen so far behind
// the exploited arm that finishing it would only cost more: below half
// its rate after two steps, below ctlQuickExit of it a quarter of the
// way in. (trial budgets a trial's time as its window at the exploited
// arm's pace over ctlQuickExit; one slower than that but above half the
// rate overruns it by at most a quarter window.)
func (c *specCtl) losing(s *ctlState) bool {
	if !s.probe {
		return false
	}
	r, x := s.tok/s.sec, s.rate[s.arm]
	return s.steps >= 2 && r < x/2 || s.steps >= max(2, c.cfg.Window/4) && r < ctlQuickExit*x
}

// endWindow records a completed window of arm that realised rate
// tokens/s, and what it says about the arms.
func (c *specCtl) endWindow(s *ctlState, arm int, r float64) {
	if s.wins[arm] == 0 {
		s.rate[arm] = r
	} else {
		s.rate[arm] += ctlBeta * (r - s.rate[arm])
	}
	s.wins[arm]++
	w, p := ctlWin{s.n, arm, r, s.sec}, s.prev
	if p[0].n+1 == w.n && p[1].n+2 == w.n && p[1].arm == arm && p[0].arm != arm && r > 0 && p[0].rate > 0 && p[1].rate > 0 {
		s.sample(p[0].arm, arm, math.Log(p[0].rate)-(math.Log(p[1].rate)+math.Log(r))/2)
	}
	s.prev = [2]ctlWin{w, p[0]}
	c.decide(s)
}

// decide picks the arm to exploit from the ratios, among the spec arms
// the model does not predict to lose. Hysteresis: another spec arm must
// beat the exploited one by Margin, and speculation starts above
// plain·(1+2·Margin) and stops below plain·(1+Margin), so noise around a
// threshold does not flip the arm every window.
func (c *specCtl) decide(s *ctlState) {
	m := math.Log(1 + c.cfg.Margin)
	best := c.bestSpec(s, true)
	if best < 0 {
		s.arm = armPlain
		return
	}
	if s.arm != armPlain && s.samples[s.arm] > 0 && c.pays(s, s.arm, true) && s.ratio[best] < s.ratio[s.arm]+m {
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
// measured): the arm exploited at its load (plain until speculation
// measured better there), so that a load where plain pays does not
// draft for every decoding sequence in every step that starts a request.
func (c *specCtl) mixedArm(n int) int {
	if n == 0 {
		return armSpec
	}
	return c.b[ctlBucket(n)].arm
}

// ctlStep is the step whose wall time the engine measures for the
// controller: it began at t0 with gen0 output tokens committed.
type ctlStep struct {
	ok   bool // a step is being measured
	done bool // it ran to its update, and the scheduler was not left idle
	n    int  // decoding sequences
	rows int  // rows it forwarded
	// drafted tokens in draftSec seconds of proposing; switched: the
	// step before ran plain.
	drafted  int
	draftSec float64
	switched bool
	arm      int
	t0       time.Time
	gen0     uint64
}

// ctlBegin closes the measurement of the previous step, now that the
// iteration it began has ended, and returns the arm of the step that
// begins, for n decoding sequences (mixed: it also carries prefill, which
// costs time the arm does not decide, so it is not measured).
func (e *Engine) ctlBegin(n int, mixed bool) int {
	c := e.ctl
	now := time.Now()
	if p := &c.cur; p.ok && p.done {
		c.observe(ctlObs{n: p.n, arm: p.arm, tokens: int(e.st.GenerationTokens - p.gen0), rows: p.rows,
			drafted: p.drafted, sec: now.Sub(p.t0).Seconds(), draftSec: p.draftSec, switched: p.switched})
	}
	_, b, ok := e.cost.Line()
	c.setCost(b, ok)
	c.cur = ctlStep{}
	if mixed || n == 0 {
		c.lastArm = c.mixedArm(n)
		return c.lastArm
	}
	arm := c.choose(n, now)
	c.cur = ctlStep{ok: true, n: n, arm: arm, t0: now, gen0: e.st.GenerationTokens, switched: c.lastArm == armPlain}
	c.lastArm = arm
	return arm
}

// addDraft adds a proposal to the step being measured (c may be nil: no
// controller).
func (c *specCtl) addDraft(tokens int, seconds float64) {
	if c != nil && c.cur.ok {
		c.cur.drafted += tokens
		c.cur.draftSec += seconds
	}
}

// ctlEnd marks the step being measured as run to its update, having
// forwarded rows rows; an iteration after which the loop waits for work
// is not measured.
func (e *Engine) ctlEnd(rows int) {
	c := e.ctl
	if c == nil {
		return
	}
	if c.cur.ok {
		c.cur.done = !e.sch.idle()
		c.cur.rows = rows
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
			sa = max(armSpec, c.bestSpec(s, false))
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
