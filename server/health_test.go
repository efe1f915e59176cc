package server

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// downErr is a backend's reason for being down, with /health details.
type downErr struct{ msg string }

func (e downErr) Error() string   { return e.msg }
func (e downErr) HTTPStatus() int { return http.StatusServiceUnavailable }
func (e downErr) HealthDetails() map[string]any {
	return map[string]any{"workers_down": []map[string]any{{"worker": 1, "name": "rank 1"}}}
}

// TestHealthDown: while Options.Health reports an error, /health is a
// 503 with a JSON body naming it and its details, and new generation
// requests are 503s with the reason in every API's shape; once it
// clears, /health is the bare 200 it always was and requests run. An
// in-flight request failing with a 503 error answers 503, not 500.
func TestHealthDown(t *testing.T) {
	var down atomic.Pointer[downErr]
	f := newFake()
	f.script = "hi"
	ts := startServer(t, f, Options{Health: func() error {
		if d := down.Load(); d != nil {
			return *d
		}
		return nil
	}})
	get := func() (int, string) {
		resp, err := ts.Client().Get(ts.URL + "/health")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get(); code != 200 || body != "" {
		t.Fatalf("healthy: %d %q", code, body)
	}
	down.Store(&downErr{"worker group down: tensor parallel: rank 1: EOF"})
	code, body := get()
	type health struct {
		Status, Reason string
		Workers        []struct{ Worker int } `json:"workers_down"`
	}
	h := decode[health](t, []byte(body))
	if code != 503 || h.Status != "unavailable" || !strings.Contains(h.Reason, "rank 1: EOF") || len(h.Workers) != 1 || h.Workers[0].Worker != 1 {
		t.Fatalf("down: %d %s", code, body)
	}
	for _, p := range []string{"/v1/completions", "/v1/chat/completions", "/api/generate", "/v1/messages"} {
		body := `{"model":"fake-model","prompt":"x","max_tokens":2,"messages":[{"role":"user","content":"x"}]}`
		code, b := post(t, ts, p, body)
		if code != 503 || !strings.Contains(string(b), "rank 1: EOF") {
			t.Fatalf("%s while down: %d %s", p, code, b)
		}
	}
	down.Store(nil)
	if code, body := get(); code != 200 || body != "" {
		t.Fatalf("healthy again: %d %q", code, body)
	}
	if code, b := post(t, ts, "/v1/completions", `{"prompt":"x","max_tokens":2}`); code != 200 {
		t.Fatalf("healthy again: %d %s", code, b)
	}
	f.script, f.midErr = "", fmt.Errorf("engine: forward pass: %w", downErr{"worker group down: pipeline parallel: stage 1: EOF"})
	if code, b := post(t, ts, "/v1/completions", `{"prompt":"x","max_tokens":2}`); code != 503 || !strings.Contains(string(b), "stage 1: EOF") {
		t.Fatalf("failing with a 503 error: %d %s", code, b)
	}
}
