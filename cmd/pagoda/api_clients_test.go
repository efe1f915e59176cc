package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// clientPackages are the official npm clients TestAPIClients drives.
var clientPackages = []string{"openai", "ollama", "@anthropic-ai/sdk"}

// nodeModules finds node and a node_modules folder holding the official
// clients, or skips: PAGODA_NODE_MODULES names the folder (default
// /tmp/pagoda-node/node_modules, made by `npm install openai@6 ollama
// @anthropic-ai/sdk` in /tmp/pagoda-node).
func nodeModules(t *testing.T) (node, mods string) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not installed: the official API clients cannot run")
	}
	mods = os.Getenv("PAGODA_NODE_MODULES")
	if mods == "" {
		mods = "/tmp/pagoda-node/node_modules"
	}
	for _, p := range clientPackages {
		if _, err := os.Stat(filepath.Join(mods, p, "package.json")); err != nil {
			t.Skipf("npm package %s not in %s (npm install openai@6 ollama @anthropic-ai/sdk there, or set PAGODA_NODE_MODULES)", p, mods)
		}
	}
	return node, mods
}

// startServe runs `pagoda serve` with args on a free loopback port and
// returns its base URL; the server is stopped when the test ends.
func startServe(t *testing.T, args ...string) string {
	t.Helper()
	base, _ := startServeLog(t, args...)
	return base
}

// startServeLog is startServe that also returns what the server has
// logged so far.
func startServeLog(t *testing.T, args ...string) (string, func() string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, append([]string{"serve", "--host", "127.0.0.1", "--port", "0"}, args...)...)
	cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+t.TempDir(), "HOME="+t.TempDir())
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 10 * time.Second
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	found := make(chan string, 1)
	var mu sync.Mutex
	var log bytes.Buffer
	logged := func() string {
		mu.Lock()
		defer mu.Unlock()
		return log.String()
	}
	go func() {
		re := regexp.MustCompile(`serving \S+ on (http://127\.0\.0\.1:\d+)`)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			mu.Lock()
			log.WriteString(sc.Text() + "\n")
			mu.Unlock()
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1]
			}
		}
		close(found)
	}()
	select {
	case u, ok := <-found:
		if !ok {
			t.Fatalf("pagoda serve exited before listening:\n%s", logged())
		}
		return u, logged
	case <-time.After(60 * time.Second):
		t.Fatalf("pagoda serve did not start within 60s")
	}
	return "", nil
}

// TestAPIClients runs the official openai, ollama and @anthropic-ai/sdk
// npm clients against `pagoda serve` of the built-in model with no model
// or cache flags (testdata/api_clients.js lists the calls); any failed
// check fails the test.
func TestAPIClients(t *testing.T) {
	node, mods := nodeModules(t)
	base := startServe(t)
	script, err := filepath.Abs("testdata/api_clients.js")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script, base, "stories260K")
	cmd.Env = append(os.Environ(), "NODE_PATH="+mods)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node clients: %v\n%s\n%s", err, out, stderr.String())
	}
	type result struct {
		API    string          `json:"api"`
		Name   string          `json:"name"`
		OK     bool            `json:"ok"`
		Detail json.RawMessage `json:"detail"`
	}
	pass, fail := map[string]int{}, map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var r result
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("node output %q: %v", line, err)
		}
		if r.OK {
			pass[r.API]++
		} else {
			fail[r.API]++
			t.Errorf("%s: %s: %s", r.API, r.Name, r.Detail)
		}
	}
	// Each client's calls must all have run: a script that stopped early
	// would otherwise pass on fewer checks.
	want := map[string]int{"openai": 10, "ollama": 10, "anthropic": 10}
	for api, n := range want {
		t.Logf("%s client: %d passed, %d failed", api, pass[api], fail[api])
		if pass[api]+fail[api] != n {
			t.Errorf("%s client: %d checks ran, want %d", api, pass[api]+fail[api], n)
		}
	}
}
