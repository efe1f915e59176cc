package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"pagoda/embedded"
	"pagoda/engine"
	"pagoda/grammar"
	"pagoda/tokenizer"
)

func enumSchema(n int) string {
	var sb strings.Builder
	sb.WriteString(`{"enum":[`)
	for i := range n {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `"i%07d"`, i)
	}
	sb.WriteString(`]}`)
	return sb.String()
}

// TestHostileSchemaRequests: a 1 MiB enum of 85,000 values is a 400 that
// costs little (before the budget each cost about 1 GB and seconds), the
// same schema again comes from the cache of refusals, and ten in a row
// leave the live heap where it was.
func TestHostileSchemaRequests(t *testing.T) {
	ts := storiesServer(t)
	body := []byte(`{"prompt":"Once","max_tokens":2,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":` + enumSchema(85000) + `}}}`)
	post := func() (int, string) {
		resp, err := http.Post(ts.URL+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	for i := range 10 {
		t0 := time.Now()
		code, msg := post()
		if code != http.StatusBadRequest || !strings.Contains(msg, "85000 values") {
			t.Fatalf("request %d: %d %s", i, code, msg)
		}
		if i < 2 {
			t.Logf("request %d: %v: %s", i, time.Since(t0), msg)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&m1)
	t.Logf("10 requests allocated %d MB; live heap %d -> %d MB", (m1.TotalAlloc-m0.TotalAlloc)>>20, m0.HeapAlloc>>20, m1.HeapAlloc>>20)
	if grow := int64(m1.HeapAlloc) - int64(m0.HeapAlloc); grow > 16<<20 {
		t.Errorf("live heap grew %d MB over ten hostile requests", grow>>20)
	}
	if per := (m1.TotalAlloc - m0.TotalAlloc) / 10; per > 48<<20 {
		t.Errorf("%d MB allocated per hostile request, want < 48", per>>20)
	}
}

// TestConstraintCache: compiled schemas and refusals are cached by hash in
// a bounded LRU, the engine's own, so the engine finds what the server
// checked; a compilation stopped by its context is not cached.
func TestConstraintCache(t *testing.T) {
	path, err := embedded.Path(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m, eng := storiesEngine(t, path, nil)
	be, err := NewEngineBackend(eng, m.Tokenizer(), "stories260K", m.Config.ContextLen, "")
	if err != nil {
		t.Fatal(err)
	}
	s := New(be, Options{})
	// The server checks constraints in the engine's cache.
	cache := eng.Grammars()
	rf := func(schema string) *responseFormat {
		return &responseFormat{Type: "json_schema", JSONSchema: &jsonSchemaSpec{Schema: json.RawMessage(schema)}}
	}
	ctx := context.Background()
	for range 3 {
		if _, ae := s.constraint(ctx, rf(`{"type":"integer"}`)); ae != nil {
			t.Fatal(ae)
		}
	}
	if n := cache.Compiled(); n != 1 {
		t.Errorf("compiled %d times in the engine's cache, want once", n)
	}
	// The engine compiles nothing more for a request the server checked.
	spec, _ := s.constraint(ctx, rf(`{"type":"integer"}`))
	ch, err := eng.Submit(ctx, &engine.Request{Prompt: m.Tokenizer().Encode("Once", tokenizer.Options{AddSpecial: true}), MaxTokens: 4, Constraint: spec})
	if err != nil {
		t.Fatal(err)
	}
	for range ch {
	}
	if n := cache.Compiled(); n != 1 {
		t.Errorf("the engine compiled again: %d compilations", n)
	}
	// Refusals are kept: the second costs a lookup.
	if _, ae := s.constraint(ctx, rf(enumSchema(70000))); ae == nil {
		t.Fatal("accepted")
	}
	n, c := cache.Len(), cache.Compiled()
	if _, ae := s.constraint(ctx, rf(enumSchema(70000))); ae == nil || cache.Len() != n || cache.Compiled() != c {
		t.Fatalf("second refusal: %v, entries %d -> %d", ae, n, cache.Len())
	}
	// A client that left: refused, not cached.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, ae := s.constraint(cctx, rf(`{"type":"object","properties":{"a":{"type":"string"}}}`)); ae == nil || !strings.Contains(ae.Message, "stopped") {
		t.Fatalf("cancelled: %v", ae)
	}
	if cache.Len() != n {
		t.Errorf("a cancelled compilation was cached")
	}
	// Bounded, least recently used out.
	for i := range grammar.MaxCached + 5 {
		if _, ae := s.constraint(ctx, rf(fmt.Sprintf(`{"type":"integer","minimum":%d}`, i))); ae != nil {
			t.Fatal(ae)
		}
	}
	if cache.Len() != grammar.MaxCached {
		t.Errorf("cache holds %d, want %d", cache.Len(), grammar.MaxCached)
	}
}
