package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"pagoda/cluster"
	"pagoda/testutil"
)

// startProc starts the pagoda binary with args and returns the first
// submatch of re in its standard output or error, stopping it (SIGTERM,
// then SIGKILL) at the end of the test.
func startProc(t *testing.T, re *regexp.Regexp, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(cmd.Environ(), "XDG_CACHE_HOME="+t.TempDir(), "HOME="+t.TempDir())
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			log.WriteString(sc.Text() + "\n")
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
		}
	}()
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
		pw.Close()
	})
	select {
	case s := <-found:
		return s
	case <-time.After(60 * time.Second):
		t.Fatalf("pagoda %v did not start:\n%s", args, log.String())
	}
	return ""
}

var servingRe = regexp.MustCompile(`serving .* on http://(\S+) `)

func complete(t *testing.T, addr, prompt string, n int) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": n, "temperature": 0})
	resp, err := http.Post("http://"+addr+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || json.Unmarshal(b, &out) != nil || len(out.Choices) != 1 {
		t.Fatalf("completion: %d %s", resp.StatusCode, b)
	}
	return out.Choices[0].Text
}

// TestServeTensorParallel: `serve --tensor-parallel 2` (workers it starts
// itself) and `serve --workers` (workers started by hand, as a cluster
// manager would) answer greedy completions as the single-process server
// does, on the golden GQA llama.
func TestServeTensorParallel(t *testing.T) {
	if testing.Short() {
		t.Skip("starts five processes")
	}
	path := filepath.Join(testutil.Shared(t, "golden/models"), "g-llama-gqa.F32.gguf")
	common := []string{"serve", "-m", path, "--port", "0", "--kv-cache-memory", "8MiB", "--threads", "2"}
	single := startProc(t, servingRe, common...)
	spawned := startProc(t, servingRe, append(common, "--tensor-parallel", "2")...)
	listen := regexp.MustCompile(regexp.QuoteMeta(cluster.ListenLine) + `(\S+)`)
	w0 := startProc(t, listen, "worker", "--listen", "127.0.0.1:0", "-m", path, "--threads", "1")
	w1 := startProc(t, listen, "worker", "--listen", "127.0.0.1:0", "-m", path, "--threads", "1")
	byHand := startProc(t, servingRe, append(common, "--workers", w0+","+w1)...)
	for _, p := range []string{"Once upon a time", "The dog"} {
		want := complete(t, single, p, 20)
		for name, addr := range map[string]string{"--tensor-parallel 2": spawned, "--workers": byHand} {
			if got := complete(t, addr, p, 20); got != want {
				t.Errorf("%s: %q continues as %q, want %q", name, p, got, want)
			}
		}
	}
}

// TestServeTensorParallelRefusals: what cannot split is refused before
// serving, naming the reason.
func TestServeTensorParallelRefusals(t *testing.T) {
	moe := filepath.Join(testutil.Shared(t, "golden/models"), "g-deepseek2.Q8_0.gguf")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "-m", moe, "--tensor-parallel", "2", "--port", "0"}, "do not split yet"},
		{[]string{"serve", "--workers", "127.0.0.1:1", "--port", "0"}, "one worker is no group"},
		{[]string{"serve", "--tensor-parallel", "0", "--port", "0"}, "--tensor-parallel 0"},
		{[]string{"serve", "--tensor-parallel", "3", "--workers", "127.0.0.1:1,127.0.0.1:2", "--port", "0"}, "but 2 --workers"},
	} {
		code, _, stderr := pagoda(t, c.args...)
		if code == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("pagoda %v: exit %d, stderr %q (want %q)", c.args, code, stderr, c.want)
		}
	}
}

// TestRunTensorParallel: `run --tensor-parallel 2` prints what the
// single-process run prints, greedy.
func TestRunTensorParallel(t *testing.T) {
	path := filepath.Join(testutil.Shared(t, "golden/models"), "g-llama-gqa.F32.gguf")
	args := []string{"run", "-m", path, "-p", "Once upon a time", "-n", "24", "--temp", "0"}
	code, want, stderr := pagoda(t, args...)
	if code != 0 {
		t.Fatalf("run: exit %d: %s", code, stderr)
	}
	code, got, stderr := pagoda(t, append(args, "--tensor-parallel", "2")...)
	if code != 0 || got != want {
		t.Fatalf("run --tensor-parallel 2: exit %d, printed %q, want %q\n%s", code, got, want, stderr)
	}
	code, _, stderr = pagoda(t, append(args, "--tensor-parallel", "2", "--kv-dtype", "q8_0")...)
	if code == 0 || !strings.Contains(stderr, "--tensor-parallel/--workers run the default KV cache") {
		t.Errorf("run --tensor-parallel with --kv-dtype: exit %d, %s", code, stderr)
	}
}

// TestWireDTypeFlag: `run --tensor-parallel 2 --wire-dtype f16/bf16` on
// stories260K prints what one process prints (its greedy tokens stay the
// same over these 32 tokens: the rounding moves logits by ~1e-2), and a
// wire form that is unknown, that has no workers to travel between, or
// that a hand-started worker was pinned against is refused by name.
func TestWireDTypeFlag(t *testing.T) {
	path := filepath.Join(testutil.Shared(t, "models/gguf"), "stories260K.gguf")
	args := []string{"run", "-m", path, "-p", "Once upon a time", "-n", "32", "--temp", "0"}
	code, want, stderr := pagoda(t, args...)
	if code != 0 || want == "" {
		t.Fatalf("run: exit %d: %s", code, stderr)
	}
	for _, d := range []string{"f16", "bf16"} {
		code, got, stderr := pagoda(t, append(args, "--tensor-parallel", "2", "--wire-dtype", d)...)
		if code != 0 || got != want {
			t.Errorf("run --tensor-parallel 2 --wire-dtype %s: exit %d, printed %q, want %q\n%s", d, code, got, want, stderr)
		}
	}
	listen := regexp.MustCompile(regexp.QuoteMeta(cluster.ListenLine) + `(\S+)`)
	w0 := startProc(t, listen, "worker", "--listen", "127.0.0.1:0", "-m", path, "--threads", "1", "--wire-dtype", "bf16")
	w1 := startProc(t, listen, "worker", "--listen", "127.0.0.1:0", "-m", path, "--threads", "1")
	for _, c := range []struct {
		args []string
		want string
	}{
		{append(args, "--tensor-parallel", "2", "--wire-dtype", "fp8"), `wire dtype "fp8"`},
		{append(args, "--wire-dtype", "f16"), "activations travel only between workers"},
		{append(args, "--workers", w0+","+w1, "--wire-dtype", "f16"), "asks for f16 activations on the wire, this worker is started with --wire-dtype bf16"},
	} {
		code, _, stderr := pagoda(t, c.args...)
		if code == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("pagoda %v: exit %d, stderr %q (want %q)", c.args[len(args):], code, stderr, c.want)
		}
	}
}

// TestBenchGroup: `bench --tensor-parallel 2` and `--pipeline-parallel 2`
// measure pp, tg and batched tg through worker processes (the coordinator
// planning each step's KV), reporting every test with the group's name
// and threads; KV formats the workers do not take are refused.
func TestBenchGroup(t *testing.T) {
	path := filepath.Join(testutil.Shared(t, "models/gguf"), "stories260K.gguf")
	for _, mode := range []string{"--tensor-parallel", "--pipeline-parallel"} {
		args := []string{"bench", "-m", path, "-p", "16", "-n", "8", "-s", "1,2", "-r", "2", "-t", "2", "-bw", "0", "--json", mode, "2"}
		code, out, stderr := pagoda(t, args...)
		if code != 0 {
			t.Fatalf("bench %s 2: exit %d: %s", mode, code, stderr)
		}
		var rs []struct {
			Model   string    `json:"model"`
			Test    string    `json:"test"`
			Threads int       `json:"threads"`
			Tokens  int       `json:"n_tokens"`
			Samples []float64 `json:"samples_ts"`
			Mean    float64   `json:"avg_ts"`
			Params  int64     `json:"params"`
		}
		if err := json.Unmarshal([]byte(out), &rs); err != nil {
			t.Fatalf("bench %s 2: %v\n%s", mode, err, out)
		}
		var tests []string
		for _, r := range rs {
			tests = append(tests, fmt.Sprintf("%s:%d", r.Test, r.Tokens))
			tag := map[string]string{"--tensor-parallel": " tp2", "--pipeline-parallel": " pp2"}[mode]
			if !strings.HasSuffix(r.Model, tag) || r.Threads != 2 || len(r.Samples) != 2 || !(r.Mean > 0) || r.Params < 200000 {
				t.Errorf("bench %s 2: %+v", mode, r)
			}
		}
		if got := strings.Join(tests, " "); got != "pp16:16 tg8:8 tg8x2:16" {
			t.Errorf("bench %s 2: tests %s", mode, got)
		}
		t.Logf("bench %s 2: %s", mode, out)
	}
	code, _, stderr := pagoda(t, "bench", "-m", path, "-p", "16", "-n", "0", "--tensor-parallel", "2", "--kv-dtype", "q8_0")
	if code == 0 || !strings.Contains(stderr, "--kv-dtype is not carried") {
		t.Errorf("bench --tensor-parallel 2 --kv-dtype q8_0: exit %d, %s", code, stderr)
	}
}
