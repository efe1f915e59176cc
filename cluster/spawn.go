package cluster

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ListenLine is what a worker prints first on standard output, with its
// address after it, so whoever started it (Spawn, a script, a cluster
// manager) learns the port it got.
const ListenLine = "pagoda worker: listening on "

// Spawned is a set of worker processes started on this machine.
type Spawned struct {
	Addrs []string
	cmds  []*exec.Cmd
}

// Spawn starts n workers of model as child processes (bin worker
// --listen 127.0.0.1:0 ... extra...), each with threads threads, and
// waits for their addresses. Their standard error goes to logw.
func Spawn(bin, model string, n, threads int, logw io.Writer, extra ...string) (*Spawned, error) {
	s := &Spawned{}
	for i := 0; i < n; i++ {
		args := append([]string{"worker", "--listen", "127.0.0.1:0", "-m", model, "--threads", strconv.Itoa(threads), "--quiet"}, extra...)
		c := exec.Command(bin, args...)
		c.Stderr = logw
		// Its own process group, so a signal to the coordinator's
		// terminal does not reach the workers before the coordinator has
		// hung up on them.
		c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		out, err := c.StdoutPipe()
		if err != nil {
			s.Stop()
			return nil, err
		}
		if err := c.Start(); err != nil {
			s.Stop()
			return nil, fmt.Errorf("starting worker %d: %w", i, err)
		}
		s.cmds = append(s.cmds, c)
		addr, err := readAddr(out, 30*time.Second)
		if err != nil {
			s.Stop()
			return nil, fmt.Errorf("worker %d: %w", i, err)
		}
		s.Addrs = append(s.Addrs, addr)
	}
	return s, nil
}

// readAddr reads the worker's listen line (and then drains the pipe, so
// the worker never blocks writing to it).
func readAddr(r io.Reader, timeout time.Duration) (string, error) {
	type result struct {
		addr string
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		br := bufio.NewReader(r)
		line, err := br.ReadString('\n')
		if err != nil {
			ch <- result{err: fmt.Errorf("no listen line (%v)", err)}
			return
		}
		addr, ok := strings.CutPrefix(strings.TrimSpace(line), ListenLine)
		if !ok {
			ch <- result{err: fmt.Errorf("unexpected first line %q", line)}
			return
		}
		ch <- result{addr: addr}
		io.Copy(io.Discard, br)
	}()
	select {
	case res := <-ch:
		return res.addr, res.err
	case <-time.After(timeout):
		return "", errors.New("no listen line within " + timeout.String())
	}
}

// Stop ends the workers (SIGTERM, then SIGKILL after a grace period) and
// waits for them.
func (s *Spawned) Stop() {
	if s == nil {
		return
	}
	for _, c := range s.cmds {
		_ = c.Process.Signal(syscall.SIGTERM)
	}
	for _, c := range s.cmds {
		done := make(chan struct{})
		go func() {
			_ = c.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = c.Process.Kill()
			<-done
		}
	}
	s.cmds = nil
	_ = os.Stderr.Sync()
}
