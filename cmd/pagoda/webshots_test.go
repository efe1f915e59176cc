package main

import (
	"context"
	"encoding/json"
	"html"
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

	"pagoda/testutil"
)

// browse runs headless Chromium on a fresh profile with everything that
// would reach past the test server turned off, and returns its stdout.
func browse(t *testing.T, bin string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// --no-sandbox: test containers run as root, where Chromium's sandbox
	// refuses to start.
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
		"--user-data-dir=" + t.TempDir(), "--window-size=1400,900", "--virtual-time-budget=8000"}
	out, err := exec.CommandContext(ctx, bin, append(base, args...)...).Output()
	if err != nil {
		t.Fatalf("%s %v: %v", bin, args, err)
	}
	return out
}

var (
	pageAnswerRE = regexp.MustCompile(`<div class="msg assistant"><span class="role">assistant</span><span class="body">([^<]*)</span>`)
	pageBlocksRE = regexp.MustCompile(`(\d+) × 16 tokens: (\d+) in use`)
)

// TestWebScreenshots loads the web page of `pagoda serve` with no flags
// (the built-in model, its shipped chat template, the default KV budget)
// in headless Chromium: the page must answer a chat as the API does, and
// under a short load show the block map with blocks in use. It writes
// web-chat.png and web-blocks.png to $PAGODA_WEB_SHOTS (docs/web in the
// repository holds the committed ones; default a temporary folder).
func TestWebScreenshots(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test skipped in -short mode")
	}
	bin := testutil.Browser(t)
	base := startServe(t)
	dir := os.Getenv("PAGODA_WEB_SHOTS")
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	question := "Where is the ball?"
	want := apiChat(t, base, question)

	page := base + "/?prompt=" + strings.ReplaceAll(question, " ", "+") + "&autosend=1&max_tokens=48&temperature=0"
	dom := string(browse(t, bin, "--dump-dom", page))
	m := pageAnswerRE.FindStringSubmatch(dom)
	if m == nil || html.UnescapeString(m[1]) != want {
		t.Fatalf("the page's answer %q, want the API's %q", m, want)
	}
	if strings.Contains(dom, "msg assistant error") || strings.Contains(dom, "switched to text") {
		t.Fatal("the page's chat failed or fell back to text completion")
	}
	shot(t, bin, filepath.Join(dir, "web-chat.png"), page)

	stop := make(chan struct{})
	wg := keepBusy(t, base, stop)
	// The load must be running when the page polls the engine view.
	waitRunning(t, base)
	page = base + "/?prompt=Once+upon+a+time&autosend=1&max_tokens=48&temperature=0"
	dom = string(browse(t, bin, "--dump-dom", page))
	b := pageBlocksRE.FindStringSubmatch(dom)
	if b == nil || b[1] != "516" {
		close(stop)
		wg.Wait()
		t.Fatalf("block summary %q, want 516 blocks (the default budget of the built-in model)", b)
	}
	if n, _ := strconv.Atoi(b[2]); n == 0 {
		t.Errorf("no blocks in use under load: %q", b[0])
	}
	shot(t, bin, filepath.Join(dir, "web-blocks.png"), page)
	close(stop)
	wg.Wait()
	t.Logf("page answer %q; %s; screenshots in %s", want, b[0], dir)
}

// apiChat is the greedy answer of /v1/chat/completions to question.
func apiChat(t *testing.T, base, question string) string {
	t.Helper()
	body := `{"messages":[{"role":"user","content":` + strconv.Quote(question) + `}],"max_tokens":48,"temperature":0}`
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r struct {
		Choices []struct{ Message struct{ Content string } }
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || len(r.Choices) != 1 || r.Choices[0].Message.Content == "" {
		t.Fatalf("chat: %v %+v", err, r)
	}
	return r.Choices[0].Message.Content
}

func shot(t *testing.T, bin, path, page string) {
	t.Helper()
	browse(t, bin, "--screenshot="+path, page)
	if st, err := os.Stat(path); err != nil || st.Size() < 10000 {
		t.Fatalf("screenshot %s: %v", path, err)
	}
}

// keepBusy keeps eight long completions of different lengths running
// until stop is closed, so the block map has sequences to show.
func keepBusy(t *testing.T, base string, stop chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	for i := range 8 {
		body := `{"prompt":"Once upon a time there was a little dog","max_tokens":` + strconv.Itoa(200+100*i) + `,"ignore_eos":true,"temperature":0.8,"seed":` + strconv.Itoa(i) + `}`
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

// waitRunning waits until the engine has sequences running.
func waitRunning(t *testing.T, base string) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get(base + "/api/engine")
		if err != nil {
			t.Fatal(err)
		}
		var v struct {
			Running int `json:"running"`
		}
		err = json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		if err == nil && v.Running > 0 {
			return
		}
	}
	t.Fatal("the load did not start")
}
