package server

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func do(t *testing.T, method, url, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	cl := &http.Client{Timeout: 5 * time.Second}
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// TestContentType checks that POST routes take JSON only, so a web page
// cannot reach them with a form or text/plain (no CORS preflight).
func TestContentType(t *testing.T) {
	ts := startServer(t, newFake(), Options{})
	body := `{"prompt":"hi","max_tokens":1}`
	for ct, want := range map[string]int{"text/plain": 415, "": 415, "application/x-www-form-urlencoded": 415,
		"application/json": 200, "application/json; charset=utf-8": 200, "Application/JSON": 200} {
		resp, b := do(t, "POST", ts.URL+"/v1/completions", body, "Content-Type", ct)
		if resp.StatusCode != want {
			t.Errorf("Content-Type %q: %d %s, want %d", ct, resp.StatusCode, b, want)
		}
	}
}

func TestCORS(t *testing.T) {
	pre := func(url, origin string) *http.Response {
		resp, _ := do(t, "OPTIONS", url+"/v1/chat/completions", "", "Origin", origin,
			"Access-Control-Request-Method", "POST", "Access-Control-Request-Headers", "content-type")
		return resp
	}
	ts := startServer(t, newFake(), Options{})
	if resp := pre(ts.URL, "http://evil.example"); resp.StatusCode != 403 || resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("preflight with no allowed origins: %d %v", resp.StatusCode, resp.Header)
	}
	resp, _ := do(t, "GET", ts.URL+"/v1/models", "", "Origin", "http://evil.example")
	if resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("CORS header for a disallowed origin: %v", resp.Header)
	}

	ts = startServer(t, newFake(), Options{AllowedOrigins: []string{"http://ok.example"}})
	resp = pre(ts.URL, "http://ok.example")
	if resp.StatusCode != 204 || resp.Header.Get("Access-Control-Allow-Origin") != "http://ok.example" ||
		!strings.Contains(resp.Header.Get("Access-Control-Allow-Methods"), "POST") ||
		!strings.Contains(strings.ToLower(resp.Header.Get("Access-Control-Allow-Headers")), "content-type") {
		t.Fatalf("allowed preflight: %d %v", resp.StatusCode, resp.Header)
	}
	if resp := pre(ts.URL, "http://evil.example"); resp.StatusCode != 403 {
		t.Fatalf("preflight from another origin: %d", resp.StatusCode)
	}
	resp, b := do(t, "POST", ts.URL+"/v1/completions", `{"prompt":"hi","max_tokens":1}`,
		"Origin", "http://ok.example", "Content-Type", "application/json")
	if resp.StatusCode != 200 || resp.Header.Get("Access-Control-Allow-Origin") != "http://ok.example" || resp.Header.Get("Vary") != "Origin" {
		t.Fatalf("allowed POST: %d %v %s", resp.StatusCode, resp.Header, b)
	}

	ts = startServer(t, newFake(), Options{AllowedOrigins: []string{"*"}})
	if resp := pre(ts.URL, "http://any.example"); resp.StatusCode != 204 || resp.Header.Get("Access-Control-Allow-Origin") != "*" {
		t.Fatalf("wildcard preflight: %d %v", resp.StatusCode, resp.Header)
	}
}

// TestHostCheck checks DNS-rebinding protection on a loopback listener.
func TestHostCheck(t *testing.T) {
	s := New(newFake(), Options{AllowedHosts: []string{"my.box"}})
	addr, _ := serveLoopback(t, s, time.Second)
	url := "http://" + addr + "/v1/models"
	for host, want := range map[string]int{
		"evil.example": 403, "evil.example:8000": 403, "localhost.evil.example": 403,
		addr: 200, "localhost": 200, "LOCALHOST:8000": 200, "127.0.0.1": 200, "[::1]:8000": 200, "[::1]": 200,
		"my.box": 200, "my.box:80": 200,
	} {
		if resp, b := do(t, "GET", url, "", "Host", host); resp.StatusCode != want {
			t.Errorf("Host %q: %d %s, want %d", host, resp.StatusCode, b, want)
		}
	}
}
