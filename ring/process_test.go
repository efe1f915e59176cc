package ring_test

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"pagoda/ring"
)

// The process tests run each rank as a child process: this test binary
// again, running only TestRingProcessChild, with its listener passed as
// file descriptor 3 (so the parent knows every address before any child
// starts) and its orders in the environment.

var procShape = ring.Shape{NHead: 4, NKVHead: 2, HeadDim: 32, Scale: 0.17677669}

const procT = 1500

func procProblem() *ring.Problem {
	return ring.NewProblem(rand.New(rand.NewPCG(21, 22)), procShape, 0, procT)
}

// TestRingProcessChild is a rank when PAGODA_RING_CHILD is set (a mode:
// "attend", or "hang": join, say so, and never attend); otherwise it does
// nothing. It writes its rows' attention, or "error: …", to PAGODA_RING_OUT.
func TestRingProcessChild(t *testing.T) {
	mode := os.Getenv("PAGODA_RING_CHILD")
	if mode == "" {
		t.Skip("runs only as a child of the process tests")
	}
	out := os.Getenv("PAGODA_RING_OUT")
	fail := func(err error) {
		os.WriteFile(out, []byte("error: "+err.Error()), 0o644)
		os.Exit(0)
	}
	rank, _ := strconv.Atoi(os.Getenv("PAGODA_RING_RANK"))
	addrs := strings.Split(os.Getenv("PAGODA_RING_ADDRS"), ",")
	timeout, _ := time.ParseDuration(os.Getenv("PAGODA_RING_TIMEOUT"))
	ln, err := net.FileListener(os.NewFile(3, "listener"))
	if err != nil {
		fail(err)
	}
	link, err := ring.Join(rank, ln, addrs, 42, timeout)
	if err != nil {
		fail(err)
	}
	if mode == "hang" {
		os.WriteFile(out+".joined", nil, 0o644)
		time.Sleep(time.Hour)
	}
	cuts := unevenCuts(procT, len(addrs))
	lo, hi := cuts[rank], cuts[rank+1]
	p, qd := procProblem(), procShape.QDim()
	res := make([]float32, (hi-lo)*qd)
	if err := ring.New(link, nil).Prefill(procShape, p.Q()[lo*qd:hi*qd], p.Pos()[lo:hi], p.Block(lo, hi), res); err != nil {
		fail(err)
	}
	b := make([]byte, 0, 4*len(res))
	for _, v := range res {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	if err := os.WriteFile(out, b, 0o644); err != nil {
		fail(err)
	}
	os.Exit(0)
}

type child struct {
	cmd *exec.Cmd
	out string
}

// startChildren starts P ranks as processes, in the modes given (default
// "attend"), each message bounded by timeout.
func startChildren(t *testing.T, P int, timeout time.Duration, modes map[int]string) []child {
	t.Helper()
	dir := t.TempDir()
	lns := make([]*net.TCPListener, P)
	addrs := make([]string, P)
	for i := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[i], addrs[i] = ln.(*net.TCPListener), ln.Addr().String()
	}
	cs := make([]child, P)
	for r := range cs {
		f, err := lns[r].File()
		if err != nil {
			t.Fatal(err)
		}
		lns[r].Close() // the child holds the socket now
		mode := modes[r]
		if mode == "" {
			mode = "attend"
		}
		cs[r].out = filepath.Join(dir, fmt.Sprintf("rank%d", r))
		cmd := exec.Command(os.Args[0], "-test.run=^TestRingProcessChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), "PAGODA_RING_CHILD="+mode, "PAGODA_RING_OUT="+cs[r].out,
			"PAGODA_RING_RANK="+strconv.Itoa(r), "PAGODA_RING_ADDRS="+strings.Join(addrs, ","),
			"PAGODA_RING_TIMEOUT="+timeout.String())
		cmd.ExtraFiles = []*os.File{f}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		f.Close()
		cs[r].cmd = cmd
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	}
	return cs
}

// wait waits for the ranks listed to exit, failing the test after limit.
func wait(t *testing.T, cs []child, ranks []int, limit time.Duration) {
	t.Helper()
	done := make(chan error, len(ranks))
	for _, r := range ranks {
		go func() { done <- cs[r].cmd.Wait() }()
	}
	deadline := time.After(limit)
	for range ranks {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("a rank exited with %v", err)
			}
		case <-deadline:
			t.Fatalf("ranks still running after %v: a hang", limit)
		}
	}
}

// TestRingProcesses: P = 2 and 4 ranks as separate processes over TCP give
// the single-process attention of a 1500-token sequence within 1e-5.
func TestRingProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes: not in -short")
	}
	p, qd := procProblem(), procShape.QDim()
	flat := flatAttention(t, procShape, p.Q(), p.K(), p.V(), procT)
	for _, P := range []int{2, 4} {
		cs := startChildren(t, P, 20*time.Second, nil)
		all := make([]int, P)
		for i := range all {
			all[i] = i
		}
		wait(t, cs, all, time.Minute)
		cuts := unevenCuts(procT, P)
		got := make([]float32, 0, procT*qd)
		for r, c := range cs {
			b, err := os.ReadFile(c.out)
			if err != nil {
				t.Fatal(err)
			}
			if len(b) != 4*(cuts[r+1]-cuts[r])*qd {
				t.Fatalf("P=%d rank %d: %.200s", P, r, b)
			}
			for i := 0; i < len(b); i += 4 {
				got = append(got, math.Float32frombits(binary.LittleEndian.Uint32(b[i:])))
			}
		}
		e := relErr(got, flat)
		t.Logf("P=%d processes: error against the flat cache %.3g", P, e)
		if e > 1e-5 {
			t.Fatalf("P=%d processes: error %.3g", P, e)
		}
	}
}

// TestRingProcessFaults: one of three rank processes joins and then is
// killed (SIGKILL) or stopped (SIGSTOP) while the others wait on it; the
// others report an error — at once for the kill, at their deadline for
// the stop — and exit, nothing hangs.
func TestRingProcessFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes: not in -short")
	}
	for _, tc := range []struct {
		sig   syscall.Signal
		limit time.Duration
		want  string
	}{{syscall.SIGKILL, 10 * time.Second, "connection"}, {syscall.SIGSTOP, 15 * time.Second, "timeout"}} {
		cs := startChildren(t, 3, 2*time.Second, map[int]string{2: "hang"})
		for start := time.Now(); ; time.Sleep(20 * time.Millisecond) {
			if _, err := os.Stat(cs[2].out + ".joined"); err == nil {
				break
			}
			if time.Since(start) > 20*time.Second {
				t.Fatal("rank 2 never joined")
			}
		}
		time.Sleep(200 * time.Millisecond) // the others are now waiting on rank 2
		cs[2].cmd.Process.Signal(tc.sig)
		wait(t, cs, []int{0, 1}, tc.limit)
		for _, r := range []int{0, 1} {
			b, _ := os.ReadFile(cs[r].out)
			if !strings.HasPrefix(string(b), "error: ") {
				t.Fatalf("%v: rank %d did not fail: %d bytes", tc.sig, r, len(b))
			}
			t.Logf("%v: rank %d: %s", tc.sig, r, b)
		}
		if !strings.Contains(string(must(os.ReadFile(cs[0].out))), tc.want) {
			t.Errorf("%v: rank 0's error does not say %q", tc.sig, tc.want)
		}
		cs[2].cmd.Process.Kill()
	}
}

func must[T any](v T, _ error) T { return v }
