package server

import (
	"encoding/json"
	"net/http/httptest"
	"testing"
)

// TestErrorShapePerAPI checks that busy (429), shutting down (503) and the
// screening every request passes (415, 413, 404) answer in the shape of
// the API the path belongs to: ollama {"error": "..."}, Anthropic
// {"type":"error","error":{"type","message"}}, else OpenAI's.
func TestErrorShapePerAPI(t *testing.T) {
	f := newFake()
	f.script = "hi"
	s := New(f, Options{MaxQueue: 1, MaxBodyBytes: 4096})
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	bodies := map[string]string{
		"/api/chat":            `{"model":"fake-model","messages":[{"role":"user","content":"hi"}],"stream":false}`,
		"/api/generate":        `{"model":"fake-model","prompt":"hi","stream":false}`,
		"/v1/messages":         `{"model":"fake-model","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`,
		"/v1/chat/completions": `{"model":"fake-model","messages":[{"role":"user","content":"hi"}]}`,
	}
	shape := func(path string, status int, body string) string {
		t.Helper()
		var m map[string]any
		if err := json.Unmarshal([]byte(body), &m); err != nil {
			t.Fatalf("%s %d: not JSON: %q", path, status, body)
		}
		switch e := m["error"].(type) {
		case string:
			if len(m) == 1 && e != "" {
				return "ollama"
			}
		case map[string]any:
			if m["type"] == "error" && e["type"] != nil && e["message"] != nil && len(e) == 2 {
				return "anthropic:" + e["type"].(string)
			}
			if _, ok := e["param"]; ok && e["message"] != nil {
				return "openai"
			}
		}
		return "unknown"
	}
	want := map[string]map[int]string{
		"/api/chat":            {429: "ollama", 503: "ollama", 415: "ollama", 413: "ollama"},
		"/api/generate":        {429: "ollama", 503: "ollama", 415: "ollama", 413: "ollama"},
		"/v1/messages":         {429: "anthropic:rate_limit_error", 503: "anthropic:overloaded_error", 415: "anthropic:invalid_request_error", 413: "anthropic:request_too_large"},
		"/v1/chat/completions": {429: "openai", 503: "openai", 415: "openai", 413: "openai"},
	}
	for path, body := range bodies {
		// 415: a browser-style text/plain POST (with an Origin, so the
		// ollama routes' leniency for curl does not apply).
		resp, b := do(t, "POST", ts.URL+path, body, "Content-Type", "text/plain", "Origin", "http://evil.example")
		if got := shape(path, resp.StatusCode, b); resp.StatusCode != 415 || got != want[path][415] {
			t.Errorf("%s text/plain: %d %s, want 415 in %s shape", path, resp.StatusCode, b, want[path][415])
		}
		big := `{"x":"` + string(make([]byte, 5000)) + `"}`
		resp, b = do(t, "POST", ts.URL+path, big, "Content-Type", "application/json")
		if got := shape(path, resp.StatusCode, b); resp.StatusCode != 413 || got != want[path][413] {
			t.Errorf("%s too large: %d %s, want 413 in %s shape", path, resp.StatusCode, b, want[path][413])
		}
		s.inflight.Store(1) // the one slot MaxQueue allows is taken
		resp, b = do(t, "POST", ts.URL+path, body, "Content-Type", "application/json")
		s.inflight.Store(0)
		if got := shape(path, resp.StatusCode, b); resp.StatusCode != 429 || got != want[path][429] || resp.Header.Get("Retry-After") == "" {
			t.Errorf("%s busy: %d %s, want 429 in %s shape with Retry-After", path, resp.StatusCode, b, want[path][429])
		}
		s.draining.Store(true)
		resp, b = do(t, "POST", ts.URL+path, body, "Content-Type", "application/json")
		s.draining.Store(false)
		if got := shape(path, resp.StatusCode, b); resp.StatusCode != 503 || got != want[path][503] {
			t.Errorf("%s shutting down: %d %s, want 503 in %s shape", path, resp.StatusCode, b, want[path][503])
		}
		// With the server free again the same request succeeds.
		if resp, b = do(t, "POST", ts.URL+path, body, "Content-Type", "application/json"); resp.StatusCode != 200 {
			t.Errorf("%s: %d %s", path, resp.StatusCode, b)
		}
	}
	resp, b := do(t, "POST", ts.URL+"/api/nope", "{}", "Content-Type", "application/json")
	if resp.StatusCode != 404 || shape("/api/nope", 404, b) != "ollama" {
		t.Errorf("/api/nope: %d %s, want 404 in ollama shape", resp.StatusCode, b)
	}
}

// TestOllamaCurlWithoutContentType checks that ollama's documented curl
// commands (-d with no Content-Type header) work, while a browser's
// cross-origin form post to the same route is still refused.
func TestOllamaCurlWithoutContentType(t *testing.T) {
	f := newFake()
	f.script = "hello"
	ts := startServer(t, f, Options{})
	body := `{"model":"fake-model","prompt":"hi","stream":false}`
	resp, b := do(t, "POST", ts.URL+"/api/generate", body, "Content-Type", "application/x-www-form-urlencoded")
	var r struct{ Response string }
	if err := json.Unmarshal([]byte(b), &r); resp.StatusCode != 200 || err != nil || r.Response != "hello" {
		t.Fatalf("curl-style post: %d %s", resp.StatusCode, b)
	}
	resp, b = do(t, "POST", ts.URL+"/api/generate", body, "Content-Type", "application/x-www-form-urlencoded", "Origin", "http://evil.example")
	if resp.StatusCode != 415 {
		t.Fatalf("cross-origin form post: %d %s, want 415", resp.StatusCode, b)
	}
}
