package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"pagoda/cluster"
	"pagoda/testutil"
)

// TestServePipelineParallel: `serve --pipeline-parallel 2` (workers it
// starts itself, steps in micro-batches) and `serve --pipeline-parallel 2
// --workers` (workers started by hand, whole steps) answer greedy
// completions as the single-process server does, on the golden
// two-layer llama.
func TestServePipelineParallel(t *testing.T) {
	if testing.Short() {
		t.Skip("starts five processes")
	}
	path := filepath.Join(testutil.Shared(t, "golden/models"), "g-llama3-ropefreqs.F32.gguf")
	common := []string{"serve", "-m", path, "--port", "0", "--kv-cache-memory", "8MiB", "--threads", "2"}
	single := startProc(t, servingRe, common...)
	spawned := startProc(t, servingRe, append(common, "--pipeline-parallel", "2")...)
	listen := regexp.MustCompile(regexp.QuoteMeta(cluster.ListenLine) + `(\S+)`)
	w0 := startProc(t, listen, "worker", "--listen", "127.0.0.1:0", "-m", path, "--threads", "1")
	w1 := startProc(t, listen, "worker", "--listen", "127.0.0.1:0", "-m", path, "--threads", "1")
	byHand := startProc(t, servingRe, append(common, "--pipeline-parallel", "2", "--pipeline-micro-batches", "1", "--pipeline-inflight", "1",
		"--workers", w0+","+w1)...)
	prompts := []string{"Once upon a time", "The dog", "Lily and her mom went to the", "Tom saw a big", "One day, the sun"}
	want := make([]string, len(prompts))
	for i, p := range prompts {
		if want[i] = complete(t, single, p, 24); want[i] == "" {
			t.Fatalf("%q: the single-process server generated nothing", p)
		}
	}
	for name, addr := range map[string]string{"--pipeline-parallel 2 (2 steps in flight)": spawned, "--workers (1 in flight)": byHand} {
		// All at once, so the spawned pipeline holds two steps.
		got := make([]string, len(prompts))
		var wg sync.WaitGroup
		for i, p := range prompts {
			wg.Go(func() { got[i] = complete(t, addr, p, 24) })
		}
		wg.Wait()
		for i, p := range prompts {
			if got[i] != want[i] {
				t.Errorf("%s: %q continues as %q, want %q", name, p, got[i], want[i])
			}
		}
	}
	if m := metric(t, spawned, "pagoda_pipeline_steps_in_flight_max"); m != 2 {
		t.Errorf("spawned: pagoda_pipeline_steps_in_flight_max %v, want 2", m)
	}
	if m := metric(t, byHand, "pagoda_pipeline_steps_in_flight_max"); m != 1 {
		t.Errorf("--pipeline-inflight 1: pagoda_pipeline_steps_in_flight_max %v, want 1", m)
	}
	if b := metric(t, spawned, "pagoda_pipeline_bubble_fraction"); b <= 0 || b >= 1 {
		t.Errorf("pagoda_pipeline_bubble_fraction %v, want in (0, 1)", b)
	}
}

// TestServePipelineParallelRefusals: what cannot run as a pipeline is
// refused before serving, naming the reason.
func TestServePipelineParallelRefusals(t *testing.T) {
	path := filepath.Join(testutil.Shared(t, "golden/models"), "g-llama3-ropefreqs.F32.gguf")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "-m", path, "--pipeline-parallel", "3", "--port", "0"}, "3 stages for a model of 2 layers"},
		{[]string{"serve", "--pipeline-parallel", "2", "--workers", "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", "--port", "0"}, "but 3 --workers"},
		{[]string{"serve", "--pipeline-parallel", "0", "--port", "0"}, "--pipeline-parallel 0"},
		{[]string{"serve", "-m", path, "--pipeline-parallel", "2", "--pipeline-inflight", "-1", "--port", "0"}, "--pipeline-inflight -1 out of range"},
	} {
		code, _, stderr := pagoda(t, c.args...)
		if code == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("pagoda %v: exit %d, stderr %q (want %q)", c.args, code, stderr, c.want)
		}
	}
}

// TestServePipelineStageDies: a stage worker killed (SIGKILL) between
// requests makes the next completion fail at once with an error naming
// the pipeline, and the server stays up and answers.
func TestServePipelineStageDies(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three processes")
	}
	path := filepath.Join(testutil.Shared(t, "golden/models"), "g-llama-mqa.F16.gguf")
	listen := regexp.MustCompile(regexp.QuoteMeta(cluster.ListenLine) + `(\S+)`)
	w0 := startProc(t, listen, "worker", "--listen", "127.0.0.1:0", "-m", path, "--threads", "1")
	victim := exec.Command(bin, "worker", "--listen", "127.0.0.1:0", "-m", path, "--threads", "1")
	out, err := victim.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { victim.Process.Kill(); victim.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, out)
	w1 := listen.FindStringSubmatch(line)[1]
	addr := startProc(t, servingRe, "serve", "-m", path, "--port", "0", "--kv-cache-memory", "8MiB", "--threads", "2",
		"--pipeline-parallel", "2", "--workers", w0+","+w1)
	if complete(t, addr, "Once upon a time", 8) == "" {
		t.Fatal("no completion before the stage died")
	}
	victim.Process.Kill()
	victim.Wait()
	client := &http.Client{Timeout: 30 * time.Second}
	body, _ := json.Marshal(map[string]any{"prompt": "The dog", "max_tokens": 8, "temperature": 0})
	start := time.Now()
	resp, err := client.Post("http://"+addr+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("after the stage died: %v (in %v)", err, time.Since(start))
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode < 500 || !strings.Contains(string(b), "pipeline parallel: stage") {
		t.Errorf("after the stage died: %d %s", resp.StatusCode, b)
	}
	t.Logf("after the stage died: %d in %v: %s", resp.StatusCode, time.Since(start).Round(time.Millisecond), b)
	resp, err = client.Get("http://" + addr + "/v1/models")
	if err != nil {
		t.Fatalf("the server after the stage died: %v", err)
	}
	resp.Body.Close()
}
