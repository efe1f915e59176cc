package cluster

import (
	"bytes"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestWorkerProbeQuiet: a connection closed before sending a byte (a
// Kubernetes tcpSocket probe) is dropped without a log line at info
// level; one that sends something that is no hello is still logged.
func TestWorkerProbeQuiet(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var log syncBuf
	w := &Worker{Model: "unused.gguf", Log: slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	go w.Serve(ln)
	for i := 0; i < 3; i++ {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte{0xff, 0xff, 0xff, 0xff})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(log.String(), "not a pagoda peer") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	if got := strings.Count(log.String(), "dropping a connection"); got != 1 || !strings.Contains(log.String(), "not a pagoda peer") {
		t.Errorf("want one line, for the connection that sent garbage; logged:\n%s", log.String())
	}
}
