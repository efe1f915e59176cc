package engine

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"pagoda/sample"
	"pagoda/spec"
)

// ctlSim drives a controller with a fake clock: each step decodes n
// sequences, commits n tokens (with yield: tok per sequence, forwarding
// rows rows each) and takes tokens/rate(n, arm) seconds.
type ctlSim struct {
	c      *specCtl
	now    time.Time
	rate   func(n, arm int) float64
	yield  func(arm int) (tok, rows float64)
	carry  float64 // fractions of tokens not yet committed
	runs   []int   // the arm of every step
	over   string  // the first step at which trials exceeded their allowance
	maxSec float64 // the longest step
}

func newCtlSim(cfg SpecControl, rate func(n, arm int) float64) *ctlSim {
	return &ctlSim{c: newSpecCtl(cfg, nil, 4), now: time.Unix(1e9, 0), rate: rate}
}

func (s *ctlSim) steps(n, k int) {
	for range k {
		arm := s.c.choose(n, s.now)
		tok, rows := 1.0, 1.0
		if s.yield != nil {
			tok, rows = s.yield(arm)
		}
		s.carry += float64(n) * tok
		t := int(s.carry)
		s.carry -= float64(t)
		sec := float64(t) / s.rate(n, arm)
		s.now = s.now.Add(time.Duration(sec * float64(time.Second)))
		s.c.observe(ctlObs{n: n, arm: arm, tokens: t, rows: int(math.Round(float64(n) * rows)), sec: sec})
		s.runs = append(s.runs, arm)
		if float64(s.c.probes) > s.c.allowance() && s.over == "" {
			s.over = fmt.Sprintf("step %d: %d trial steps of %d, allowance %.1f", len(s.runs), s.c.probes, s.c.total, s.c.allowance())
		}
		// In time: Explore of the measured seconds, plus the free window
		// and the overrun of the trial in progress, each at most two
		// windows of the slowest steps.
		s.maxSec = max(s.maxSec, sec)
		if most := s.c.cfg.Explore*s.c.totalSec + 4*float64(s.c.cfg.Window)*s.maxSec; s.c.trialSec > most && s.over == "" {
			s.over = fmt.Sprintf("step %d: %.3f s of trials in %.3f s, allowance %.3f s", len(s.runs), s.c.trialSec, s.c.totalSec, most)
		}
	}
}

// share is the fraction of the last k steps that ran arm.
func (s *ctlSim) share(arm, k int) float64 {
	c := 0
	for _, a := range s.runs[len(s.runs)-k:] {
		if a == arm {
			c++
		}
	}
	return float64(c) / float64(k)
}

func rates(spec1, plain1, spec8, plain8 float64) func(n, arm int) float64 {
	return func(n, arm int) float64 {
		if n < 5 {
			return [2]float64{plain1, spec1}[arm]
		}
		return [2]float64{plain8, spec8}[arm]
	}
}

// TestSpecCtlPicksFaster: a bucket starts on plain and tries spec in the
// next window, between two plain ones; it then exploits the faster arm
// and (with a generous exploration budget) tries the other exactly one
// window in ProbeEvery; a spec arm faster by less than the margin is not
// chosen.
func TestSpecCtlPicksFaster(t *testing.T) {
	cfg := SpecControl{Window: 10, ProbeEvery: 5, Margin: 0.03, Explore: 1}
	for _, tc := range []struct {
		name         string
		spec, plain  float64
		want         int
		loadDecoding int
	}{
		{"spec faster", 130, 100, armSpec, 1},
		{"plain faster", 90, 100, armPlain, 8},
		{"spec within margin", 102, 100, armPlain, 1},
	} {
		sim := newCtlSim(cfg, func(int, arm int) float64 { return [2]float64{tc.plain, tc.spec}[arm] })
		sim.steps(tc.loadDecoding, 5*cfg.Window)
		for w, want := range []int{armPlain, armSpec, armPlain} {
			if got := sim.runs[w*cfg.Window]; got != want {
				t.Fatalf("%s: exploration window %d ran %s", tc.name, w, armNames[got])
			}
		}
		p0 := sim.c.probes
		sim.steps(tc.loadDecoding, 100*cfg.Window)
		b := sim.c.b[ctlBucket(tc.loadDecoding)]
		if b.arm != tc.want {
			t.Fatalf("%s: exploits %s (rates plain %.1f spec %.1f)", tc.name, armNames[b.arm], b.rate[armPlain], b.rate[armSpec])
		}
		if got := sim.share(tc.want, 100*cfg.Window); got != 0.8 {
			t.Errorf("%s: the exploited arm ran %.3f of the steps, want 0.8", tc.name, got)
		}
		if p := sim.c.probes - p0; p != 20*uint64(cfg.Window) {
			t.Errorf("%s: %d trial steps, want %d", tc.name, p, 20*cfg.Window)
		}
	}
}

// TestSpecCtlLoadChange: each load bucket keeps its own arm, so going from
// 1 in flight (speculation pays) to 8 (it does not) and back switches at
// once, without exploring again.
func TestSpecCtlLoadChange(t *testing.T) {
	cfg := SpecControl{Window: 8, ProbeEvery: 6}
	sim := newCtlSim(cfg, rates(125, 100, 85, 100))
	sim.steps(1, 40*cfg.Window)
	if sim.share(armSpec, 30*cfg.Window) < 0.8 {
		t.Fatalf("1 in flight: speculated %.2f of steps", sim.share(armSpec, 30*cfg.Window))
	}
	sim.steps(8, 40*cfg.Window)
	if got := sim.share(armPlain, 30*cfg.Window); got < 0.8 {
		t.Fatalf("8 in flight: plain %.2f of steps", got)
	}
	sim.steps(1, 6*cfg.Window)
	if got := sim.share(armSpec, 6*cfg.Window); got < 5.0/6 {
		t.Fatalf("back at 1 in flight: speculated %.2f of steps", got)
	}
	// 7 decoding sequences share the bucket of 8.
	sim.steps(7, 6*cfg.Window)
	if got := sim.share(armPlain, 6*cfg.Window); got < 5.0/6 {
		t.Fatalf("7 in flight: plain %.2f of steps", got)
	}
}

// TestSpecCtlRateChange: when the arms' throughputs cross at one load
// (other work starts sharing the cores) the trials notice and the
// controller switches, and back again.
func TestSpecCtlRateChange(t *testing.T) {
	cfg := SpecControl{Window: 8, ProbeEvery: 4, Explore: 0.25}
	specRate := 130.0
	sim := newCtlSim(cfg, func(_, arm int) float64 { return [2]float64{100, specRate}[arm] })
	sim.steps(8, 20*cfg.Window)
	if sim.c.b[ctlBucket(8)].arm != armSpec {
		t.Fatal("does not speculate while it pays")
	}
	specRate = 80
	sim.steps(8, 24*cfg.Window) // six trials
	if sim.c.b[ctlBucket(8)].arm != armPlain {
		t.Fatalf("still speculates after speculation got slower (estimates %v)", sim.c.b[ctlBucket(8)].rate)
	}
	specRate = 140
	sim.steps(8, 24*cfg.Window)
	if sim.c.b[ctlBucket(8)].arm != armSpec {
		t.Fatalf("does not speculate again after it pays again (estimates %v)", sim.c.b[ctlBucket(8)].rate)
	}
	if sim.over != "" {
		t.Error(sim.over)
	}
}

// TestSpecCtlExploreBudget: whatever the rates, and however they drift,
// trial windows (all buckets together) never take more than Explore of
// the measured steps beyond the free windows; a clear loser's trials end
// a quarter of the way in; the arm that is not exploited is still tried
// now and then (it never starves); and a bucket not seen for Stale
// starts afresh on plain.
func TestSpecCtlExploreBudget(t *testing.T) {
	for _, explore := range []float64{0.03, 0.25} {
		cfg := SpecControl{Window: 8, ProbeEvery: 4, Stale: time.Minute, Explore: explore}
		for _, r := range [][2]float64{{100, 1000}, {1000, 100}, {1000, 650}, {1000, 1010}} {
			var sim *ctlSim
			sim = newCtlSim(cfg, func(n, arm int) float64 {
				el := sim.now.Sub(time.Unix(1e9, 0)).Seconds()
				return r[arm] * (1 + 0.3*math.Sin(el/2+float64(n)))
			})
			k := 400 * cfg.Window
			for i := range 20 {
				sim.steps([]int{1, 8, 3, 2, 16}[i%5], k/20)
			}
			if sim.over != "" {
				t.Errorf("explore %.2f, rates %v: %s", explore, r, sim.over)
			}
			if got := float64(sim.c.probes); got > explore*float64(k)+float64(ctlFreeWindows*cfg.Window) {
				t.Errorf("explore %.2f, rates %v: %.0f trial steps in %d", explore, r, got, k)
			}
			other := armSpec + armPlain - sim.c.b[ctlBucket(8)].arm
			if got := sim.share(other, k); got == 0 {
				t.Errorf("explore %.2f, rates %v: %s never ran", explore, r, armNames[other])
			}
			if r[armSpec] < r[armPlain]/2 {
				wins := 0
				for i := range sim.c.b {
					wins += sim.c.b[i].wins[armSpec]
				}
				if most := uint64(wins * cfg.Window / 4); sim.c.byArm[armSpec] > most {
					t.Errorf("explore %.2f, rates %v: the losing trials ran %d steps in %d windows", explore, r, sim.c.byArm[armSpec], wins)
				}
			}
			sim.now = sim.now.Add(2 * time.Minute)
			sim.steps(3, 3*cfg.Window)
			if got := sim.runs[len(sim.runs)-3*cfg.Window:]; got[0] != armPlain || got[2*cfg.Window] != armPlain {
				t.Errorf("explore %.2f, rates %v: after a stale gap the bucket did not start afresh on plain", explore, r)
			}
		}
	}
}

// TestSpecCtlDrift: the machine's speed drifts by ±60% over a few
// windows (other jobs come and go), far more than the arms differ; the
// controller compares adjacent windows, so it still finds the faster arm.
func TestSpecCtlDrift(t *testing.T) {
	cfg := SpecControl{Window: 10, ProbeEvery: 4}
	for _, gain := range []float64{1.15, 0.87} {
		var sim *ctlSim
		sim = newCtlSim(cfg, func(_, arm int) float64 {
			el := sim.now.Sub(time.Unix(1e9, 0)).Seconds()
			r := 100 * (1 + 0.6*math.Sin(el/3))
			if arm == armSpec {
				r *= gain
			}
			return r
		})
		sim.steps(6, 200*cfg.Window)
		b := sim.c.b[ctlBucket(6)]
		want := armSpec
		if gain < 1 {
			want = armPlain
		}
		if b.arm != want || sim.share(want, 100*cfg.Window) < 0.75 {
			t.Errorf("spec ×%.2f: exploits %s, ran it %.2f of the last steps (ratio %.3f)", gain, armNames[b.arm], sim.share(want, 100*cfg.Window), math.Exp(b.ratio[armSpec]))
		}
	}
}

func TestSpecCtlBuckets(t *testing.T) {
	want := map[int]string{1: "1", 2: "2", 3: "3-4", 4: "3-4", 5: "5-8", 8: "5-8", 9: "9-16", 16: "9-16", 17: "17-32", 64: "33-64", 65: "65+", 1000: "65+"}
	for n, name := range want {
		if got := ctlBucketName(ctlBucket(n)); got != name {
			t.Errorf("%d sequences: bucket %q, want %q", n, got, name)
		}
	}
}

// TestSpecCtlIdentical: with the controller switching between its arms
// every couple of steps, greedy and seeded output are token for token
// those without speculation, and no block leaks.
func TestSpecCtlIdentical(t *testing.T) {
	for _, seeded := range []bool{false, true} {
		reqs := specWorkload(7, 14)
		if seeded {
			for i, r := range reqs {
				r.Sampling = sample.Params{Temperature: 1, TopP: 0.9, RepetitionPenalty: 1.2, Seed: 5 + uint64(i), HasSeed: true}
			}
		}
		want := reference(t, reqs)
		ng, _ := spec.NewNGram(1, 3)
		for _, load := range []string{"solo", "concurrent"} {
			cfg := fakeConfig()
			cfg.KVBlocks = 64
			cfg.Spec = SpecConfig{Proposer: ng, Tokens: 4, Control: SpecControl{Window: 2, ProbeEvery: 2}}
			e := startEngine(t, &fakeModel{check: true}, cfg)
			got := runLoad(t, e, reqs, load)
			e.Stop(context.Background())
			for i := range reqs {
				if fmt.Sprint(got[i].tokens, got[i].finish, got[i].text) != fmt.Sprint(want[i].tokens, want[i].finish, want[i].text) {
					t.Fatalf("seeded %v %s request %d: %v, without speculation %v", seeded, load, i, got[i].tokens, want[i].tokens)
				}
			}
			mustNoLeak(t, e)
			c := e.ctl
			if c == nil || c.steps[armPlain] == 0 || c.steps[armSpec] == 0 {
				t.Fatalf("seeded %v %s: the controller did not run both arms", seeded, load)
			}
			t.Logf("seeded %v %s: measured steps plain %d, spec %d (probes %d); drafts %d", seeded, load, c.steps[armPlain], c.steps[armSpec], c.probes, e.Stats().SpecDrafts)
		}
	}
}

func TestSpecCtlTreeLadder(t *testing.T) {
	for _, tc := range []struct {
		nodes, topK, depth int
		want               string
	}{
		{16, 4, 5, "[{16 4 5} {8 2 5} {5 1 5} {4 1 4} {3 1 3}]"},
		{4, 4, 5, "[{4 4 4} {4 1 4} {3 1 3} {2 2 2} {1 1 1}]"},
		{1, 4, 5, "[{1 1 1}]"},
		{12, 10, 1, "[{12 10 1} {6 5 1} {3 3 1} {1 1 1}]"},
		{64, 16, 16, "[{64 16 16} {32 8 16} {16 4 15} {16 1 16} {8 1 8}]"},
	} {
		if got := fmt.Sprint(treeLadder(tc.nodes, tc.topK, tc.depth)); got != tc.want {
			t.Errorf("ladder of %d nodes, top-%d, depth %d: %s, want %s", tc.nodes, tc.topK, tc.depth, got, tc.want)
		}
	}
}

// treeSim is a controller over the ladder of a 16-node, top-4, depth-5
// tree whose steps cost what its cost model says: per sequence a plain
// step takes 10 ms and yields a token; a rung adds x·10 ms per draft
// node (a row of the pass and the drafting together: setCost gets it as
// 10 ms·x per row, and the proposer takes no time) and yields accLen tokens.
// The model then predicts each rung's ratio exactly, once measured.
func treeSim(cfg SpecControl, x func(n int) float64) (*ctlSim, []treeBudget) {
	ladder := treeLadder(16, 4, 5) // {16 4 5} {8 2 5} {5 1 5} {4 1 4} {3 1 3}
	accLen := []float64{3.8, 3.3, 2.9, 2.5, 2.1}
	var sim *ctlSim
	sim = &ctlSim{c: newSpecCtl(cfg, ladder, 16), now: time.Unix(1e9, 0)}
	sim.rate = func(n, arm int) float64 {
		sim.c.setCost(0.01*x(n), true) // the model's figures for the next step
		if arm == armPlain {
			return 100
		}
		return 100 * accLen[arm-armSpec] / (1 + x(n)*float64(ladder[arm-armSpec].nodes))
	}
	sim.yield = func(arm int) (float64, float64) {
		if arm == armPlain {
			return 1, 1
		}
		return accLen[arm-armSpec], float64(1 + ladder[arm-armSpec].nodes)
	}
	sim.c.setCost(0.01*x(1), true)
	return sim, ladder
}

// TestSpecCtlTreeBudget: with injected step costs the controller finds,
// per load, the rung of the tree ladder that yields the most tokens per
// second: the largest tree when verifying a node is cheap, a chain when
// it is dear, plain decoding when even a chain does not pay; it tries
// only rungs whose predicted ratio beats the exploited arm's, and never
// more steps than its exploration budget.
func TestSpecCtlTreeBudget(t *testing.T) {
	cfg := SpecControl{Window: 6, ProbeEvery: 6}
	for _, tc := range []struct {
		name   string
		x      float64
		want   int // arm; armPlain: plain
		trials []int
	}{
		// Every rung first bounded by all drafts accepted (6 tokens for
		// depth 5): the 5-node chain looks best; then α from its 2.9
		// tokens guesses the others, and only those predicted to beat
		// the exploited arm are tried (cheap: not the short chains once
		// the 16-node tree measured ×3.6; dear: not the 16-node tree).
		{"cheap verification", 0.004, armSpec, []int{armSpec + 2, armSpec, armSpec + 1}},
		{"dear verification", 0.2, armSpec + 2, []int{armSpec + 2, armSpec + 1, armSpec + 4, armSpec + 3}},
		{"a chain does not pay", 0.6, armPlain, []int{armSpec + 2}},
	} {
		sim, _ := treeSim(cfg, func(int) float64 { return tc.x })
		sim.steps(1, 300*cfg.Window)
		s := &sim.c.b[0]
		var trials []int // in the first 150 windows: later, faded measurements bring trials back
		for w := 0; w < 150*cfg.Window; w += cfg.Window {
			if a := sim.runs[w]; a != armPlain && !slices.Contains(trials, a) {
				trials = append(trials, a)
			}
		}
		if fmt.Sprint(trials) != fmt.Sprint(tc.trials) {
			t.Errorf("%s: tried arms %v in that order, want %v", tc.name, trials, tc.trials)
		}
		if s.arm != tc.want {
			t.Fatalf("%s: exploits arm %d %v, want %d; log ratios %.3f", tc.name, s.arm, sim.c.budget(s.arm), tc.want, s.ratio[:sim.c.arms])
		}
		if sim.over != "" {
			t.Errorf("%s: %s", tc.name, sim.over)
		}
		k := 100 * cfg.Window
		if got := sim.share(s.arm, k); got < 1-1.0/float64(cfg.ProbeEvery)-0.01 {
			t.Errorf("%s: exploited arm ran %.3f of the last steps", tc.name, got)
		}
		for a := armSpec; a < sim.c.arms; a++ {
			want := math.Log(sim.rate(1, a) / 100)
			if s.samples[a] > 0 && math.Abs(s.ratio[a]-want) > 0.02 {
				t.Errorf("%s: arm %d log ratio %.4f, true %.4f", tc.name, a, s.ratio[a], want)
			}
		}
		t.Logf("%s: %v, trials %v, steps by arm %v, log ratios %.3f", tc.name, sim.c.budget(s.arm), trials, sim.c.byArm[:sim.c.arms], s.ratio[:sim.c.arms])
	}
}

// TestSpecCtlModelGate: at 8 in flight verifying a node costs 0.6 of a
// plain step, at 1 in flight 0.004. Once the acceptance is known (from 1
// in flight), the 8-in-flight bucket runs no speculative step at all: the
// model predicts every rung to lose. And a rung whose window measured
// faster than plain (costs the model does not see) is still not
// exploited while the model predicts it to lose.
func TestSpecCtlModelGate(t *testing.T) {
	cfg := SpecControl{Window: 6, ProbeEvery: 6}
	sim, _ := treeSim(cfg, func(n int) float64 { return map[bool]float64{true: 0.004, false: 0.6}[n < 5] })
	sim.steps(1, 200*cfg.Window)
	before := sim.c.byArm
	sim.steps(8, 100*cfg.Window)
	if b := sim.c.b[ctlBucket(8)]; b.arm != armPlain || !slices.Equal(sim.c.byArm[armSpec:], before[armSpec:]) {
		t.Errorf("8 in flight: exploits %d, steps by arm %v before, %v after", b.arm, before, sim.c.byArm)
	}
	// Later the measured acceptance fades and the rungs get trials again,
	// within the budget.
	sim.steps(8, 900*cfg.Window)
	spec := 0
	for _, a := range sim.runs[len(sim.runs)-1000*cfg.Window:] {
		if a != armPlain {
			spec++
		}
	}
	if b := sim.c.b[ctlBucket(8)]; b.arm != armPlain || spec > 1000*cfg.Window*3/100 || sim.over != "" {
		t.Errorf("8 in flight: exploits %d, %d speculative steps of %d; %s", b.arm, spec, 1000*cfg.Window, sim.over)
	}
	if sim.c.b[0].arm == armPlain {
		t.Error("1 in flight: plain")
	}
	// The model says the rungs lose (x 0.6 per node) but the steps run
	// at twice plain's speed.
	sim, ladder := treeSim(cfg, func(int) float64 { return 0.6 })
	sim.rate = func(n, arm int) float64 { return 200 }
	sim.steps(4, 300*cfg.Window)
	s := sim.c.b[ctlBucket(4)]
	if s.arm != armPlain {
		t.Errorf("exploits %v, which the model predicts at ×%.2f of plain", ladder[s.arm-armSpec], sim.c.predict(&s, s.arm))
	}
	if sim.over != "" {
		t.Error(sim.over)
	}
}

// TestSpecCtlSwitchAndDraftCost: the step that switches from plain to a
// spec arm (the proposer catching up on every token decoded without it)
// counts against the budget but not in the arm's rate or draft cost; a
// proposal that drafted nothing leaves the draft cost finite; and the
// measured draft cost fades with the steps that follow, so a proposer
// once slow gets a trial again.
func TestSpecCtlSwitchAndDraftCost(t *testing.T) {
	c := newSpecCtl(SpecControl{Window: 4}, nil, 4)
	now := time.Unix(1e9, 0)
	step := func(o ctlObs) {
		if arm := c.choose(o.n, now); arm != o.arm {
			t.Fatalf("ran %s, want %s", armNames[arm], armNames[o.arm])
		}
		c.observe(o)
	}
	for range 4 {
		step(ctlObs{n: 1, arm: armPlain, tokens: 1, rows: 1, sec: 0.001})
	}
	step(ctlObs{n: 1, arm: armSpec, tokens: 1, rows: 1, sec: 0.5, draftSec: 0.499, switched: true})
	if s := &c.b[0]; s.sec != 0 || c.dSec != 0 || c.probes != 1 || s.left != 4 {
		t.Fatalf("the switching step was measured: window %.3f s, draft %.3f s, %d trial steps, %d steps left", s.sec, c.dSec, c.probes, s.left)
	}
	step(ctlObs{n: 1, arm: armSpec, tokens: 1, rows: 1, sec: 0.003, draftSec: 0.002})
	if d := c.draftSec(); math.IsInf(d, 0) || d > 0.002/ctlPrior+1e-12 {
		t.Fatalf("draft cost %.4g s per token after a proposal that drafted nothing", d)
	}
	for range 3 {
		step(ctlObs{n: 1, arm: armSpec, tokens: 3, rows: 5, drafted: 4, sec: 0.002, draftSec: 0.001})
	}
	d0 := c.draftSec()
	for range 2000 {
		c.observe(ctlObs{n: 1, arm: c.choose(1, now), tokens: 1, rows: 1, sec: 0.001})
	}
	if d := c.draftSec(); d > d0/10 {
		t.Errorf("draft cost %.4g s per token after 2000 steps, %.4g before", d, d0)
	}
}
