package server

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"pagoda/engine"
	"pagoda/testutil"
)

// startRealServer serves stories260K through Serve (so the loopback Host
// check applies, as under pagoda serve) with a small KV pool, so that the
// block picture has something to show.
func startRealServer(t *testing.T) string {
	t.Helper()
	m, eng := storiesEngine(t, testutil.Shared(t, "models/gguf/stories260K.gguf"), func(c *engine.Config) { c.KVBlocks = 128 })
	c := m.Config
	// stories260K has no chat template; a plain one keeps the page on the
	// chat endpoint (the page's text fallback is not what is tested here).
	be, err := NewEngineBackend(eng, m.Tokenizer(), "stories260K", c.ContextLen,
		"{% for m in messages %}{{ m.content }}{% endfor %}")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = New(be, Options{Engine: eng}).Serve(ctx, ln, time.Second)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return "http://" + ln.Addr().String()
}

// load keeps a few long completions running until stop is closed, so the
// engine view has running requests and held blocks to show.
func load(t *testing.T, base string, stop chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	body := `{"prompt":"Once upon a time there was a little dog","max_tokens":400,"ignore_eos":true,"temperature":0}`
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
				if err != nil {
					t.Errorf("load: %v", err)
					return
				}
				resp.Body.Close()
			}
		}()
	}
	return &wg
}

func shotDir(t *testing.T) string {
	if d := os.Getenv("PAGODA_WEB_SHOTS"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	return t.TempDir()
}

func runBrowser(t *testing.T, bin string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// --no-sandbox: test containers run as root, where Chromium's sandbox
	// refuses to start.
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
		"--user-data-dir=" + t.TempDir(), "--window-size=1400,900", "--virtual-time-budget=8000"}
	out, err := exec.CommandContext(ctx, bin, append(base, args...)...).Output()
	if err != nil {
		t.Fatalf("%s %v: %v", bin, args, err)
	}
	return out
}

var (
	assistantRE = regexp.MustCompile(`<div class="msg assistant"><span class="role">assistant</span><span class="body">([^<]*)</span>`)
	statRE      = regexp.MustCompile(`<dd id="s-([a-z]+)">([^<]*)</dd>`)
)

// TestBrowserChat loads the page in headless Chromium, which sends a chat
// message given in the URL, streams the answer, and polls the engine view
// while other requests keep the engine busy.
func TestBrowserChat(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test skipped in -short mode")
	}
	bin := testutil.Browser(t)
	base := startRealServer(t)
	stop := make(chan struct{})
	wg := load(t, base, stop)
	defer wg.Wait()
	defer close(stop)

	page := base + "/?prompt=Once+upon+a+time&autosend=1&max_tokens=48&temperature=0"
	dom := string(runBrowser(t, bin, "--dump-dom", page))
	dir := shotDir(t)
	if err := os.WriteFile(filepath.Join(dir, "web-dom.html"), []byte(dom), 0o644); err != nil {
		t.Fatal(err)
	}
	m := assistantRE.FindStringSubmatch(dom)
	if m == nil || len(strings.Fields(m[1])) < 3 {
		t.Fatalf("no streamed assistant text in the page (DOM in %s): %q", dir, m)
	}
	if strings.Contains(dom, "msg assistant error") || strings.Contains(dom, "switched to text") {
		t.Fatalf("the chat request failed or fell back (DOM in %s)", dir)
	}
	t.Logf("assistant: %q", m[1])
	stats := map[string]string{}
	for _, s := range statRE.FindAllStringSubmatch(dom, -1) {
		stats[s[1]] = s[2]
	}
	for _, k := range []string{"steps", "gen", "running", "batch"} {
		if n, err := strconv.ParseFloat(strings.TrimSuffix(stats[k], "k"), 64); err != nil || n <= 0 {
			t.Errorf("engine view %s = %q under load, want a positive number (all: %v)", k, stats[k], stats)
		}
	}
	if !regexp.MustCompile(`128 × 16 tokens: [1-9]\d* in use`).MatchString(dom) {
		t.Errorf("block summary missing or shows no blocks in use (DOM in %s)", dir)
	}

	shot := filepath.Join(dir, "web.png")
	runBrowser(t, bin, "--screenshot="+shot, page)
	if st, err := os.Stat(shot); err != nil || st.Size() < 10000 {
		t.Fatalf("screenshot %s: %v", shot, err)
	}
	t.Logf("screenshot: %s; DOM: %s", shot, filepath.Join(dir, "web-dom.html"))
}
