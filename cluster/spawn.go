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
	"sync"
	"syscall"
	"time"
)

// ListenLine is what a worker prints first on standard output, with its
// address after it, so whoever started it (Spawn, a script, a cluster
// manager) learns the port it got.
const ListenLine = "pagoda worker: listening on "

// Spawned is a set of worker processes started on this machine.
type Spawned struct {
	// Addrs are the addresses the workers first listened on (Current has
	// them after restarts).
	Addrs []string

	bin, model string
	threads    int
	logw       io.Writer
	extra      []string

	mu    sync.Mutex
	procs []*proc
	addrs []string // now
}

// proc is one worker process; done is closed when it has exited.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error // its exit, once done
}

// Spawn starts n workers of model as child processes (bin worker
// --listen 127.0.0.1:0 ... extra...), each with threads threads, and
// waits for their addresses. Their standard error goes to logw.
func Spawn(bin, model string, n, threads int, logw io.Writer, extra ...string) (*Spawned, error) {
	s := &Spawned{bin: bin, model: model, threads: threads, logw: logw, extra: extra}
	for i := 0; i < n; i++ {
		p, addr, err := s.start()
		if p != nil {
			s.procs = append(s.procs, p)
		}
		if err != nil {
			s.Stop()
			return nil, fmt.Errorf("worker %d: %w", i, err)
		}
		s.Addrs = append(s.Addrs, addr)
	}
	s.addrs = append([]string(nil), s.Addrs...)
	return s, nil
}

// start starts one worker and reads its address.
func (s *Spawned) start() (*proc, string, error) {
	args := append([]string{"worker", "--listen", "127.0.0.1:0", "-m", s.model, "--threads", strconv.Itoa(s.threads), "--quiet"}, s.extra...)
	c := exec.Command(s.bin, args...)
	c.Stderr = s.logw
	// Its own process group, so a signal to the coordinator's terminal
	// does not reach the workers before the coordinator has hung up on
	// them.
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := c.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	if err := c.Start(); err != nil {
		return nil, "", fmt.Errorf("starting: %w", err)
	}
	p := &proc{cmd: c, done: make(chan struct{})}
	addr, err := readAddr(out, 30*time.Second)
	// Wait only after the pipe's reader is done with its first line:
	// Wait closes the pipe.
	go func() {
		p.err = c.Wait()
		close(p.done)
	}()
	return p, addr, err
}

// Current are the workers' addresses now.
func (s *Spawned) Current() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.addrs...)
}

// firstDead is the index of a worker that has exited and how, or -1.
func (s *Spawned) firstDead() (int, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, p := range s.procs {
		select {
		case <-p.done:
			if p.err == nil {
				return i, "exited"
			}
			return i, "exited: " + p.err.Error()
		default:
		}
	}
	return -1, ""
}

// RestartDead starts again every worker that has exited (each on a new
// port: see Current) and says how many it started.
func (s *Spawned) RestartDead() (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for i, p := range s.procs {
		select {
		case <-p.done:
		default:
			continue
		}
		np, addr, err := s.start()
		if err != nil {
			if np != nil {
				np.cmd.Process.Kill()
				<-np.done
			}
			return n, fmt.Errorf("restarting worker %d: %w", i, err)
		}
		s.procs[i], s.addrs[i] = np, addr
		n++
	}
	return n, nil
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
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range s.procs {
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	s.procs = nil
	_ = os.Stderr.Sync()
}
