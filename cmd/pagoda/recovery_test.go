package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"pagoda/cluster"
	"pagoda/testutil"
)

// startWorkerAt starts a `pagoda worker` listening on addr and returns
// the address it listens on and its process (killed at the end of the
// test).
func startWorkerAt(t *testing.T, path, addr string) (string, *exec.Cmd) {
	t.Helper()
	cmd := exec.Command(bin, "worker", "--listen", addr, "-m", path, "--threads", "1", "--quiet")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	got, ok := strings.CutPrefix(strings.TrimSpace(line), cluster.ListenLine)
	if err != nil || !ok {
		t.Fatalf("worker at %s printed %q (%v)", addr, line, err)
	}
	go io.Copy(io.Discard, out)
	return got, cmd
}

// stopProc stops cmd's process with SIGSTOP and, on Linux, waits until
// the kernel shows it stopped, so what the test does next meets a worker
// that cannot answer.
func stopProc(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP to worker %d: %v", cmd.Process.Pid, err)
	}
	stat := fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		b, err := os.ReadFile(stat)
		if err != nil {
			return // no /proc: trust the signal
		}
		// The state follows the command's closing parenthesis.
		if i := strings.LastIndexByte(string(b), ')'); i >= 0 && i+2 < len(b) && (b[i+2] == 'T' || b[i+2] == 't') {
			return
		}
	}
	t.Fatalf("worker %d not stopped 5s after SIGSTOP", cmd.Process.Pid)
}

// get is a GET's status and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// postCompletion is a greedy completion's status and body.
func postCompletion(t *testing.T, addr, prompt string, n int) (int, string) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": n, "temperature": 0})
	resp, err := (&http.Client{Timeout: 60 * time.Second}).Post("http://"+addr+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metric is the value of the sample of name whose labels contain all of
// labels ("" for none), or -1.
func metric(t *testing.T, addr, name string, labels ...string) float64 {
	t.Helper()
	_, body := get(t, "http://"+addr+"/metrics")
	for _, line := range strings.Split(body, "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		all := true
		for _, l := range labels {
			all = all && strings.Contains(rest, l)
		}
		if !all {
			continue
		}
		v, err := strconv.ParseFloat(rest[strings.LastIndexByte(rest, ' ')+1:], 64)
		if err == nil {
			return v
		}
	}
	return -1
}

// healthDown is /health's 503 body.
type healthDown struct {
	Status, Reason string
	Workers        []cluster.DownWorker `json:"workers_down"`
}

// waitHealth polls /health until it answers want (within limit) and
// returns the body and how long it took.
func waitHealth(t *testing.T, addr string, want int, limit time.Duration) (string, time.Duration) {
	t.Helper()
	start := time.Now()
	for {
		code, body := get(t, "http://"+addr+"/health")
		if code == want {
			return body, time.Since(start)
		}
		if time.Since(start) > limit {
			t.Fatalf("/health still %d %s after %v (want %d)", code, body, limit, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// streamAndKill starts a long greedy stream, kills victim after its first
// chunk and returns what the stream carried after the kill.
func streamAndKill(t *testing.T, addr string, victim func()) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "stream": true, "ignore_eos": true})
	resp, err := (&http.Client{Timeout: 60 * time.Second}).Post("http://"+addr+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(first, "data: ") {
		t.Fatalf("first chunk: %q, %v", first, err)
	}
	victim()
	rest, _ := io.ReadAll(br)
	return string(rest)
}

// TestWorkerRecovery: a worker of a tensor-parallel group, a pipeline or
// a sequence-parallel ring,
// started by hand, is killed mid-stream (or stopped with SIGSTOP past
// --worker-timeout): the stream ends with an error naming it, /health is
// a 503 naming it, the metrics show it down, a new request is a 503; a
// new worker started on the same address (or SIGCONT) brings the model
// back within seconds, without restarting the server, and a greedy
// completion is the one before the failure.
func TestWorkerRecovery(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three processes per case")
	}
	path := filepath.Join(testutil.Shared(t, "models/gguf"), "stories260K.gguf")
	for _, c := range []struct {
		name, flag, victim, cause string
		stop                      bool // SIGSTOP, then SIGCONT, instead of a kill and a new worker
		idle                      bool // killed between requests: /health sees it before any request
		cut                       bool // its connections (the coordinator's and the mesh's) cut by a proxy; the worker lives on
		grid                      bool // tensor × pipeline: 4 workers, the victim stage 0's rank 1
	}{
		{"tp2", "--tensor-parallel", "rank 1", "tensor parallel: rank 1: ", false, false, false, false},
		{"pp2", "--pipeline-parallel", "stage 1", "pipeline parallel: stage 1: ", false, false, false, false},
		{"tp2-stall", "--tensor-parallel", "rank 1", "tensor parallel: rank 1: no answer within 2s", true, false, false, false},
		{"pp2-idle", "--pipeline-parallel", "stage 1", "pipeline parallel: stage 1 at 127.0.0.1:", false, true, false, false},
		{"tp2-cut", "--tensor-parallel", "rank 1", "tensor parallel: rank 1: ", false, false, true, false},
		{"tp2xpp2", "--pipeline-parallel", "stage 0 rank 1", "pipeline parallel: stage 0 rank 1: ", false, false, false, true},
		{"sp2", "--sequence-parallel", "rank 1", "sequence parallel: rank 1: ", false, false, false, false},
		{"sp2-stall", "--sequence-parallel", "rank 1", "sequence parallel: rank 1: no answer within 2s", true, false, false, false},
		{"sp2-cut", "--sequence-parallel", "rank 1", "sequence parallel: rank 1: ", false, false, true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			a0, _ := startWorker(t, path)
			a1, victim := startWorker(t, path)
			var px *proxy
			if c.cut {
				px = startProxy(t, a1)
				a1 = px.addr
			}
			workers := []string{a0, a1}
			flags := []string{c.flag, "2"}
			if c.grid {
				a2, _ := startWorker(t, path)
				a3, _ := startWorker(t, path)
				workers = append(workers, a2, a3)
				flags = append(flags, "--tensor-parallel", "2")
			}
			addr := startProc(t, servingRe, append([]string{"serve", "-m", path, "--port", "0", "--kv-cache-memory", "8MiB", "--threads", "2",
				"--workers", strings.Join(workers, ","), "--worker-timeout", "1s", "--worker-reconnect", "500ms"}, flags...)...)
			want := complete(t, addr, "Once upon a time", 24)
			if g := metric(t, addr, "pagoda_worker_group_up"); g != 1 {
				t.Fatalf("pagoda_worker_group_up %v before the failure", g)
			}
			fail := func() { victim.Process.Kill(); victim.Wait() }
			switch {
			case c.stop:
				fail = func() { stopProc(t, victim) }
				defer victim.Process.Signal(syscall.SIGCONT)
			case c.cut:
				fail = px.cut
			}
			if c.idle {
				fail()
				_, took := waitHealth(t, addr, 503, 10*time.Second)
				t.Logf("/health 503 %v after the kill, before any request", took.Round(time.Millisecond))
			} else {
				start := time.Now()
				rest := streamAndKill(t, addr, fail)
				t.Logf("the stream ended %v after the failure: ...%s", time.Since(start).Round(time.Millisecond), tail(rest, 300))
				if !strings.Contains(rest, "worker group down: "+c.cause) && strings.Count(rest, `"text"`) < 390 {
					t.Errorf("the stream after the failure: no error naming %s: ...%s", c.victim, tail(rest, 500))
				}
			}
			code, body := postCompletion(t, addr, "The dog", 8)
			if code != 503 || !strings.Contains(body, c.cause) {
				t.Errorf("a request while the worker is down: %d %s", code, body)
			}
			hb, _ := waitHealth(t, addr, 503, 10*time.Second)
			var h healthDown
			if err := json.Unmarshal([]byte(hb), &h); err != nil || len(h.Workers) != 1 || h.Workers[0].Worker != 1 ||
				h.Workers[0].Name != c.victim || h.Workers[0].Address != a1 || !strings.Contains(h.Reason, c.cause) {
				t.Errorf("/health while down: %s (%v)", hb, err)
			}
			t.Logf("/health while down: %s", hb)
			if up, w1 := metric(t, addr, "pagoda_worker_group_up"), metric(t, addr, "pagoda_worker_up", `worker="1"`); up != 0 || w1 != 0 {
				t.Errorf("metrics while down: group up %v, worker 1 up %v", up, w1)
			}
			if w0, f := metric(t, addr, "pagoda_worker_up", `worker="0"`), metric(t, addr, "pagoda_worker_group_failures_total"); w0 != 1 || f != 1 {
				t.Errorf("metrics while down: worker 0 up %v, failures %v", w0, f)
			}
			switch {
			case c.stop:
				victim.Process.Signal(syscall.SIGCONT)
			case c.cut:
				px.pass() // the same worker, through the proxy again
			default:
				startWorkerAt(t, path, a1)
			}
			_, took := waitHealth(t, addr, 200, 30*time.Second)
			t.Logf("healthy %v after the worker came back", took.Round(time.Millisecond))
			if got := complete(t, addr, "Once upon a time", 24); got != want {
				t.Errorf("after recovery: %q, want %q", got, want)
			}
			if up, r := metric(t, addr, "pagoda_worker_group_up"), metric(t, addr, "pagoda_worker_group_reconnects_total"); up != 1 || r != 1 {
				t.Errorf("metrics after recovery: group up %v, reconnects %v", up, r)
			}
		})
	}
}

// proxy forwards connections to a worker: cut closes them all and
// refuses new ones until pass, a network cut between the worker and
// everyone else (the coordinator and the other ranks dial it here).
type proxy struct {
	addr   string
	mu     sync.Mutex
	conns  []net.Conn
	closed bool
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{addr: ln.Addr().String()}
	t.Cleanup(func() { ln.Close(); p.cut() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			closed := p.closed
			p.mu.Unlock()
			var w net.Conn
			if !closed {
				w, err = net.Dial("tcp", target)
			}
			if closed || err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, w)
			p.mu.Unlock()
			go func() { io.Copy(w, c); w.Close() }()
			go func() { io.Copy(c, w); c.Close() }()
		}
	}()
	return p
}

func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *proxy) pass() {
	p.mu.Lock()
	p.closed = false
	p.mu.Unlock()
}

// children are the processes whose parent is pid.
func children(t *testing.T, pid int) []int {
	t.Helper()
	tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/children")
	var out []int
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, s := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(s); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// TestWorkerRecoverySpawned: a worker that `serve --tensor-parallel 2`
// (or `--sequence-parallel 2`) started itself is killed: the server notices without a request (/health
// 503 naming it), starts a new worker process and reconnects, and a
// greedy completion is the one before.
func TestWorkerRecoverySpawned(t *testing.T) {
	if testing.Short() {
		t.Skip("starts four processes")
	}
	if _, err := os.Stat("/proc/self/task"); err != nil {
		t.Skip("needs /proc to find the spawned workers")
	}
	for _, c := range []struct{ flag, what string }{{"--tensor-parallel", "tensor parallel"}, {"--sequence-parallel", "sequence parallel"}} {
		t.Run(c.flag, func(t *testing.T) { workerRecoverySpawned(t, c.flag, c.what) })
	}
}

func workerRecoverySpawned(t *testing.T, flag, what string) {
	path := filepath.Join(testutil.Shared(t, "models/gguf"), "stories260K.gguf")
	cmd := exec.Command(bin, "serve", "-m", path, "--port", "0", "--kv-cache-memory", "8MiB", "--threads", "2",
		flag, "2", "--worker-timeout", "2s", "--worker-reconnect", "500ms")
	cmd.Env = append(cmd.Environ(), "XDG_CACHE_HOME="+t.TempDir(), "HOME="+t.TempDir())
	var log syncBuffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	var addr string
	for start := time.Now(); addr == ""; time.Sleep(50 * time.Millisecond) {
		if m := servingRe.FindStringSubmatch(log.String()); m != nil {
			addr = m[1]
		} else if time.Since(start) > 60*time.Second {
			t.Fatalf("serve did not start:\n%s", log.String())
		}
	}
	want := complete(t, addr, "Once upon a time", 24)
	kids := children(t, cmd.Process.Pid)
	if len(kids) != 2 {
		t.Fatalf("serve has %d child processes, want 2 workers", len(kids))
	}
	syscall.Kill(kids[1], syscall.SIGKILL)
	hb, took := waitHealth(t, addr, 503, 10*time.Second)
	t.Logf("/health %v after the kill, with no request: %s", took.Round(time.Millisecond), hb)
	var h healthDown
	if err := json.Unmarshal([]byte(hb), &h); err != nil || len(h.Workers) != 1 || !strings.Contains(h.Reason, what+": rank ") || !strings.Contains(h.Reason, ": the worker process exited") {
		t.Errorf("/health while down: %s (%v)", hb, err)
	}
	_, took = waitHealth(t, addr, 200, 30*time.Second)
	t.Logf("healthy again %v later", took.Round(time.Millisecond))
	if got := complete(t, addr, "Once upon a time", 24); got != want {
		t.Errorf("after recovery: %q, want %q", got, want)
	}
	if r := metric(t, addr, "pagoda_worker_restarts_total"); r != 1 {
		t.Errorf("pagoda_worker_restarts_total %v", r)
	}
	if kids2 := children(t, cmd.Process.Pid); len(kids2) != 2 || slices.Contains(kids2, kids[1]) {
		t.Errorf("workers after the restart: %v (before %v)", kids2, kids)
	}
	if !regexp.MustCompile(`restarted 1 worker process`).MatchString(log.String()) {
		t.Errorf("no restart line in the log:\n%s", tail(log.String(), 2000))
	}
}

// syncBuffer is a bytes.Buffer a process writes while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestWorkerReconnectFlag: --worker-reconnect out of range is refused
// before anything starts.
func TestWorkerReconnectFlag(t *testing.T) {
	for v, shown := range map[string]string{"10ms": "10ms", "2h": "2h0m0s"} {
		code, _, stderr := pagoda(t, "serve", "--tensor-parallel", "2", "--worker-reconnect", v)
		if code == 0 || !strings.Contains(stderr, "--worker-reconnect "+shown+" out of range [200ms, 1h]") {
			t.Errorf("--worker-reconnect %s: exit %d, %s", v, code, stderr)
		}
	}
}
