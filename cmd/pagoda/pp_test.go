package main

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"

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
	byHand := startProc(t, servingRe, append(common, "--pipeline-parallel", "2", "--pipeline-micro-batches", "1", "--workers", w0+","+w1)...)
	for _, p := range []string{"Once upon a time", "The dog", "Lily and her mom went to the"} {
		want := complete(t, single, p, 24)
		if want == "" {
			t.Fatalf("%q: the single-process server generated nothing", p)
		}
		for name, addr := range map[string]string{"--pipeline-parallel 2": spawned, "--workers": byHand} {
			if got := complete(t, addr, p, 24); got != want {
				t.Errorf("%s: %q continues as %q, want %q", name, p, got, want)
			}
		}
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
		{[]string{"serve", "--pipeline-parallel", "2", "--tensor-parallel", "2", "--port", "0"}, "combining the two is not implemented"},
		{[]string{"serve", "--pipeline-parallel", "2", "--workers", "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", "--port", "0"}, "but 3 --workers"},
		{[]string{"serve", "--pipeline-parallel", "0", "--port", "0"}, "--pipeline-parallel 0"},
	} {
		code, _, stderr := pagoda(t, c.args...)
		if code == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("pagoda %v: exit %d, stderr %q (want %q)", c.args, code, stderr, c.want)
		}
	}
}
