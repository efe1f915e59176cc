package hub

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeHub imitates the hub's tree API and resolve route, and optionally a
// CDN on another server that the resolve route redirects to.
type fakeHub struct {
	hub, cdn *httptest.Server
	files    map[string][]byte // repository path -> content
	sha      map[string]string // overrides the listed sha256
	redirect bool
	dropOnce int64 // if > 0, the first file response is cut after this many bytes

	mu       sync.Mutex
	hubAuth  []string // Authorization of each hub request
	cdnAuth  []string
	ranges   []string // Range of each file request
	fileGets int
}

func newFakeHub(t *testing.T, files map[string][]byte) *fakeHub {
	f := &fakeHub{files: files, sha: map[string]string{}}
	f.hub = httptest.NewServer(http.HandlerFunc(f.serveHub))
	f.cdn = httptest.NewServer(http.HandlerFunc(f.serveFile))
	t.Cleanup(f.hub.Close)
	t.Cleanup(f.cdn.Close)
	return f
}

func (f *fakeHub) serveHub(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.hubAuth = append(f.hubAuth, r.Header.Get("Authorization"))
	f.mu.Unlock()
	if r.URL.Path == "/api/models/own/repo/tree/main" && r.URL.Query().Get("recursive") == "true" {
		var tree []map[string]any
		tree = append(tree, map[string]any{"type": "directory", "path": "sub", "size": 0, "oid": "x"})
		for p, b := range f.files {
			sum := sha256.Sum256(b)
			oid := hex.EncodeToString(sum[:])
			if s, ok := f.sha[p]; ok {
				oid = s
			}
			tree = append(tree, map[string]any{"type": "file", "path": p, "size": len(b), "oid": "gitsha1",
				"lfs": map[string]any{"oid": oid, "size": len(b), "pointerSize": 134}})
		}
		json.NewEncoder(w).Encode(tree)
		return
	}
	if p, ok := strings.CutPrefix(r.URL.Path, "/own/repo/resolve/main/"); ok {
		if f.redirect {
			http.Redirect(w, r, f.cdn.URL+"/cdn/"+p, http.StatusFound)
			return
		}
		f.serveFile(w, r)
		return
	}
	http.Error(w, `{"error":"Repository not found"}`, http.StatusNotFound)
}

func (f *fakeHub) serveFile(w http.ResponseWriter, r *http.Request) {
	p := strings.TrimPrefix(strings.TrimPrefix(r.URL.Path, "/own/repo/resolve/main/"), "/cdn/")
	f.mu.Lock()
	if r.Host == strings.TrimPrefix(f.cdn.URL, "http://") {
		f.cdnAuth = append(f.cdnAuth, r.Header.Get("Authorization"))
	}
	f.ranges = append(f.ranges, r.Header.Get("Range"))
	f.fileGets++
	drop := f.dropOnce
	f.dropOnce = 0
	f.mu.Unlock()
	b, ok := f.files[p]
	if !ok {
		http.NotFound(w, r)
		return
	}
	if drop > 0 {
		// Promise the whole file, send part of it, and hang up.
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.WriteHeader(http.StatusOK)
		w.Write(b[:drop])
		w.(http.Flusher).Flush()
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
		return
	}
	http.ServeContent(w, r, p, time.Time{}, bytes.NewReader(b))
}

func randomBytes(n int, seed int64) []byte {
	b := make([]byte, n)
	rand.New(rand.NewSource(seed)).Read(b)
	return b
}

func (f *fakeHub) client(token string) *Client {
	return &Client{Endpoint: f.hub.URL, Token: token}
}

func pull(t *testing.T, c *Client, cache Cache, ref string) (string, error) {
	t.Helper()
	r, err := ParseRef(ref)
	if err != nil {
		t.Fatal(err)
	}
	return c.Pull(context.Background(), cache, r)
}

func sameFile(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: %d bytes, differ from the hub's %d", path, len(got), len(want))
	}
}

func repoFiles() map[string][]byte {
	return map[string][]byte{
		"README.md":                 []byte("# model\n"),
		"m-Q8_0.gguf":               randomBytes(300<<10, 1),
		"m-Q4_K_M.gguf":             randomBytes(200<<10, 2),
		"m-Q2_K.gguf":               randomBytes(50<<10, 3),
		"m-F16-00001-of-00002.gguf": randomBytes(10, 4),
		"mmproj-m-f16.gguf":         randomBytes(10, 5),
		"sub/m-Q4_0_4_4.gguf":       randomBytes(10, 6),
	}
}

func TestPullDefaultAndQuant(t *testing.T) {
	files := repoFiles()
	h := newFakeHub(t, files)
	cache := Cache{t.TempDir()}
	p, err := pull(t, h.client(""), cache, "hf.co/own/repo")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(cache.Dir, "hf.co", "own", "repo", "m-Q4_K_M.gguf"); p != want {
		t.Errorf("default pull wrote %s, want %s", p, want)
	}
	sameFile(t, p, files["m-Q4_K_M.gguf"])
	p, err = pull(t, h.client(""), cache, "huggingface.co/own/repo:q8_0")
	if err != nil {
		t.Fatal(err)
	}
	sameFile(t, p, files["m-Q8_0.gguf"])
	if _, err := os.Stat(p + partialSuffix); !os.IsNotExist(err) {
		t.Errorf("partial file left behind: %v", err)
	}
	// Pulled again, the cached file is reused without a download.
	gets := h.fileGets
	if _, err := pull(t, h.client(""), cache, "hf.co/own/repo:Q8_0"); err != nil || h.fileGets != gets {
		t.Errorf("second pull: err %v, %d downloads, want none", err, h.fileGets-gets)
	}
	if got, ok := cache.Lookup(Ref{Owner: "own", Repo: "repo", Quant: "Q8_0"}); !ok || got != p {
		t.Errorf("Lookup = %q, %v; want %q", got, ok, p)
	}
}

func TestPullRedirectAndToken(t *testing.T) {
	files := repoFiles()
	h := newFakeHub(t, files)
	h.redirect = true
	p, err := pull(t, h.client("secret"), Cache{t.TempDir()}, "hf.co/own/repo:Q2_K")
	if err != nil {
		t.Fatal(err)
	}
	sameFile(t, p, files["m-Q2_K.gguf"])
	for _, a := range h.hubAuth {
		if a != "Bearer secret" {
			t.Errorf("hub request had Authorization %q, want the token", a)
		}
	}
	if len(h.cdnAuth) != 1 || h.cdnAuth[0] != "" {
		t.Errorf("redirect host saw Authorization %q, want one request without it", h.cdnAuth)
	}
}

func TestPullResumesAfterDrop(t *testing.T) {
	files := repoFiles()
	h := newFakeHub(t, files)
	h.redirect = true
	h.dropOnce = 70 << 10
	cache := Cache{t.TempDir()}
	_, err := pull(t, h.client(""), cache, "hf.co/own/repo:Q4_K_M")
	if err == nil || !strings.Contains(err.Error(), "pull again to resume") {
		t.Fatalf("dropped download: err %v, want an interruption", err)
	}
	dest := filepath.Join(cache.Dir, "hf.co", "own", "repo", "m-Q4_K_M.gguf")
	if st, err := os.Stat(dest + partialSuffix); err != nil || st.Size() != 70<<10 {
		t.Fatalf("partial file: %v %v, want 70 KiB", st, err)
	}
	if _, err := os.Stat(dest); !os.IsNotExist(err) {
		t.Fatalf("final file exists after a dropped download")
	}
	p, err := pull(t, h.client(""), cache, "hf.co/own/repo:Q4_K_M")
	if err != nil {
		t.Fatal(err)
	}
	sameFile(t, p, files["m-Q4_K_M.gguf"])
	if last := h.ranges[len(h.ranges)-1]; last != "bytes=71680-" {
		t.Errorf("resumed with Range %q, want bytes=71680- (kept on the redirect)", last)
	}
}

// A server that ignores Range answers 200 with the whole file; appending
// that to the partial file would corrupt it.
func TestPullRestartsOn200(t *testing.T) {
	files := repoFiles()
	h := newFakeHub(t, files)
	cache := Cache{t.TempDir()}
	dest := filepath.Join(cache.Dir, "hf.co", "own", "repo", "m-Q4_K_M.gguf")
	os.MkdirAll(filepath.Dir(dest), 0o755)
	os.WriteFile(dest+partialSuffix, []byte("stale bytes"), 0o644)
	ignore := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(files["m-Q4_K_M.gguf"])
	})
	h.hub.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/resolve/") {
			h.ranges = append(h.ranges, r.Header.Get("Range"))
			ignore(w, r)
			return
		}
		h.serveHub(w, r)
	})
	p, err := pull(t, h.client(""), cache, "hf.co/own/repo")
	if err != nil {
		t.Fatal(err)
	}
	sameFile(t, p, files["m-Q4_K_M.gguf"])
	if len(h.ranges) != 1 || h.ranges[0] != "bytes=11-" {
		t.Errorf("ranges %q, want one request for bytes=11-", h.ranges)
	}
}

func TestPullWrongChecksum(t *testing.T) {
	files := repoFiles()
	h := newFakeHub(t, files)
	h.sha["m-Q4_K_M.gguf"] = strings.Repeat("ab", 32)
	cache := Cache{t.TempDir()}
	_, err := pull(t, h.client(""), cache, "hf.co/own/repo")
	if !errors.Is(err, ErrChecksum) || !strings.Contains(err.Error(), strings.Repeat("ab", 32)) {
		t.Fatalf("err %v, want a checksum error naming the expected sum", err)
	}
	dest := filepath.Join(cache.Dir, "hf.co", "own", "repo", "m-Q4_K_M.gguf")
	for _, p := range []string{dest, dest + partialSuffix} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s exists after a checksum failure", p)
		}
	}
}

func TestPullMissingQuant(t *testing.T) {
	h := newFakeHub(t, repoFiles())
	_, err := pull(t, h.client(""), Cache{t.TempDir()}, "hf.co/own/repo:Q5_K_S")
	if err == nil || !strings.Contains(err.Error(), "no Q5_K_S file") || !strings.Contains(err.Error(), "Q2_K, Q4_0_4_4, Q4_K_M, Q8_0") {
		t.Errorf("err %v, want it to list Q2_K, Q4_0_4_4, Q4_K_M, Q8_0", err)
	}
	_, err = pull(t, h.client(""), Cache{t.TempDir()}, "hf.co/own/other")
	if err == nil || !strings.Contains(err.Error(), "404") || !strings.Contains(err.Error(), "Repository not found") {
		t.Errorf("unknown repository: err %v", err)
	}
}

func TestPullURL(t *testing.T) {
	files := repoFiles()
	h := newFakeHub(t, files)
	cache := Cache{t.TempDir()}
	p, err := pull(t, h.client(""), cache, h.cdn.URL+"/cdn/m-Q2_K.gguf")
	if err != nil {
		t.Fatal(err)
	}
	sameFile(t, p, files["m-Q2_K.gguf"])
	if !strings.HasPrefix(p, cache.Dir) || filepath.Base(p) != "m-Q2_K.gguf" {
		t.Errorf("URL pulled to %s", p)
	}
	// list names it by the URL (https, as the cache keeps no scheme), and
	// that name removes it.
	l, err := cache.List()
	host := strings.TrimPrefix(h.cdn.URL, "http://")
	if err != nil || len(l) != 1 || l[0].Name != "https://"+host+"/cdn/m-Q2_K.gguf" || l[0].Path != p {
		t.Fatalf("List = %+v, %v", l, err)
	}
	if got, err := cache.Remove(l[0].Name); err != nil || got != p {
		t.Fatalf("Remove(%s) = %s, %v", l[0].Name, got, err)
	}
}

func TestListAndRemove(t *testing.T) {
	files := repoFiles()
	h := newFakeHub(t, files)
	cache := Cache{t.TempDir()}
	if l, err := cache.List(); err != nil || len(l) != 0 {
		t.Fatalf("empty cache lists %v, %v", l, err)
	}
	for _, q := range []string{"Q4_K_M", "Q8_0"} {
		if _, err := pull(t, h.client(""), cache, "hf.co/own/repo:"+q); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(cache.Dir, "hf.co", "own", "repo", "x.gguf.partial"), nil, 0o644)
	l, err := cache.List()
	if err != nil || len(l) != 2 || l[0].Name != "hf.co/own/repo:Q4_K_M" || l[0].File != "hf.co/own/repo/m-Q4_K_M.gguf" || l[0].Size != 200<<10 ||
		l[1].Name != "hf.co/own/repo:Q8_0" || l[1].File != "hf.co/own/repo/m-Q8_0.gguf" {
		t.Fatalf("List = %+v, %v", l, err)
	}
	if _, err := cache.Remove("hf.co/own/repo"); err == nil || !strings.Contains(err.Error(), "Q4_K_M, Q8_0") {
		t.Errorf("removing an ambiguous ref: err %v", err)
	}
	if _, err := cache.Remove("hf.co/own/repo:Q8_0"); err != nil {
		t.Fatal(err)
	}
	if _, err := cache.Remove("hf.co/own/repo/m-Q4_K_M.gguf"); err != nil {
		t.Fatal(err)
	}
	if _, err := cache.Remove("hf.co/own/repo/m-Q4_K_M.gguf"); err == nil {
		t.Error("removing a model twice succeeded")
	}
	if _, err := cache.Remove("../../etc/passwd.gguf"); err == nil {
		t.Error("removing a path outside the cache was allowed")
	}
	if l, err := cache.List(); err != nil || len(l) != 0 {
		t.Errorf("after rm: %+v, %v", l, err)
	}
}

func TestParseRef(t *testing.T) {
	for _, c := range []struct{ in, want, err string }{
		{"hf.co/a/b", "hf.co/a/b", ""},
		{"huggingface.co/a/b:Q4_K_M", "hf.co/a/b:Q4_K_M", ""},
		{"hf.co/a", "", "want hf.co/OWNER/REPO"},
		{"hf.co/a/../b", "", "want hf.co/OWNER/REPO"},
		{"hf.co/a/..", "", "want hf.co/OWNER/REPO"},
		{"hf.co/a/b:Q4/x", "", "quantization"},
		{"https://example.com/", "", "names no file"},
		{"model.gguf", "", "not a model reference"},
	} {
		r, err := ParseRef(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("ParseRef(%q) err %v, want %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil || r.String() != c.want {
			t.Errorf("ParseRef(%q) = %q, %v; want %q", c.in, r, err, c.want)
		}
	}
}

func TestBarPlainAndTTY(t *testing.T) {
	clock := time.Unix(0, 0)
	now := func() time.Time { return clock }
	var buf bytes.Buffer
	b := NewBar(&buf, false, "m.gguf")
	b.Now = now
	b.Start(0, 4<<20)
	for i := int64(1); i <= 4; i++ {
		clock = clock.Add(time.Second)
		b.Update(i << 20)
	}
	b.Finish(nil)
	want := "pulling m.gguf (4.0 MiB)\n  m.gguf: 25% (1.0 MiB of 4.0 MiB)\n  m.gguf: 50% (2.0 MiB of 4.0 MiB)\n  m.gguf: 75% (3.0 MiB of 4.0 MiB)\npulled m.gguf: 4.0 MiB in 4s (1.0 MiB/s)\n"
	if buf.String() != want {
		t.Errorf("plain progress:\n%s\nwant:\n%s", buf.String(), want)
	}
	buf.Reset()
	b = NewBar(&buf, true, "m.gguf")
	b.Now = now
	b.Start(1<<20, 4<<20)
	clock = clock.Add(time.Second)
	b.Update(2 << 20)
	b.Finish(nil)
	want = "\r\x1b[Km.gguf  2.0 MiB / 4.0 MiB   50%  1.0 MiB/s  ETA 2s\r\x1b[Kpulled m.gguf: 2.0 MiB in 1s (1.0 MiB/s), resumed at 1.0 MiB\n"
	if buf.String() != want {
		t.Errorf("terminal progress %q, want %q", buf.String(), want)
	}
}

// A download that fails before any byte arrives leaves no empty partial.
func TestPullFailureLeavesNoEmptyPartial(t *testing.T) {
	h := newFakeHub(t, repoFiles())
	h.hub.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/resolve/") {
			http.Error(w, "gone", http.StatusInternalServerError)
			return
		}
		h.serveHub(w, r)
	})
	cache := Cache{t.TempDir()}
	if _, err := pull(t, h.client(""), cache, "hf.co/own/repo"); err == nil || !strings.Contains(err.Error(), "500") {
		t.Fatalf("err %v, want the server's 500", err)
	}
	left, _ := filepath.Glob(filepath.Join(cache.Dir, "hf.co", "own", "repo", "*"))
	if len(left) != 0 {
		t.Errorf("files left after a failed pull: %v", left)
	}
}
