package ring_test

import (
	"math"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"pagoda/model"
	"pagoda/ring"
)

// startRing joins P ranks over real TCP on 127.0.0.1, each with its own
// listener, and closes them when the test ends.
func startRing(t testing.TB, P int, timeout time.Duration) []*ring.Link {
	t.Helper()
	lns := make([]net.Listener, P)
	addrs := make([]string, P)
	for i := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		lns[i], addrs[i] = ln, ln.Addr().String()
	}
	links := make([]*ring.Link, P)
	errs := make([]error, P)
	session := rand.Uint64()
	var wg sync.WaitGroup
	for r := range P {
		wg.Go(func() { links[r], errs[r] = ring.Join(r, lns[r], addrs, session, timeout) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		t.Cleanup(func() { links[r].Close() })
	}
	return links
}

// flatAttention is the engine's single-process attention: the model's
// contiguous KV cache, every row stored, then attended in chunks.
func flatAttention(t testing.TB, s ring.Shape, q, k, v []float32, T int) []float32 {
	t.Helper()
	c := &model.Config{NLayer: 1, NHead: s.NHead, NKVHead: s.NKVHead, HeadDim: s.HeadDim}
	fc := model.NewFlatCache(c, 1, T)
	b := &model.Batch{Tokens: make([]int32, T), Pos: make([]int32, T), Seq: make([]int32, T)}
	for i := range b.Pos {
		b.Pos[i] = int32(i)
	}
	if err := fc.Begin(b); err != nil {
		t.Fatal(err)
	}
	kvd, qd := s.KVDim(), s.QDim()
	for i := 0; i < T; i++ {
		fc.Store(0, i, k[i*kvd:(i+1)*kvd], v[i*kvd:(i+1)*kvd])
	}
	out := make([]float32, T*qd)
	ap := model.AttnParams{NHead: s.NHead, NKVHead: s.NKVHead, HeadDim: s.HeadDim, Scale: s.Scale, Window: s.Window}
	for lo := 0; lo < T; lo += 64 {
		hi := min(T, lo+64)
		fc.Attend(0, lo, hi, q[lo*qd:hi*qd], out[lo*qd:hi*qd], ap)
	}
	return out
}

// evenCuts splits T into P slices of T/P (the last takes the rest), shifted
// by a few rows so they are uneven.
func unevenCuts(T, P int) []int {
	c := make([]int, P+1)
	for i := 1; i < P; i++ {
		c[i] = i*T/P + (i%2)*3 - 1
	}
	c[P] = T
	return c
}

func relErr(got, want []float32) float64 {
	var e, scale float64 = 0, 1
	for i, w := range want {
		e = max(e, math.Abs(float64(got[i]-w)))
		scale = max(scale, math.Abs(float64(w)))
	}
	return e / scale
}

var tcpShapes = []ring.Shape{
	{NHead: 8, NKVHead: 2, HeadDim: 32},
	{NHead: 4, NKVHead: 4, HeadDim: 64},
	{NHead: 6, NKVHead: 3, HeadDim: 8, Window: 50},
}

// TestRingPrefillTCP: P = 2, 3, 4 ranks over TCP, each holding a slice of
// one sequence's K/V and its queries, give the single-process attention
// (the flat KV cache's) and the float64 reference within 1e-5.
func TestRingPrefillTCP(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	T := 333
	for _, s := range tcpShapes {
		s.Scale = float32(1 / math.Sqrt(float64(s.HeadDim)))
		p := ring.NewProblem(r, s, 0, T)
		flat := flatAttention(t, s, p.Q(), p.K(), p.V(), T)
		want := p.Reference()
		for P := 2; P <= 4; P++ {
			links := startRing(t, P, 10*time.Second)
			cuts := unevenCuts(T, P)
			got := make([]float32, len(flat))
			errs := make([]error, P)
			qd := s.QDim()
			var wg sync.WaitGroup
			for rk := range P {
				lo, hi := cuts[rk], cuts[rk+1]
				wg.Go(func() {
					errs[rk] = ring.New(links[rk], nil).Prefill(s, p.Q()[lo*qd:hi*qd], p.Pos()[lo:hi], p.Block(lo, hi), got[lo*qd:hi*qd])
				})
			}
			wg.Wait()
			for rk, err := range errs {
				if err != nil {
					t.Fatalf("%+v P=%d rank %d: %v", s, P, rk, err)
				}
			}
			ef, e64 := relErr(got, flat), ring.MaxErr(got, want)
			t.Logf("%+v P=%d: error against the flat cache %.3g, against float64 %.3g", s, P, ef, e64)
			if ef > 1e-5 || e64 > 1e-5 {
				t.Fatalf("%+v P=%d: error against the flat cache %.3g, against float64 %.3g", s, P, ef, e64)
			}
		}
	}
}

// TestRingDecodeTCP: the last rows of the sequence (one decode token, and
// three at once) attend K/V spread over P ranks; rank 0 merges the
// partials and gets the single-process attention; with DecodeAll every
// rank does, bit for bit the same.
func TestRingDecodeTCP(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	T := 257
	for _, s := range tcpShapes {
		s.Scale = float32(1 / math.Sqrt(float64(s.HeadDim)))
		p := ring.NewProblem(r, s, 0, T)
		flat := flatAttention(t, s, p.Q(), p.K(), p.V(), T)
		qd := s.QDim()
		for P := 2; P <= 4; P++ {
			links := startRing(t, P, 10*time.Second)
			cuts := unevenCuts(T, P)
			for _, n := range []int{1, 3} {
				q, pos := p.Q()[(T-n)*qd:], p.Pos()[T-n:]
				outs := make([][]float32, P)
				wrote := make([]bool, P)
				errs := make([]error, P)
				var wg sync.WaitGroup
				for rk := range P {
					wg.Go(func() {
						outs[rk] = make([]float32, n*qd)
						wrote[rk], errs[rk] = ring.New(links[rk], nil).Decode(s, q, pos, p.Block(cuts[rk], cuts[rk+1]), outs[rk])
					})
				}
				wg.Wait()
				for rk := range P {
					if errs[rk] != nil || wrote[rk] != (rk == 0) {
						t.Fatalf("P=%d rank %d: wrote %v, %v", P, rk, wrote[rk], errs[rk])
					}
				}
				if e := relErr(outs[0], flat[(T-n)*qd:]); e > 1e-5 {
					t.Fatalf("%+v P=%d n=%d: error %.3g", s, P, n, e)
				}
				// DecodeAll: every rank gets the result, the same bits.
				for rk := range P {
					wg.Go(func() {
						errs[rk] = ring.New(links[rk], nil).DecodeAll(s, q, pos, p.Block(cuts[rk], cuts[rk+1]), outs[rk])
					})
				}
				wg.Wait()
				for rk := range P {
					if errs[rk] != nil {
						t.Fatalf("DecodeAll P=%d rank %d: %v", P, rk, errs[rk])
					}
					if e := relErr(outs[rk], flat[(T-n)*qd:]); e > 1e-5 || !slices.Equal(outs[rk], outs[0]) {
						t.Fatalf("DecodeAll %+v P=%d n=%d rank %d: error %.3g, same as rank 0: %v", s, P, n, rk, e, slices.Equal(outs[rk], outs[0]))
					}
				}
			}
		}
	}
}

// runAll runs Prefill on the ranks listed, the others doing nothing, and
// returns each rank's error and how long the slowest took.
func runAll(links []*ring.Link, ranks []int, s ring.Shape, p *ring.Problem, T int) ([]error, time.Duration) {
	P := len(links)
	cuts := unevenCuts(T, P)
	qd := s.QDim()
	errs := make([]error, P)
	out := make([]float32, T*qd)
	start := time.Now()
	var wg sync.WaitGroup
	for _, rk := range ranks {
		lo, hi := cuts[rk], cuts[rk+1]
		wg.Go(func() {
			errs[rk] = ring.New(links[rk], nil).Prefill(s, p.Q()[lo*qd:hi*qd], p.Pos()[lo:hi], p.Block(lo, hi), out[lo*qd:hi*qd])
		})
	}
	wg.Wait()
	return errs, time.Since(start)
}

// TestRingBrokenLink: a rank whose connections are cut, and a rank that
// stops answering, turn into errors at the other ranks, not a hang: the
// cut at once (the closed connection), the stall within the deadline.
func TestRingBrokenLink(t *testing.T) {
	s := ring.Shape{NHead: 4, NKVHead: 2, HeadDim: 16, Scale: 0.25}
	T := 600
	p := ring.NewProblem(rand.New(rand.NewPCG(7, 8)), s, 0, T)

	links := startRing(t, 3, 5*time.Second)
	links[2].Close()
	errs, took := runAll(links, []int{0, 1}, s, p, T)
	for _, rk := range []int{0, 1} {
		if errs[rk] == nil {
			t.Fatalf("cut link: rank %d succeeded", rk)
		}
		t.Logf("cut link: rank %d: %v", rk, errs[rk])
	}
	if took > 2*time.Second {
		t.Fatalf("cut link: the other ranks took %v to fail (deadline 5s)", took)
	}

	links = startRing(t, 3, 300*time.Millisecond)
	errs, took = runAll(links, []int{0, 1}, s, p, T) // rank 2 joined but never attends
	for _, rk := range []int{0, 1} {
		if errs[rk] == nil {
			t.Fatalf("stalled rank: rank %d succeeded", rk)
		}
	}
	if !strings.Contains(errs[0].Error(), "timeout") {
		t.Errorf("stalled rank: rank 0's error does not name the timeout: %v", errs[0])
	}
	if took > 3*time.Second {
		t.Fatalf("stalled rank: the other ranks took %v to fail (deadline 300ms)", took)
	}

	// Joining a ring whose next rank never listens fails at the deadline.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	start := time.Now()
	if _, err := ring.Join(0, ln, []string{ln.Addr().String(), deadAddr}, 1, 400*time.Millisecond); err == nil {
		t.Fatal("joined a ring with no next rank")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("join took %v to give up (deadline 400ms)", d)
	}
}

// TestRingLongPrompt: a 4096-token prompt (and 16384 and 32768 with
// PAGODA_RING_LONG=1, or the lengths it lists; PAGODA_RING_P lists the
// ring sizes) over P = 2 and 4 ranks on TCP gives the flat KV
// cache's attention at every row, and the float64 reference at 64 sampled
// rows, within 1e-5.
func TestRingLongPrompt(t *testing.T) {
	if testing.Short() {
		t.Skip("long prompt: not in -short")
	}
	lengths, ranks := []int{4096}, []int{2, 4}
	if env := os.Getenv("PAGODA_RING_LONG"); env != "" {
		lengths = envInts(env) // "1": 4096, 16384 and 32768
		if len(lengths) == 1 && lengths[0] == 1 {
			lengths = []int{4096, 16384, 32768}
		}
	}
	if env := os.Getenv("PAGODA_RING_P"); env != "" {
		ranks = envInts(env)
	}
	s := ring.Shape{NHead: 4, NKVHead: 2, HeadDim: 32}
	s.Scale = float32(1 / math.Sqrt(float64(s.HeadDim)))
	qd := s.QDim()
	r := rand.New(rand.NewPCG(13, 14))
	for _, T := range lengths {
		p := ring.NewProblem(r, s, 0, T)
		start := time.Now()
		flat := flatAttention(t, s, p.Q(), p.K(), p.V(), T)
		flatTook := time.Since(start)
		var sample []int
		for i := 0; i < T; i += T / 64 {
			sample = append(sample, i+r.IntN(T/64))
		}
		sample = append(sample, T-1)
		ref := p.ReferenceRows(sample)
		pick := func(x []float32) ([]float32, []float64) {
			var g []float32
			var w []float64
			for _, i := range sample {
				g, w = append(g, x[i*qd:(i+1)*qd]...), append(w, ref[i*qd:(i+1)*qd]...)
			}
			return g, w
		}
		for _, P := range ranks {
			// A rank waits for its previous rank's block while that rank
			// computes a pass: at 32k tokens on a loaded machine that is
			// minutes, so the deadline is set well above it.
			links := startRing(t, P, 15*time.Minute)
			cuts := unevenCuts(T, P)
			got := make([]float32, T*qd)
			errs := make([]error, P)
			start := time.Now()
			var wg sync.WaitGroup
			for rk := range P {
				lo, hi := cuts[rk], cuts[rk+1]
				wg.Go(func() {
					errs[rk] = ring.New(links[rk], nil).Prefill(s, p.Q()[lo*qd:hi*qd], p.Pos()[lo:hi], p.Block(lo, hi), got[lo*qd:hi*qd])
				})
			}
			wg.Wait()
			took := time.Since(start)
			for rk, err := range errs {
				if err != nil {
					t.Fatalf("T=%d P=%d rank %d: %v", T, P, rk, err)
				}
			}
			g, w := pick(got)
			ef, e64 := relErr(got, flat), ring.MaxErr(g, w)
			t.Logf("T=%d P=%d: error against the flat cache %.3g, against float64 (%d rows) %.3g; ring %v, flat cache %v (all ranks share this machine: not a speed measure)",
				T, P, ef, len(sample), e64, took.Round(time.Millisecond), flatTook.Round(time.Millisecond))
			if ef > 1e-5 || e64 > 1e-5 {
				t.Fatalf("T=%d P=%d: error against the flat cache %.3g, against float64 %.3g", T, P, ef, e64)
			}
		}
	}
}

// visibleKeys is the causal work of queries at positions [lo, hi): the
// keys they see in all.
func visibleKeys(lo, hi int) int { return (lo + 1 + hi) * (hi - lo) / 2 }

// TestRingZigzag: with the zigzag split each of P = 2, 3, 4 TCP ranks holds
// two runs of the sequence (an early and a late one) and its queries at
// those positions; the ranks still get the flat cache's attention, and
// their causal work is even where contiguous slices give the last rank
// 2P−1 times the first's.
func TestRingZigzag(t *testing.T) {
	s := ring.Shape{NHead: 8, NKVHead: 2, HeadDim: 32}
	s.Scale = float32(1 / math.Sqrt(float64(s.HeadDim)))
	const T = 1000
	p := ring.NewProblem(rand.New(rand.NewPCG(15, 16)), s, 0, T)
	flat := flatAttention(t, s, p.Q(), p.K(), p.V(), T)
	qd := s.QDim()
	for P := 2; P <= 4; P++ {
		links := startRing(t, P, 10*time.Second)
		got := make([]float32, T*qd)
		errs := make([]error, P)
		work := make([]int, P)
		var wg sync.WaitGroup
		for rk := range P {
			z := ring.Zigzag(T, P, rk)
			var q []float32
			var pos []int32
			var own []ring.Block
			for _, c := range z {
				q, pos = append(q, p.Q()[c[0]*qd:c[1]*qd]...), append(pos, p.Pos()[c[0]:c[1]]...)
				own = append(own, p.Block(c[0], c[1]))
				work[rk] += visibleKeys(c[0], c[1])
			}
			wg.Go(func() {
				out := make([]float32, len(q))
				errs[rk] = ring.New(links[rk], nil).PrefillBlocks(s, q, pos, own, out)
				n := (z[0][1] - z[0][0]) * qd
				copy(got[z[0][0]*qd:z[0][1]*qd], out[:n])
				copy(got[z[1][0]*qd:z[1][1]*qd], out[n:])
			})
		}
		wg.Wait()
		for rk, err := range errs {
			if err != nil {
				t.Fatalf("P=%d rank %d: %v", P, rk, err)
			}
		}
		if e := relErr(got, flat); e > 1e-5 {
			t.Fatalf("P=%d zigzag: error %.3g", P, e)
		}
		cw := make([]int, P)
		for rk := range P {
			cw[rk] = visibleKeys(rk*T/P, (rk+1)*T/P)
		}
		zr, cr := float64(slices.Max(work))/float64(slices.Min(work)), float64(slices.Max(cw))/float64(slices.Min(cw))
		t.Logf("P=%d: causal work max/min over ranks: zigzag %.3f, contiguous %.2f", P, zr, cr)
		if zr > 1.02 {
			t.Fatalf("P=%d zigzag work per rank %v", P, work)
		}
	}
}

func envInts(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err == nil && n > 0 {
			out = append(out, n)
		}
	}
	return out
}
