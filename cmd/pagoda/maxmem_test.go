package main

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"pagoda/cluster"
	"pagoda/model"
	"pagoda/synth"
)

// capModel writes a synthetic F32 llama of 4 layers whose weight
// matrices (3.5 MiB) exceed capFlag while half of them, with a small KV
// cache, fit: the model one capped worker cannot hold. It returns the
// path and the bytes of its weight matrices.
func capModel(t *testing.T) (string, int64) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "cap-llama.gguf")
	sh := synth.Shape{Arch: "llama", Layers: 4, Dim: 128, Heads: 4, KVHeads: 2, HeadDim: 32, FFN: 384, Vocab: 512,
		Context: 256, RopeTheta: 10000, RMSEps: 1e-5}
	if err := synth.Write(path, synth.Options{Shape: sh, Seed: 19, Std: 0.08}); err != nil {
		t.Fatal(err)
	}
	m, err := model.Open(path, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	w := m.WeightBytes()
	if w <= capBytes || w/2 >= capBytes {
		t.Fatalf("weights %d bytes: want over the cap %d and half of them under it", w, capBytes)
	}
	return path, w
}

const (
	capFlag  = "2.5MiB"
	capBytes = 5 << 19
)

// TestMaxMemoryRun: `run --max-memory` refuses the model in one process,
// naming the bytes it needs (weights + its one-context f32 cache), the cap
// and the fix, before loading it; with the same cap on each of two
// workers (spawned by run, the cap passed on), --tensor-parallel 2 and
// --pipeline-parallel 2 generate the uncapped process's greedy tokens.
func TestMaxMemoryRun(t *testing.T) {
	path, weights := capModel(t)
	args := []string{"run", "-m", path, "-p", "Once upon a time", "-n", "24", "--temp", "0", "--json", "--threads", "1"}
	code, want, stderr := pagoda(t, args...)
	if code != 0 || strings.Count(want, `"id"`) != 24 {
		t.Fatalf("run: exit %d, printed %q: %s", code, want, stderr)
	}
	kv := int64(4 * 256 * 2 * 32 * 4 * 2) // layers × context × kv heads × head dim × f32 × K and V
	code, _, stderr = pagoda(t, append(args, "--max-memory", capFlag)...)
	for _, s := range []string{fmt.Sprintf("needs %d bytes", weights+kv), fmt.Sprintf("cap of %d bytes", capBytes),
		"--max-memory " + capFlag, "use --tensor-parallel 2 or --pipeline-parallel 2"} {
		if code == 0 || !strings.Contains(stderr, s) {
			t.Errorf("run --max-memory %s: exit %d, stderr %q lacks %q", capFlag, code, stderr, s)
		}
	}
	for _, split := range [][]string{{"--tensor-parallel", "2"}, {"--pipeline-parallel", "2"}} {
		code, got, stderr := pagoda(t, append(append(args, "--max-memory", capFlag), split...)...)
		if code != 0 || got != want {
			t.Errorf("run %s --max-memory %s: exit %d, printed\n%s\nwant\n%s\n%s", split[0], capFlag, code, got, want, stderr)
		}
	}
	// bench in one process counts the weights (its KV is sized per test).
	code, _, stderr = pagoda(t, "bench", "-m", path, "-p", "8", "-n", "0", "-r", "1", "-bw", "0", "--max-memory", capFlag)
	if code == 0 || !strings.Contains(stderr, fmt.Sprintf("needs %d bytes", weights)) {
		t.Errorf("bench --max-memory %s: exit %d, %s", capFlag, code, stderr)
	}
	// The cap reaches the spawned workers: one that fits the coordinator's
	// own shard but not a worker's shard plus its KV storage.
	code, _, stderr = pagoda(t, "serve", "-m", path, "--port", "0", "--threads", "2", "--kv-cache-memory", "2MiB",
		"--tensor-parallel", "2", "--max-memory", capFlag)
	if code == 0 || !strings.Contains(stderr, "this worker's --max-memory") || !strings.Contains(stderr, fmt.Sprintf("cap of %d bytes", capBytes)) {
		t.Errorf("serve --tensor-parallel 2 with a KV cache over the workers' cap: exit %d, %s", code, stderr)
	}
}

// TestMaxMemoryServe: `serve --max-memory` refuses the model in one
// process; two `pagoda worker --max-memory` started by hand serve it as
// tensor-parallel ranks, and `serve --pipeline-parallel 2 --max-memory`
// as two spawned stages, with the uncapped server's greedy completions.
func TestMaxMemoryServe(t *testing.T) {
	if testing.Short() {
		t.Skip("starts six processes")
	}
	path, _ := capModel(t)
	common := []string{"serve", "-m", path, "--port", "0", "--kv-cache-memory", "512KiB", "--threads", "2"}
	code, _, stderr := pagoda(t, append(common, "--max-memory", capFlag)...)
	if code == 0 || !strings.Contains(stderr, fmt.Sprintf("cap of %d bytes", capBytes)) || !strings.Contains(stderr, "--tensor-parallel 2") {
		t.Fatalf("serve --max-memory %s in one process: exit %d, %s", capFlag, code, stderr)
	}
	// Without --kv-cache-memory, the default KV budget is sized from what
	// the cap leaves beside the weights (5 MiB − 3.5 MiB), not from the
	// machine.
	room := startProc(t, regexp.MustCompile(`capped at 25% of the (\S+ \S+) available`), "serve", "-m", path, "--port", "0", "--threads", "1", "--max-memory", "5MiB")
	if room != "1.5 MiB" {
		t.Errorf("serve --max-memory 5MiB sized its KV cache from %s, want the 1.5 MiB the cap leaves", room)
	}
	single := startProc(t, servingRe, common...)
	listen := regexp.MustCompile(regexp.QuoteMeta(cluster.ListenLine) + `(\S+)`)
	w0 := startProc(t, listen, "worker", "--listen", "127.0.0.1:0", "-m", path, "--threads", "1", "--max-memory", capFlag)
	w1 := startProc(t, listen, "worker", "--listen", "127.0.0.1:0", "-m", path, "--threads", "1", "--max-memory", capFlag)
	tp := startProc(t, servingRe, append(common, "--workers", w0+","+w1, "--max-memory", capFlag)...)
	pp := startProc(t, servingRe, append(common, "--pipeline-parallel", "2", "--max-memory", capFlag)...)
	for _, p := range []string{"Once upon a time", "The dog"} {
		want := complete(t, single, p, 24)
		if want == "" {
			t.Fatalf("%q: the single-process server generated nothing", p)
		}
		for name, addr := range map[string]string{"tensor parallel": tp, "pipeline parallel": pp} {
			if got := complete(t, addr, p, 24); got != want {
				t.Errorf("%s: %q continues as %q, want %q", name, p, got, want)
			}
		}
	}
}
