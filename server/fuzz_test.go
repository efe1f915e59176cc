package server

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// FuzzDecodeRequest feeds arbitrary bodies to the completions and chat
// endpoints over the fake backend: every answer must be a well-formed
// response or an OpenAI-shaped 4xx error that speaks in API terms, and
// nothing may panic.
func FuzzDecodeRequest(f *testing.F) {
	for _, seed := range []string{
		`{"prompt":"hi","max_tokens":2}`,
		`{"prompt":[[5,6],[7,300]],"n":2}`,
		`{"prompt":[5,99999999999]}`,
		`{"prompt":"x","max_tokens":"5","logprobs":3}`,
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"logprobs":true,"top_logprobs":2}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"stop":["b"]}`,
		`{"messages":"hi"}`,
		`[]`,
		`{"prompt":"a","logit_bias":{"5":1e400}}`,
	} {
		f.Add(seed)
	}
	fb := newFake()
	h := New(fb, Options{MaxWaiting: 4}).Handler()
	f.Fuzz(func(t *testing.T, body string) {
		for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			req := httptest.NewRequestWithContext(ctx, "POST", path, strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			cancel()
			out := rec.Body.Bytes()
			switch {
			case rec.Code == http.StatusOK:
				if !json.Valid(out) && !strings.HasPrefix(string(out), "data: ") {
					t.Fatalf("%s %q: 200 with %q", path, body, out)
				}
			case rec.Code >= 400 && rec.Code < 500:
				var e errBody
				if err := json.Unmarshal(out, &e); err != nil || e.Error.Message == "" {
					t.Fatalf("%s %q: %d with %q", path, body, rec.Code, out)
				}
				if m := e.Error.Message; strings.Contains(m, "server.") || strings.Contains(m, "Go ") {
					t.Fatalf("%s %q: error leaks Go names: %s", path, body, m)
				}
			default:
				t.Fatalf("%s %q: status %d %q", path, body, rec.Code, out)
			}
		}
	})
}
