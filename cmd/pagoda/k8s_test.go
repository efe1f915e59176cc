package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"pagoda/cluster"
	"pagoda/testutil"
)

// manifestArgs reads the args of the container running `pagoda sub` in
// a deploy/k8s manifest: the flow sequence after "args:", which is JSON.
func manifestArgs(t *testing.T, file, sub string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("../../deploy/k8s/statefulset", file))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "args: [")
	end := strings.Index(rest, "]")
	if !ok || end < 0 {
		t.Fatalf("%s: no args: [...]", file)
	}
	var args []string
	if err := json.Unmarshal([]byte("["+rest[:end+1]), &args); err != nil {
		t.Fatalf("%s: args: %v", file, err)
	}
	if len(args) == 0 || args[0] != sub {
		t.Fatalf("%s: args %q do not run pagoda %s", file, args, sub)
	}
	return args
}

// setFlag replaces the value after flag name in args.
func setFlag(t *testing.T, args []string, name, val string) {
	t.Helper()
	for i := range args[:len(args)-1] {
		if args[i] == name {
			args[i+1] = val
			return
		}
	}
	t.Fatalf("args %q have no %s", args, name)
}

// TestK8sManifestCommands: the commands the Kubernetes manifests run
// (deploy/k8s/statefulset), with only the addresses, the model file and
// the KV budget swapped for this machine's, form a group that serves the
// single-process server's greedy completions: the flags are real and fit
// together (deploy/k8s/validate checks the manifests' API schema).
func TestK8sManifestCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("starts four processes")
	}
	path := filepath.Join(testutil.Shared(t, "golden/models"), "g-llama-gqa.F32.gguf")
	listen := regexp.MustCompile(regexp.QuoteMeta(cluster.ListenLine) + `(\S+)`)
	wargs := manifestArgs(t, "workers.yaml", "worker")
	setFlag(t, wargs, "--listen", "127.0.0.1:0")
	setFlag(t, wargs, "-m", path)
	sargs := manifestArgs(t, "coordinator.yaml", "serve")
	n := len(strings.Split(sargs[indexOf(sargs, "--workers")+1], ","))
	var addrs []string
	for range n {
		addrs = append(addrs, startProc(t, listen, append(wargs, "--threads", "1")...))
	}
	setFlag(t, sargs, "--workers", strings.Join(addrs, ","))
	setFlag(t, sargs, "-m", path)
	setFlag(t, sargs, "--host", "127.0.0.1")
	setFlag(t, sargs, "--port", "0")
	setFlag(t, sargs, "--kv-cache-memory", "8MiB")
	group := startProc(t, servingRe, sargs...)
	single := startProc(t, servingRe, "serve", "-m", path, "--port", "0", "--kv-cache-memory", "8MiB", "--threads", "1")
	for _, p := range []string{"Once upon a time", "The dog"} {
		got, want := complete(t, group, p, 16), complete(t, single, p, 16)
		t.Logf("%q: %q (workers %v)", p, got, addrs)
		if got != want {
			t.Errorf("%q: the manifests' group continues %q, one process %q", p, got, want)
		}
	}
}

func indexOf(args []string, s string) int {
	for i, a := range args {
		if a == s {
			return i
		}
	}
	return -1
}
