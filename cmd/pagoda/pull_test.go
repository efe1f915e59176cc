package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"pagoda/testutil"
)

// stubHub serves one repository, own/stories, holding the stories260K
// GGUF, the way the hub's tree API and resolve route do. It counts the
// file downloads.
func stubHub(t *testing.T) (*httptest.Server, []byte, *atomic.Int32) {
	model, err := os.ReadFile(testutil.Shared(t, "models/gguf/stories260K.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(model)
	var gets atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/api/models/own/stories/tree/main":
			json.NewEncoder(w).Encode([]map[string]any{
				{"type": "file", "path": "README.md", "size": 5, "oid": "a"},
				{"type": "file", "path": "stories260K-F32.gguf", "size": len(model), "oid": "b",
					"lfs": map[string]any{"oid": hex.EncodeToString(sum[:]), "size": len(model)}},
			})
		case "/own/stories/resolve/main/stories260K-F32.gguf":
			gets.Add(1)
			http.ServeContent(w, r, "m.gguf", time.Time{}, bytes.NewReader(model))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, model, &gets
}

// TestPullRunListRm: run -m hf.co/... pulls on first use and reuses the
// cache afterwards; pull, list and rm work on the same cache.
func TestPullRunListRm(t *testing.T) {
	srv, model, gets := stubHub(t)
	cache := t.TempDir()
	env := []string{"HF_ENDPOINT=" + srv.URL, "PAGODA_MODELS=" + cache}
	want := "Once upon a time, there was a little girl named Lily. She loved to play"
	for i := 0; i < 2; i++ {
		code, out, errOut := pagodaEnv(t, env, "run", "-m", "hf.co/own/stories", "-p", "Once upon a time", "-n", "24", "--temp", "0")
		if code != 0 || !strings.HasPrefix(out, want) {
			t.Fatalf("run %d: exit %d, story %q\nstderr:\n%s", i, code, out, errOut)
		}
		if i == 0 && !strings.Contains(errOut, "pulled stories260K-F32.gguf: 1.1 MiB in") {
			t.Errorf("first run does not report the pull: %q", errOut)
		}
		if i == 1 && strings.Contains(errOut, "pull") {
			t.Errorf("second run pulled again: %q", errOut)
		}
	}
	if gets.Load() != 1 {
		t.Errorf("%d downloads, want 1 (the second run uses the cache)", gets.Load())
	}
	path := filepath.Join(cache, "hf.co", "own", "stories", "stories260K-F32.gguf")
	if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, model) {
		t.Fatalf("cached file differs from the hub's (%v)", err)
	}

	code, out, errOut := pagodaEnv(t, env, "pull", "hf.co/own/stories:Q4_K_M")
	if code != 1 || !strings.Contains(errOut, "no Q4_K_M file in the repository; it has F32") {
		t.Errorf("pull of a missing quant: exit %d, stderr %q", code, errOut)
	}
	code, out, errOut = pagodaEnv(t, env, "pull", "hf.co/own/stories:f32")
	if code != 0 || strings.TrimSpace(out) != path {
		t.Errorf("pull of a cached model: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, _ = pagodaEnv(t, env, "list")
	if code != 0 || !strings.Contains(out, "hf.co/own/stories:F32  1.1 MiB  "+path) {
		t.Errorf("list: exit %d:\n%s", code, out)
	}
	code, out, errOut = pagodaEnv(t, env, "rm", "hf.co/own/stories:F32")
	if code != 0 || !strings.Contains(out, "removed "+path) {
		t.Errorf("rm: exit %d, %q %q", code, out, errOut)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("rm left the file: %v", err)
	}
	code, _, errOut = pagodaEnv(t, env, "rm", "hf.co/own/stories:F32")
	if code != 1 || !strings.Contains(errOut, "not in the cache") {
		t.Errorf("second rm: exit %d, %q", code, errOut)
	}
	code, _, errOut = pagodaEnv(t, env, "list")
	if code != 0 || !strings.Contains(errOut, "no models in "+cache) {
		t.Errorf("list of an empty cache: exit %d, %q", code, errOut)
	}
}

// A plain pull to a non-terminal prints a few progress lines, then the path.
func TestPullPlainProgress(t *testing.T) {
	srv, _, _ := stubHub(t)
	cache := t.TempDir()
	code, out, errOut := pagodaEnv(t, []string{"HF_ENDPOINT=" + srv.URL, "PAGODA_MODELS=" + cache}, "pull", "hf.co/own/stories")
	if code != 0 || strings.TrimSpace(out) != filepath.Join(cache, "hf.co", "own", "stories", "stories260K-F32.gguf") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if !strings.HasPrefix(errOut, "pulling stories260K-F32.gguf (1.1 MiB)\n") || strings.Contains(errOut, "\r") ||
		strings.Count(errOut, "\n") > 6 || !strings.Contains(errOut, "pulled stories260K-F32.gguf: 1.1 MiB in") {
		t.Errorf("progress on a non-terminal:\n%s", errOut)
	}
}

func TestPullBadRef(t *testing.T) {
	for _, c := range []struct{ args, want string }{
		{"pull hf.co/own", "want hf.co/OWNER/REPO"},
		{"pull", "name a model"},
		{"run -m hf.co/a/b:Q4/x", "quantization"},
		{"rm nothing.gguf", "not a model in the cache"},
		{"rm ../x.gguf", "unsafe file path"},
	} {
		code, _, errOut := pagodaEnv(t, []string{"PAGODA_MODELS=" + t.TempDir()}, strings.Fields(c.args)...)
		if code != 1 || !strings.Contains(errOut, c.want) {
			t.Errorf("pagoda %s: exit %d, want 1 and %q in stderr: %q", c.args, code, c.want, errOut)
		}
	}
}
