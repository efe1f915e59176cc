// Package proc starts and stops the servers the benchmark scripts measure
// (pagoda serve, llama-server) and builds pagoda from the checkout.
package proc

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// FreePort returns a loopback port nobody listens on now.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Server is a started server process.
type Server struct {
	cmd    *exec.Cmd
	exited chan error
}

// Start starts cmd.
func Start(cmd *exec.Cmd) (*Server, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &Server{cmd: cmd, exited: make(chan error, 1)}
	go func() { s.exited <- cmd.Wait() }()
	return s, nil
}

// Pid is the server's process id.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// WaitHealthy polls base/health until it answers 200, the process exits,
// or limit passes.
func (s *Server) WaitHealthy(base string, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, "GET", base+"/health", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case err := <-s.exited:
			s.exited <- err // Stop still waits on it
			return fmt.Errorf("server exited before it was healthy: %v", err)
		case <-ctx.Done():
			return fmt.Errorf("server at %s not healthy after %v", base, limit)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Stop interrupts the server and kills it if it has not exited within
// 20 s.
func (s *Server) Stop() {
	s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.exited:
	case <-time.After(20 * time.Second):
		s.cmd.Process.Kill()
		<-s.exited
	}
}

// BuildPagoda builds ./cmd/pagoda (run from the repository root) into a
// temporary directory; cleanup removes it.
func BuildPagoda(log io.Writer) (bin string, cleanup func(), err error) {
	dir, err := os.MkdirTemp("", "pagoda-bench")
	if err != nil {
		return "", nil, err
	}
	bin = filepath.Join(dir, "pagoda")
	fmt.Fprintln(log, "building pagoda …")
	b := exec.Command("go", "build", "-o", bin, "./cmd/pagoda")
	b.Stdout, b.Stderr = log, log
	if err := b.Run(); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("building pagoda (run from the repository root or pass -pagoda): %w", err)
	}
	return bin, func() { os.RemoveAll(dir) }, nil
}
