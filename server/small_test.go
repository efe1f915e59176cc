package server

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestMethodNotAllowed(t *testing.T) {
	ts := startServer(t, newFake(), Options{})
	for _, c := range []struct{ method, path, allow string }{
		{"GET", "/v1/completions", "POST"}, {"GET", "/v1/chat/completions", "POST"},
		{"POST", "/v1/models", "GET, HEAD"}, {"DELETE", "/health", "GET, HEAD"},
	} {
		resp, b := do(t, c.method, ts.URL+c.path, "", "Content-Type", "application/json")
		if resp.StatusCode != 405 || resp.Header.Get("Allow") != c.allow {
			t.Errorf("%s %s: %d Allow %q %s", c.method, c.path, resp.StatusCode, resp.Header.Get("Allow"), b)
		}
		decode[errBody](t, []byte(b))
	}
	if resp, _ := do(t, "GET", ts.URL+"/nope", ""); resp.StatusCode != 404 {
		t.Errorf("unknown path: %d", resp.StatusCode)
	}
}

// TestDecodeErrorWording checks that type errors name the field and a
// JSON type, never a Go type.
func TestDecodeErrorWording(t *testing.T) {
	ts := startServer(t, newFake(), Options{})
	for _, c := range []struct{ path, body, param, want string }{
		{"/v1/completions", `[]`, "", "must be a JSON object, got JSON array"},
		{"/v1/completions", `"x"`, "", "must be a JSON object, got JSON string"},
		{"/v1/chat/completions", `{"messages":"hi"}`, "messages", `"messages": expected a list of objects, got JSON string`},
		{"/v1/chat/completions", `{"messages":[{"role":1}]}`, "messages", `"messages.role": expected a string, got JSON number`},
		{"/v1/completions", `{"prompt":"x","max_tokens":"5"}`, "max_tokens", `"max_tokens": expected an integer, got JSON string`},
		{"/v1/completions", `{"prompt":"x","stop_token_ids":{}}`, "stop_token_ids", `expected a list of integers, got JSON object`},
	} {
		code, b := post(t, ts, c.path, c.body)
		e := decode[errBody](t, b)
		if code != 400 || !strings.Contains(e.Error.Message, c.want) || strings.Contains(e.Error.Message, "server.") {
			t.Errorf("%s: %d %s, want message with %q", c.body, code, b, c.want)
		}
		if p := e.Error.Param; (p == nil) != (c.param == "") || (p != nil && *p != c.param) {
			t.Errorf("%s: param %v, want %q", c.body, p, c.param)
		}
	}
}

// TestPromptTokenErrors checks that a bad token id is reported at its own
// index, as out of the vocabulary.
func TestPromptTokenErrors(t *testing.T) {
	ts := startServer(t, newFake(), Options{})
	for body, want := range map[string]string{
		`{"prompt":[5, 99999999999]}`:         "prompt[1]: token id 99999999999 is out of the vocabulary",
		`{"prompt":[5, 1e30]}`:                "prompt[1]: token id 1e30 is out of the vocabulary",
		`{"prompt":[5, 300]}`:                 "prompt[1]: token id 300 is out of the vocabulary (valid ids: 0 to 258)",
		`{"prompt":[-1]}`:                     "prompt[0]: token id -1 is out of the vocabulary",
		`{"prompt":[[5,6],[7,8,4000000000]]}`: "prompt[1][2]: token id 4000000000 is out of the vocabulary",
		`{"prompt":[[5,6],[7,300]]}`:          "prompt[1][1]: token id 300 is out of the vocabulary (valid ids: 0 to 258)",
		`{"prompt":[5, 1.5]}`:                 "prompt[1] must be an integer token id, got 1.5",
		`{"prompt":["a", {"x":1}]}`:           "prompt[1] must be a string or a list of token ids",
		`{"prompt":[[5], ["a"]]}`:             `prompt[1][0] must be an integer token id, got "a"`,
	} {
		code, b := post(t, ts, "/v1/completions", body)
		if e := decode[errBody](t, b); code != 400 || e.Error.Message != want {
			t.Errorf("%s: %d %q, want %q", body, code, e.Error.Message, want)
		}
	}
	if code, b := post(t, ts, "/v1/completions", `{"prompt":[[5,6],[7,8]],"max_tokens":1}`); code != 200 {
		t.Fatalf("valid token lists: %d %s", code, b)
	}
}

func TestBearerCaseInsensitive(t *testing.T) {
	ts := startServer(t, newFake(), Options{APIKey: "sekret"})
	body := `{"prompt":"hi","max_tokens":1}`
	for auth, want := range map[string]int{"Bearer sekret": 200, "bearer sekret": 200, "BEARER  sekret": 200,
		"Bearer Sekret": 401, "Basic sekret": 401, "bearersekret": 401, "sekret": 401} {
		if code, b := post(t, ts, "/v1/completions", body, "Authorization", auth); code != want {
			t.Errorf("Authorization %q: %d %s, want %d", auth, code, b, want)
		}
	}
}

// TestMorePromptsThanQueue checks that a request that could never be
// queued gets 400, not a 429 it can never pass.
func TestMorePromptsThanQueue(t *testing.T) {
	ts := startServer(t, newFake(), Options{MaxWaiting: 2})
	code, b := post(t, ts, "/v1/completions", `{"prompt":["a","b","c"],"max_tokens":1}`)
	if e := decode[errBody](t, b); code != 400 || !strings.Contains(e.Error.Message, "waiting-queue capacity of 2") {
		t.Fatalf("3 prompts, queue 2: %d %s", code, b)
	}
	if code, b := post(t, ts, "/v1/completions", `{"prompt":["a","b"],"max_tokens":1}`); code != 200 {
		t.Fatalf("2 prompts, queue 2: %d %s", code, b)
	}
}

func TestRetryAfter(t *testing.T) {
	f := newFake()
	f.hold = make(chan struct{})
	ts := startServer(t, f, Options{MaxQueue: 1})
	done := make(chan int)
	go func() {
		code, _ := post(t, ts, "/v1/completions", `{"prompt":"hi","max_tokens":1}`)
		done <- code
	}()
	<-f.started
	resp, b := do(t, "POST", ts.URL+"/v1/completions", `{"prompt":"hi","max_tokens":1}`, "Content-Type", "application/json")
	close(f.hold)
	<-done
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("busy: %d Retry-After %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), b)
	}
}

// TestDrainCutAnswers checks that requests cancelled at the drain
// deadline, or by Abort, get a 503 error rather than an empty reply.
func TestDrainCutAnswers(t *testing.T) {
	for _, abort := range []bool{false, true} {
		f := newFake()
		f.hold = make(chan struct{})
		s := New(f, Options{})
		grace := 200 * time.Millisecond
		if abort {
			grace = time.Minute
		}
		addr, stop := serveLoopback(t, s, grace)
		type result struct {
			code int
			body string
		}
		res := make(chan result, 2)
		for _, stream := range []bool{false, true} {
			go func() {
				body := `{"prompt":"hi","max_tokens":3,"stream":` + map[bool]string{false: "false", true: "true"}[stream] + `}`
				resp, err := http.Post("http://"+addr+"/v1/completions", "application/json", strings.NewReader(body))
				if err != nil {
					res <- result{body: err.Error()}
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				res <- result{resp.StatusCode, string(b)}
			}()
		}
		<-f.started
		<-f.started
		start := time.Now()
		go func() {
			if abort {
				time.Sleep(50 * time.Millisecond)
				s.Abort()
			}
		}()
		stop()
		if el := time.Since(start); el > 5*time.Second {
			t.Fatalf("abort=%v: drain took %v", abort, el)
		}
		for range 2 {
			r := <-res
			switch {
			case r.code == 503:
				if e := decode[errBody](t, []byte(r.body)); !strings.Contains(e.Error.Message, "shut down") {
					t.Errorf("abort=%v: 503 body %s", abort, r.body)
				}
			case r.code == 200:
				if !strings.Contains(r.body, "shut down") || !strings.HasSuffix(r.body, "data: [DONE]\n\n") {
					t.Errorf("abort=%v: cut stream without an error event: %q", abort, r.body)
				}
			default:
				t.Errorf("abort=%v: %d %q", abort, r.code, r.body)
			}
		}
	}
}
