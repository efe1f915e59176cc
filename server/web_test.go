package server

import (
	"context"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"pagoda/engine"
	"pagoda/kvcache"
)

func get(t *testing.T, ts *httptest.Server, path string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest("GET", ts.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

func TestWebPage(t *testing.T) {
	ts := startServer(t, newFake(), Options{APIKey: "k"})
	for path, want := range map[string]string{
		"/":                 "text/html",
		"/static/app.js":    "text/javascript",
		"/static/style.css": "text/css",
	} {
		resp, b := get(t, ts, path)
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), want) {
			t.Errorf("%s: %d %q, want 200 %s", path, resp.StatusCode, resp.Header.Get("Content-Type"), want)
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
			t.Errorf("%s: CSP %q", path, csp)
		}
		if len(b) < 500 {
			t.Errorf("%s: only %d bytes", path, len(b))
		}
	}
	_, b := get(t, ts, "/")
	for _, ref := range []string{`src="static/app.js"`, `href="static/style.css"`, `id="blocks"`, `id="spark"`, `id="stop"`} {
		if !strings.Contains(string(b), ref) {
			t.Errorf("index.html lacks %s", ref)
		}
	}
	for _, path := range []string{"/static/nope.js", "/index.html.bak", "/static/../server.go"} {
		if resp, _ := get(t, ts, path); resp.StatusCode != 404 {
			t.Errorf("%s: %d, want 404", path, resp.StatusCode)
		}
	}
}

// TestWebNoExternalRefs keeps the page self-contained: no CDN, no fonts,
// no analytics, nothing a server without internet access cannot serve.
func TestWebNoExternalRefs(t *testing.T) {
	n := 0
	err := fs.WalkDir(webFiles, "web", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := webFiles.ReadFile(path)
		if err != nil {
			return err
		}
		n++
		for _, bad := range []string{"http://", "https://", "//cdn", "@import", "url("} {
			if strings.Contains(string(b), bad) {
				t.Errorf("%s refers to %q", path, bad)
			}
		}
		return nil
	})
	if err != nil || n != 4 { // index.html, app.js, style.css, favicon.png
		t.Fatalf("walked %d files: %v", n, err)
	}
}

type fakeViewer struct {
	st     engine.Stats
	blocks kvcache.BlockMap
}

func (f *fakeViewer) Stats() engine.Stats { return f.st }
func (f *fakeViewer) Blocks(ctx context.Context) (kvcache.BlockMap, error) {
	return f.blocks, nil
}

func TestEngineEndpoint(t *testing.T) {
	fv := &fakeViewer{
		st: engine.Stats{Running: 2, Waiting: 3, RunningSeqs: 4, KVUsage: 0.5, PrefixQueries: 40, PrefixHits: 10,
			Steps: 7, PromptTokens: 40, GenerationTokens: 21, BatchedTokens: 61, Preemptions: 1,
			KV: kvcache.Usage{Blocks: 4, Used: 2, Free: 2, Cached: 2, CachedFree: 1, BlockSize: 16}},
		blocks: kvcache.BlockMap{BlockSize: 16,
			State: []kvcache.BlockState{kvcache.BlockUsed, kvcache.BlockShared, kvcache.BlockCached, kvcache.BlockFree},
			Owner: []int32{5, 5, -1, -1}},
	}
	ts := startServer(t, newFake(), Options{APIKey: "secret", Engine: fv})
	if resp, _ := get(t, ts, "/api/engine"); resp.StatusCode != 401 {
		t.Fatalf("no key: %d, want 401", resp.StatusCode)
	}
	if resp, _ := get(t, ts, "/api/engine", "Authorization", "Bearer wrong"); resp.StatusCode != 401 {
		t.Fatalf("wrong key: %d, want 401", resp.StatusCode)
	}
	resp, b := get(t, ts, "/api/engine", "Authorization", "Bearer secret")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("%d %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	v := decode[engineView](t, b)
	if v.Running != 2 || v.Waiting != 3 || v.RunningSeqs != 4 || v.Steps != 7 || v.GenerationTokens != 21 ||
		v.BatchedTokens != 61 || v.PrefixHitRate != 0.25 || v.KV.Blocks != 4 || v.KV.CachedFree != 1 ||
		v.KV.BlockSize != 16 || v.KV.Usage != 0.5 || v.Model != "fake-model" || v.TimeMS == 0 {
		t.Errorf("view %+v", v)
	}
	if v.Blocks != nil {
		t.Errorf("blocks sent without ?blocks=1: %+v", v.Blocks)
	}
	_, b = get(t, ts, "/api/engine?blocks=1", "Authorization", "Bearer secret")
	v = decode[engineView](t, b)
	if v.Blocks == nil || v.Blocks.State != "2310" || len(v.Blocks.Owner) != 4 || v.Blocks.Owner[0] != 5 {
		t.Errorf("blocks %+v", v.Blocks)
	}
	// The page itself stays public; only its data is behind the key.
	if resp, _ := get(t, ts, "/"); resp.StatusCode != 200 {
		t.Errorf("page: %d", resp.StatusCode)
	}

	none := startServer(t, newFake(), Options{})
	if resp, _ := get(t, none, "/api/engine"); resp.StatusCode != 404 {
		t.Errorf("no engine: %d, want 404", resp.StatusCode)
	}
}

func TestWebFavicon(t *testing.T) {
	ts := startServer(t, newFake(), Options{})
	for _, p := range []string{"/favicon.ico", "/static/favicon.png"} {
		resp, err := http.Get(ts.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "image/png" || len(b) < 8 || string(b[1:4]) != "PNG" {
			t.Fatalf("%s: %d %s %d bytes", p, resp.StatusCode, resp.Header.Get("Content-Type"), len(b))
		}
	}
}
