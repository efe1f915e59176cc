package engine

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"pagoda/sample"
	"pagoda/spec"
)

// ctlSim drives a controller with a fake clock: each step decodes n
// sequences, commits n tokens and takes n/rate(n, arm) seconds.
type ctlSim struct {
	c    *specCtl
	now  time.Time
	rate func(n, arm int) float64
	wins [2]int // windows started by arm, as seen from the steps
	runs []int  // the arm of every step
}

func newCtlSim(cfg SpecControl, rate func(n, arm int) float64) *ctlSim {
	return &ctlSim{c: newSpecCtl(cfg, nil), now: time.Unix(1e9, 0), rate: rate}
}

func (s *ctlSim) steps(n, k int) {
	for range k {
		arm := s.c.choose(n, s.now)
		sec := float64(n) / s.rate(n, arm)
		s.now = s.now.Add(time.Duration(sec * float64(time.Second)))
		s.c.observe(n, arm, n, sec)
		s.runs = append(s.runs, arm)
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

// TestSpecCtlPicksFaster: after exploring both arms the controller
// exploits the faster one and runs the other exactly one window in
// ProbeEvery; a spec arm faster by less than the margin is not chosen.
func TestSpecCtlPicksFaster(t *testing.T) {
	cfg := SpecControl{Window: 10, ProbeEvery: 5, Margin: 0.03}
	for _, tc := range []struct {
		name         string
		spec, plain  float64
		want         int
		wantExploit  float64
		loadDecoding int
	}{
		{"spec faster", 130, 100, armSpec, 0.8, 1},
		{"plain faster", 90, 100, armPlain, 0.8, 8},
		{"spec within margin", 102, 100, armPlain, 0.8, 1},
	} {
		sim := newCtlSim(cfg, func(int, arm int) float64 { return [2]float64{tc.plain, tc.spec}[arm] })
		// Exploration: spec, plain, spec, plain windows.
		sim.steps(tc.loadDecoding, 4*cfg.Window)
		for w, want := range []int{armSpec, armPlain, armSpec, armPlain} {
			if got := sim.runs[w*cfg.Window]; got != want {
				t.Fatalf("%s: exploration window %d ran %s", tc.name, w, armNames[got])
			}
		}
		sim.steps(tc.loadDecoding, 100*cfg.Window)
		b := sim.c.b[ctlBucket(tc.loadDecoding)]
		if b.arm != tc.want {
			t.Fatalf("%s: exploits %s (rates plain %.1f spec %.1f)", tc.name, armNames[b.arm], b.rate[armPlain], b.rate[armSpec])
		}
		if got := sim.share(tc.want, 100*cfg.Window); got != tc.wantExploit {
			t.Errorf("%s: the exploited arm ran %.3f of the steps, want %.3f", tc.name, got, tc.wantExploit)
		}
		if p := sim.c.probes; p != 20*uint64(cfg.Window) {
			t.Errorf("%s: %d probe steps, want %d", tc.name, p, 20*cfg.Window)
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
// (other work starts sharing the cores) the probes notice and the
// controller switches, and back again.
func TestSpecCtlRateChange(t *testing.T) {
	cfg := SpecControl{Window: 8, ProbeEvery: 4}
	specRate := 130.0
	sim := newCtlSim(cfg, func(_, arm int) float64 { return [2]float64{100, specRate}[arm] })
	sim.steps(8, 20*cfg.Window)
	if sim.c.b[ctlBucket(8)].arm != armSpec {
		t.Fatal("does not speculate while it pays")
	}
	specRate = 80
	sim.steps(8, 24*cfg.Window) // six probes
	if sim.c.b[ctlBucket(8)].arm != armPlain {
		t.Fatalf("still speculates after speculation got slower (estimates %v)", sim.c.b[ctlBucket(8)].rate)
	}
	specRate = 140
	sim.steps(8, 24*cfg.Window)
	if sim.c.b[ctlBucket(8)].arm != armSpec {
		t.Fatalf("does not speculate again after it pays again (estimates %v)", sim.c.b[ctlBucket(8)].rate)
	}
}

// TestSpecCtlNeverStarves: whatever the rates, each arm runs at least one
// window in ProbeEvery (in ProbeEvery·ctlBackoff when speculation
// realises under ctlBackoffBelow of plain), and a bucket not seen for
// Stale explores afresh.
func TestSpecCtlNeverStarves(t *testing.T) {
	cfg := SpecControl{Window: 5, ProbeEvery: 8, Stale: time.Minute}
	for _, r := range [][2]float64{{100, 1000}, {1000, 100}, {1000, 650}} {
		sim := newCtlSim(cfg, func(_, arm int) float64 { return r[arm] })
		k := 160 * cfg.Window
		sim.steps(3, k)
		for arm := range 2 {
			want, most := 1.0/8, 1.0
			if arm == armSpec && r[armSpec] < ctlBackoffBelow*r[armPlain] {
				want /= ctlBackoff
				most = want + 2.0/160 // and exploration's two windows
			}
			if got := sim.share(arm, k); got < want || got > most {
				t.Errorf("rates %v: %s ran %.3f of the steps, want %.3f to %.3f", r, armNames[arm], got, want, most)
			}
		}
		exploited := sim.c.b[ctlBucket(3)].arm
		sim.now = sim.now.Add(2 * time.Minute)
		sim.steps(3, 2*cfg.Window)
		if sim.runs[len(sim.runs)-2*cfg.Window] != armSpec || sim.runs[len(sim.runs)-cfg.Window] != armPlain {
			t.Errorf("rates %v: after a stale gap the bucket did not explore both arms", r)
		}
		sim.steps(3, 2*cfg.Window)
		if got := sim.c.b[ctlBucket(3)].arm; got != exploited {
			t.Errorf("rates %v: after exploring again it exploits %s, before %s", r, armNames[got], armNames[exploited])
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

// TestSpecCtlTreeBudget: with injected step costs the controller finds,
// per load, the rung of the tree ladder that yields the most tokens per
// second: the largest tree when verifying a node is cheap, a chain when
// it is dear, plain decoding when even a chain does not pay. Step costs
// follow a linear model (a plain step t0, each verified node cv, each
// drafted row cp) and tokens per step the rung's acceptance length.
func TestSpecCtlTreeBudget(t *testing.T) {
	ladder := treeLadder(16, 4, 5) // {16 4 5} {8 2 5} {5 1 5} {4 1 4} {3 1 3}
	accLen := []float64{3.8, 3.3, 2.9, 2.5, 2.1}
	cfg := SpecControl{Window: 6, ProbeEvery: 6}
	costs := func(cv, cp float64) func(n, arm int) float64 {
		return func(n, arm int) float64 {
			if arm == armPlain {
				return 100
			}
			b := ladder[arm-armSpec]
			t := 1 + cv*float64(b.nodes) + cp*float64(b.topK*(b.depth-1)+1)
			return 100 * accLen[arm-armSpec] / t
		}
	}
	for _, tc := range []struct {
		name   string
		cv, cp float64
		want   treeBudget // zero: plain
		climb  int        // rungs exploration reaches
	}{
		{"cheap verification", 0.002, 0.002, ladder[0], 5},
		{"dear verification", 0.15, 0.05, ladder[2], 4},
		{"a chain does not pay", 0.4, 0.2, treeBudget{}, 1},
	} {
		sim := newCtlSim(cfg, costs(tc.cv, tc.cp))
		sim.c = newSpecCtl(cfg, ladder)
		// Exploration climbs from the cheapest rung, each spec window
		// between plain ones, the cheapest twice: at most 2·rungs+2
		// windows, fewer when the climb stops early.
		s := &sim.c.b[0]
		order := []int{armSpec + 4, armPlain, armSpec + 4, armPlain}
		for a := armSpec + 3; a >= armSpec+5-tc.climb; a-- {
			order = append(order, a, armPlain)
		}
		sim.steps(1, (2*len(ladder)+3)*cfg.Window)
		for w, want := range order {
			if got := sim.runs[w*cfg.Window]; got != want {
				t.Fatalf("%s: exploration window %d ran arm %d, want %d (order %v)", tc.name, w, got, want, order)
			}
		}
		if got := sim.runs[len(order)*cfg.Window]; got != s.arm {
			t.Fatalf("%s: after %d exploration windows the next ran arm %d, want the exploited %d", tc.name, len(order), got, s.arm)
		}
		sim.steps(1, 120*cfg.Window)
		if got := sim.c.budget(s.arm); got != tc.want {
			t.Fatalf("%s: exploits %v (arm %d), want %v; log ratios %.3f", tc.name, got, s.arm, tc.want, s.ratio[:sim.c.arms])
		}
		k := 100 * cfg.Window
		if got := sim.share(s.arm, k); got < 1-1.0/float64(cfg.ProbeEvery)-0.01 {
			t.Errorf("%s: exploited arm ran %.3f of the last steps", tc.name, got)
		}
		for a := armSpec; a < sim.c.arms; a++ {
			want := math.Log(costs(tc.cv, tc.cp)(1, a) / 100)
			if sim.c.byArm[a] > uint64(3*cfg.Window) && math.Abs(s.ratio[a]-want) > 1e-9 {
				t.Errorf("%s: arm %d log ratio %.4f, true %.4f", tc.name, a, s.ratio[a], want)
			}
		}
		t.Logf("%s: %v, steps by arm %v, log ratios %.3f", tc.name, tc.want, sim.c.byArm[:sim.c.arms], s.ratio[:sim.c.arms])
	}
	// Per load: at 1 in flight verification is cheap, at 8 dear.
	sim := newCtlSim(cfg, func(n, arm int) float64 {
		if n < 5 {
			return costs(0.002, 0.002)(n, arm)
		}
		return costs(0.15, 0.05)(n, arm)
	})
	sim.c = newSpecCtl(cfg, ladder)
	sim.steps(1, 60*cfg.Window)
	sim.steps(8, 60*cfg.Window)
	if b1, b8 := sim.c.budget(sim.c.b[ctlBucket(1)].arm), sim.c.budget(sim.c.b[ctlBucket(8)].arm); b1 != ladder[0] || b8 != ladder[2] {
		t.Errorf("per load: 1 in flight %v, 8 in flight %v; want %v and %v", b1, b8, ladder[0], ladder[2])
	}
}
