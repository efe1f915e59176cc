package proc

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestWaitHealthy(t *testing.T) {
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer ok.Close()
	s, err := Start(exec.Command("sleep", "30"))
	if err != nil {
		t.Skip(err)
	}
	if err := s.WaitHealthy(ok.URL, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	s.Stop()

	// A process that exits before it is healthy is reported at once.
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	s, err = Start(exec.Command("true"))
	if err != nil {
		t.Skip(err)
	}
	start := time.Now()
	err = s.WaitHealthy(fmt.Sprintf("http://127.0.0.1:%d", port), time.Minute)
	if err == nil || !strings.Contains(err.Error(), "exited") || time.Since(start) > 10*time.Second {
		t.Fatalf("%v after %v", err, time.Since(start))
	}
	s.Stop() // does not hang on an exited process
}
