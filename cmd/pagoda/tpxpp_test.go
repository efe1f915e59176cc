package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"pagoda/testutil"
)

// startWorker starts a `pagoda worker` process of path on a free port
// and returns its address and process (killed at the end of the test).
func startWorker(t *testing.T, path string) (string, *exec.Cmd) {
	t.Helper()
	return startWorkerAt(t, path, "127.0.0.1:0")
}

// TestServeTPxPP: `serve --tensor-parallel 2 --pipeline-parallel 2` (four
// workers it starts itself, steps in micro-batches) and the same with
// four hand-started `--workers` (stage-major, whole steps) answer greedy
// completions as the single-process server does, on stories260K (5
// layers: 3 + 2) and the golden two-layer GQA llama; `run` prints what
// one process prints.
func TestServeTPxPP(t *testing.T) {
	if testing.Short() {
		t.Skip("starts eleven processes per model")
	}
	for _, path := range []string{
		filepath.Join(testutil.Shared(t, "models/gguf"), "stories260K.gguf"),
		filepath.Join(testutil.Shared(t, "golden/models"), "g-llama3-ropefreqs.F32.gguf"),
	} {
		t.Run(filepath.Base(path), func(t *testing.T) {
			common := []string{"serve", "-m", path, "--port", "0", "--kv-cache-memory", "8MiB", "--threads", "2"}
			grid := []string{"--tensor-parallel", "2", "--pipeline-parallel", "2"}
			single := startProc(t, servingRe, common...)
			spawned := startProc(t, servingRe, append(append(common, grid...), "--pipeline-micro-batches", "2", "--pipeline-min-rows", "1")...)
			var addrs []string
			for range 4 {
				a, _ := startWorker(t, path)
				addrs = append(addrs, a)
			}
			byHand := startProc(t, servingRe, append(append(common, grid...), "--pipeline-micro-batches", "1", "--workers", strings.Join(addrs, ","))...)
			for _, p := range []string{"Once upon a time", "The dog", "Lily and her mom went to the"} {
				want := complete(t, single, p, 24)
				if want == "" {
					t.Fatalf("%q: the single-process server generated nothing", p)
				}
				for name, addr := range map[string]string{"spawned": spawned, "--workers": byHand} {
					if got := complete(t, addr, p, 24); got != want {
						t.Errorf("%s: %q continues as %q, want %q", name, p, got, want)
					}
				}
			}
			args := []string{"run", "-m", path, "-p", "Once upon a time", "-n", "24", "--temp", "0"}
			code, want, stderr := pagoda(t, args...)
			if code != 0 {
				t.Fatalf("run: exit %d: %s", code, stderr)
			}
			code, got, stderr := pagoda(t, append(args, grid...)...)
			if code != 0 || got != want {
				t.Errorf("run %v: exit %d, printed %q, want %q\n%s", grid, code, got, want, stderr)
			}
		})
	}
}

// TestServeTPxPPRefusals: what cannot run as TP × PP is refused before
// serving, naming the reason.
func TestServeTPxPPRefusals(t *testing.T) {
	dir := testutil.Shared(t, "golden/models")
	two := filepath.Join(dir, "g-llama3-ropefreqs.F32.gguf")
	six := "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3,127.0.0.1:4,127.0.0.1:5,127.0.0.1:6"
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "-m", two, "--tensor-parallel", "2", "--pipeline-parallel", "2", "--workers", "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"},
			"--tensor-parallel 2 × --pipeline-parallel 2 needs 4 --workers, stage-major (stage 0's ranks first), but 3 are given"},
		{[]string{"serve", "-m", two, "--tensor-parallel", "2", "--pipeline-parallel", "3", "--workers", six}, "3 stages for a model of 2 layers"},
		{[]string{"serve", "-m", two, "--tensor-parallel", "3", "--pipeline-parallel", "2", "--workers", six}, "4 query heads do not split whole across 3 ranks"},
		{[]string{"serve", "-m", filepath.Join(dir, "g-qwen2moe.Q8_0.gguf"), "--tensor-parallel", "2", "--pipeline-parallel", "2"},
			"mixture-of-experts models (qwen2moe) do not split yet (expert parallelism is not implemented)"},
		{[]string{"serve", "-m", filepath.Join(dir, "g-deepseek2.Q8_0.gguf"), "--tensor-parallel", "2", "--pipeline-parallel", "2"},
			"mixture of experts and multi-head latent attention do not split yet"},
		{[]string{"serve", "--tensor-parallel", "0", "--pipeline-parallel", "2"}, "--tensor-parallel 0"},
	} {
		code, _, stderr := pagoda(t, append(c.args, "--port", "0")...)
		if code == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("pagoda %v: exit %d, stderr %q (want %q)", c.args, code, stderr, c.want)
		}
	}
}

// TestServeTPxPPWorkerDies: of four hand-started workers (TP=2 × PP=2),
// stage 0's rank 1 is killed (SIGKILL) while a completion streams: the
// stream ends at once with an error naming the pipeline, later requests
// fail at once with a 5xx and the reason, and the server stays up.
func TestServeTPxPPWorkerDies(t *testing.T) {
	if testing.Short() {
		t.Skip("starts five processes")
	}
	path := filepath.Join(testutil.Shared(t, "models/gguf"), "stories260K.gguf")
	var addrs []string
	var victim *exec.Cmd
	for i := range 4 {
		a, cmd := startWorker(t, path)
		addrs = append(addrs, a)
		if i == 1 {
			victim = cmd
		}
	}
	addr := startProc(t, servingRe, "serve", "-m", path, "--port", "0", "--kv-cache-memory", "8MiB", "--threads", "2",
		"--tensor-parallel", "2", "--pipeline-parallel", "2", "--workers", strings.Join(addrs, ","))
	if complete(t, addr, "Once upon a time", 8) == "" {
		t.Fatal("no completion before the worker died")
	}
	client := &http.Client{Timeout: 60 * time.Second}
	// A stream long enough to be in flight when the worker dies: kill it
	// after the first chunk.
	body, _ := json.Marshal(map[string]any{"prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "stream": true, "ignore_eos": true})
	resp, err := client.Post("http://"+addr+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(first, "data: ") {
		t.Fatalf("first chunk: %q, %v", first, err)
	}
	victim.Process.Kill()
	start := time.Now()
	rest, _ := io.ReadAll(br)
	resp.Body.Close()
	chunks := strings.Count(string(rest), "data: ")
	t.Logf("the stream ended %v after the kill, %d chunks after it: ...%s", time.Since(start).Round(time.Millisecond), chunks, tail(string(rest), 300))
	if !strings.Contains(string(rest), "pipeline parallel: stage") {
		// Stories260K may have finished all 400 tokens before the kill
		// landed; then the next request must see the error.
		if strings.Count(string(rest), `"text"`) < 390 {
			t.Errorf("the stream after the kill: no error naming the pipeline: ...%s", tail(string(rest), 500))
		}
	}
	body, _ = json.Marshal(map[string]any{"prompt": "The dog", "max_tokens": 8, "temperature": 0})
	start = time.Now()
	resp, err = client.Post("http://"+addr+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("after the worker died: %v (in %v)", err, time.Since(start))
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode < 500 || !strings.Contains(string(b), "pipeline parallel: stage") {
		t.Errorf("after the worker died: %d %s", resp.StatusCode, b)
	}
	t.Logf("after the worker died: %d in %v: %s", resp.StatusCode, time.Since(start).Round(time.Millisecond), b)
	resp, err = client.Get("http://" + addr + "/v1/models")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("the server after the worker died: %v", err)
	}
	resp.Body.Close()
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// TestBenchTPxPP: `bench --tensor-parallel 2 --pipeline-parallel 2`
// measures pp and tg through four worker processes (one thread each of
// -t 2, at least one), naming the group.
func TestBenchTPxPP(t *testing.T) {
	path := filepath.Join(testutil.Shared(t, "models/gguf"), "stories260K.gguf")
	code, out, stderr := pagoda(t, "bench", "-m", path, "-p", "16", "-n", "8", "-r", "2", "-t", "2", "-bw", "0", "--json",
		"--tensor-parallel", "2", "--pipeline-parallel", "2")
	if code != 0 {
		t.Fatalf("bench: exit %d: %s", code, stderr)
	}
	var rs []struct {
		Model   string    `json:"model"`
		Test    string    `json:"test"`
		Threads int       `json:"threads"`
		Samples []float64 `json:"samples_ts"`
		Mean    float64   `json:"avg_ts"`
	}
	if err := json.Unmarshal([]byte(out), &rs); err != nil {
		t.Fatalf("bench: %v\n%s", err, out)
	}
	var tests []string
	for _, r := range rs {
		tests = append(tests, r.Test)
		if !strings.HasSuffix(r.Model, " tp2xpp2") || r.Threads != 4 || len(r.Samples) != 2 || !(r.Mean > 0) {
			t.Errorf("bench: %+v", r)
		}
	}
	if got := strings.Join(tests, " "); got != "pp16 tg8" {
		t.Errorf("bench: tests %s", got)
	}
	t.Logf("%s", out)
}

// TestServeWorkerStalls: a worker stopped with SIGSTOP (alive, connected,
// silent) under TP=2, PP=2 and TP=2 × PP=2, with --worker-timeout 1s:
// the next completion fails within a few seconds with a 5xx naming the
// stopped worker ("no answer within 2s": its stagemates and successors
// fail their exchanges with it first, at 1 s, so the coordinator's own
// deadline finds the stalled one), and the server stays up. (Before
// --worker-timeout, a stopped tensor-parallel rank hung the request for
// good: the coordinator waited on it with no deadline.)
func TestServeWorkerStalls(t *testing.T) {
	if testing.Short() {
		t.Skip("starts eleven processes")
	}
	path := filepath.Join(testutil.Shared(t, "models/gguf"), "stories260K.gguf")
	for _, c := range []struct {
		name    string
		flags   []string
		workers int
		want    string
	}{
		{"tp2", []string{"--tensor-parallel", "2"}, 2, "tensor parallel: rank 1: "},
		{"pp2", []string{"--pipeline-parallel", "2"}, 2, "pipeline parallel: stage 1: "},
		{"tp2xpp2", []string{"--tensor-parallel", "2", "--pipeline-parallel", "2"}, 4, "pipeline parallel: stage 0 rank 1: "},
	} {
		t.Run(c.name, func(t *testing.T) {
			var addrs []string
			var victim *exec.Cmd
			for i := range c.workers {
				a, cmd := startWorker(t, path)
				addrs = append(addrs, a)
				if i == 1 {
					victim = cmd
				}
			}
			args := append([]string{"serve", "-m", path, "--port", "0", "--kv-cache-memory", "8MiB", "--threads", "2",
				"--worker-timeout", "1s", "--workers", strings.Join(addrs, ",")}, c.flags...)
			addr := startProc(t, servingRe, args...)
			if complete(t, addr, "Once upon a time", 8) == "" {
				t.Fatal("no completion before the stall")
			}
			stopProc(t, victim)
			defer victim.Process.Signal(syscall.SIGCONT)
			client := &http.Client{Timeout: 60 * time.Second}
			body, _ := json.Marshal(map[string]any{"prompt": "The dog", "max_tokens": 8, "temperature": 0})
			start := time.Now()
			resp, err := client.Post("http://"+addr+"/v1/completions", "application/json", bytes.NewReader(body))
			if err != nil {
				t.Fatalf("after the stall: %v (in %v)", err, time.Since(start))
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			took := time.Since(start)
			t.Logf("%d in %v: %s", resp.StatusCode, took.Round(time.Millisecond), b)
			if resp.StatusCode < 500 || !strings.Contains(string(b), c.want) || !strings.Contains(string(b), "no answer within 2s") {
				t.Errorf("after the stall: %d %s (want %q, no answer within 2s)", resp.StatusCode, b, c.want)
			}
			if took > 20*time.Second {
				t.Errorf("the error took %v", took)
			}
			resp, err = client.Get("http://" + addr + "/v1/models")
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("the server after the stall: %v", err)
			}
			resp.Body.Close()
		})
	}
}
