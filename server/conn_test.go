package server

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// serveLoopback runs s.Serve on 127.0.0.1 until the test ends and returns
// its address.
func serveLoopback(t *testing.T, s *Server, grace time.Duration) (addr string, stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ln, grace) }()
	var stopped bool
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-served; err != nil {
				t.Errorf("Serve: %v", err)
			}
		}
	}
	t.Cleanup(stop)
	return ln.Addr().String(), stop
}

// closedWithin reads from c until the server closes it, failing the test
// if that takes longer than d; it returns what was read.
func closedWithin(t *testing.T, c net.Conn, d time.Duration, what string) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	b, err := io.ReadAll(c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("%s: connection still open after %v (read %q)", what, d, b)
	}
	return string(b)
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestSlowClients checks that stalled and idle connections are closed by
// the configured deadlines while a slow but progressing stream is not cut.
func TestSlowClients(t *testing.T) {
	f := newFake()
	f.delay = 100 * time.Millisecond
	reg := prometheus.NewRegistry()
	short := 250 * time.Millisecond
	s := New(f, Options{Registry: reg, ReadHeaderTimeout: short, BodyReadTimeout: short,
		IdleTimeout: short, WriteTimeout: short})
	addr, _ := serveLoopback(t, s, time.Second)

	c := dial(t, addr)
	_, _ = io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
	closedWithin(t, c, 3*time.Second, "stalled headers")

	c = dial(t, addr)
	_, _ = io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"prompt\":")
	if got := closedWithin(t, c, 3*time.Second, "stalled body"); !strings.HasPrefix(got, "HTTP/1.1 408") {
		t.Fatalf("stalled body: got %q, want a 408", got)
	}
	if v := gauge(t, reg, "pagoda:http_requests_in_flight"); v != 0 {
		t.Fatalf("http_requests_in_flight = %v after the stalled body was dropped", v)
	}

	c = dial(t, addr)
	_, _ = io.WriteString(c, "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("health on keep-alive: %v %v", resp, err)
	}
	resp.Body.Close()
	closedWithin(t, c, 3*time.Second, "idle keep-alive")

	// 8 tokens 100ms apart: the stream outlives every timeout above.
	start := time.Now()
	hr, err := http.Post("http://"+addr+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt":"hi","max_tokens":8,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	ev := sseEvents(t, hr.Body)
	hr.Body.Close()
	if el := time.Since(start); el < 3*short || len(ev) != 9 || ev[8] != "[DONE]" {
		t.Fatalf("slow stream cut: %d events in %v: %q", len(ev), el, ev)
	}
}

// TestMaxConnections checks the connection cap: a connection beyond it is
// not served until another one closes.
func TestMaxConnections(t *testing.T) {
	s := New(newFake(), Options{MaxConnections: 2})
	addr, _ := serveLoopback(t, s, time.Second)
	held := []net.Conn{dial(t, addr), dial(t, addr)}
	// The server accepts the held connections in turn; give it the time.
	time.Sleep(100 * time.Millisecond)
	get := func(timeout time.Duration) error {
		tr := &http.Transport{DisableKeepAlives: true}
		defer tr.CloseIdleConnections()
		cl := &http.Client{Transport: tr, Timeout: timeout}
		resp, err := cl.Get("http://" + addr + "/health")
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	if err := get(300 * time.Millisecond); err == nil {
		t.Fatal("a third connection was served past MaxConnections=2")
	}
	held[0].Close()
	if err := get(3 * time.Second); err != nil {
		t.Fatalf("after a connection closed: %v", err)
	}
}

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}
