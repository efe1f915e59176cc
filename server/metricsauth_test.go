package server

import (
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestMetricsAuth (issue 24, item 7): under an API key /metrics,
// /version and /api/version stay open by default, as in vLLM; with
// MetricsAuth (--metrics-auth) they answer 401 without the key and 200
// with it, while /health stays open either way.
func TestMetricsAuth(t *testing.T) {
	get := func(url string, key bool) int {
		t.Helper()
		req, err := http.NewRequest("GET", url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if key {
			req.Header.Set("Authorization", "Bearer sekret")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, guard := range []bool{false, true} {
		ts := startServer(t, newFake(), Options{APIKey: "sekret", MetricsAuth: guard, Registry: prometheus.NewRegistry()})
		for _, p := range []string{"/metrics", "/version", "/api/version", "/health"} {
			want := 200
			if guard && p != "/health" {
				want = 401
			}
			if got := get(ts.URL+p, false); got != want {
				t.Errorf("metrics auth %v: %s without key: %d, want %d", guard, p, got, want)
			}
			if got := get(ts.URL+p, true); got != 200 {
				t.Errorf("metrics auth %v: %s with key: %d", guard, p, got)
			}
		}
	}
}
