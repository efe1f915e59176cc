package cluster

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"pagoda/executor"
)

// WorkerError is a failure the coordinator blames on one worker: the one
// whose connection broke or stayed silent, or that refused or failed a
// step or a hello. Worker is its index in the addresses the group or
// pipeline was connected to. The message is the wrapped error's.
type WorkerError struct {
	Worker int
	err    error
}

func (e *WorkerError) Error() string { return e.err.Error() }
func (e *WorkerError) Unwrap() error { return e.err }

// errReconnected refuses a step planned before Epoch reported the
// reconnected group's new storage.
var errReconnected = unavailable("worker group: reconnected with new, empty KV storage; a step planned for the old one is refused (call Epoch between steps)")

// unavailable is an error HTTP clients see as a 503.
type unavailable string

func (e unavailable) Error() string   { return string(e) }
func (e unavailable) HTTPStatus() int { return http.StatusServiceUnavailable }

// broken is what a Supervisor runs: a Group or a Pipeline.
type broken interface {
	executor.Executor
	Close() error
	err() error // the failure that broke it for good, if any
}

// SuperviseOptions configure Supervise.
type SuperviseOptions struct {
	// Addrs are the workers' addresses, in the order Connect takes them.
	Addrs []string
	// Connect makes a group or pipeline of the workers at addrs (a
	// *Group or *Pipeline).
	Connect func(addrs []string) (executor.Executor, error)
	// Name is worker i's place in the group, for /health ("rank 1",
	// "stage 0"); nil: "worker i".
	Name func(i int) string
	// What names the group in the errors the supervisor makes itself
	// ("tensor parallel", "pipeline parallel"), as Connect's name it.
	What string
	// Spawned, when set, are the workers (started here) behind Addrs: one
	// that has exited is started again before a reconnect, and one that
	// exits breaks the group at once rather than at the next step.
	Spawned *Spawned
	// Probe, when positive, is how often the workers' addresses are
	// dialled while the group serves (a connection closed before its
	// hello, which a worker drops quietly): one that refuses breaks the
	// group then, so /health tells of a worker that died between
	// requests before a request fails on it. A worker that is stopped or
	// hung still accepts; its next step times out.
	Probe time.Duration
	// Backoff is the first wait before reconnecting (0: 200ms); each
	// failed attempt doubles it up to MaxBackoff (0: 5s).
	Backoff, MaxBackoff time.Duration
	// Log receives a line per failure and reconnect (nil: none).
	Log io.Writer
}

// Supervisor is the coordinator's executor over a worker group or
// pipeline that outlives it. A step that fails breaks a group for good
// (the workers' KV storage is in an unknown state), so the supervisor
// closes it, fails every step while it is down at once with a
// *DownError (an HTTP 503 naming the workers to blame), and reconnects to
// the same addresses in the background with backoff, restarting spawned
// workers that died. The new group's KV storage is empty: the engine
// learns it from Epoch (executor.Restartable) and drops what it planned
// against the old one.
type Supervisor struct {
	o SuperviseOptions

	mu      sync.Mutex
	addrs   []string
	cur     broken // serving; nil while down
	ready   broken // reconnected, installed by the next Epoch
	epoch   uint64
	down    *DownError // why it is down; nil while up
	counts  SupervisorCounts
	closed  bool
	stop    chan struct{}
	looping bool
	wg      sync.WaitGroup // watch; not reconnect, whose Connect may wait long on a stalled worker
}

// SupervisorCounts are what happened to the group since the server
// started.
type SupervisorCounts struct {
	Failures   uint64 // the group broke
	Reconnects uint64 // a new group connected after a failure
	Attempts   uint64 // reconnects tried
	Restarts   uint64 // spawned workers started again
}

// Supervise connects the group (an error if the first connect fails, as
// Connect's) and supervises it.
func Supervise(o SuperviseOptions) (*Supervisor, error) {
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 5 * time.Second
	}
	if o.Backoff <= 0 {
		o.Backoff = 200 * time.Millisecond
	}
	o.Backoff = min(o.Backoff, o.MaxBackoff)
	if o.Name == nil {
		o.Name = func(i int) string { return "worker " + strconv.Itoa(i) }
	}
	o.What = cmp.Or(o.What, "worker group")
	x, err := o.Connect(o.Addrs)
	if err != nil {
		return nil, err
	}
	s := &Supervisor{o: o, addrs: append([]string(nil), o.Addrs...), cur: x.(broken), epoch: 1, stop: make(chan struct{})}
	if o.Spawned != nil || o.Probe > 0 {
		s.wg.Go(s.watch)
	}
	return s, nil
}

// Execute runs the step on the group, or fails at once while it is down.
func (s *Supervisor) Execute(in *executor.StepInput) (executor.StepOutput, error) {
	cur, err := s.serving()
	if err != nil {
		return executor.StepOutput{}, err
	}
	out, err := cur.Execute(in)
	return out, s.after(cur, err)
}

// Submit is Execute for a step that may be in flight with others
// (engine.Submitter): it passes the step on to a Pipeline's Submit; a
// Group, which runs one step at a time, runs it before returning.
func (s *Supervisor) Submit(in *executor.StepInput) (wait func() (executor.StepOutput, error)) {
	cur, err := s.serving()
	if err != nil {
		return failed(err)
	}
	if sub, ok := cur.(interface {
		Submit(*executor.StepInput) func() (executor.StepOutput, error)
	}); ok {
		w := sub.Submit(in)
		return func() (executor.StepOutput, error) {
			out, err := w()
			return out, s.after(cur, err)
		}
	}
	out, err := cur.Execute(in)
	err = s.after(cur, err)
	return func() (executor.StepOutput, error) { return out, err }
}

// serving is the group that takes steps, or why there is none.
func (s *Supervisor) serving() (broken, error) {
	s.mu.Lock()
	cur, ready, down := s.cur, s.ready, s.down
	s.mu.Unlock()
	switch {
	case cur != nil:
		return cur, nil
	case down != nil:
		return nil, down
	case ready != nil:
		// Planned before Epoch reported the new storage: its block
		// tables point into pages the new workers never wrote.
		return nil, errReconnected
	}
	return nil, errors.New(s.o.What + ": closed")
}

// after is the error a step on cur ends with: a failure that broke the
// group marks it down.
func (s *Supervisor) after(cur broken, err error) error {
	if err == nil {
		return nil
	}
	if cur.err() == nil {
		return err // refused before it reached the workers: the group still serves
	}
	return s.fail(cur, err)
}

// Epoch counts the groups connected: it changes when a group reconnected
// after a failure is installed, here, so that the engine, which calls it
// between steps, never runs a step planned for the old group's KV on the
// new one (executor.Restartable).
func (s *Supervisor) Epoch() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ready != nil && s.cur == nil {
		s.cur, s.ready = s.ready, nil
		s.epoch++
	}
	return s.epoch
}

// Health is nil while the group serves (or has reconnected), else why not.
func (s *Supervisor) Health() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.cur != nil || s.ready != nil:
		return nil
	case s.down != nil:
		return s.down.clone()
	}
	return errors.New(s.o.What + ": closed")
}

// Counts are the supervisor's counters.
func (s *Supervisor) Counts() SupervisorCounts {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts
}

// Addrs are the workers' addresses now (a restarted spawned worker
// listens on a new port).
func (s *Supervisor) Addrs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.addrs...)
}

// Close stops reconnecting and hangs up on the workers. A reconnect in
// progress is not waited for (a stopped worker can hold it for the
// connect timeout): it closes what it connects when it ends.
func (s *Supervisor) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.stop)
	cur, ready := s.cur, s.ready
	s.cur, s.ready = nil, nil
	s.mu.Unlock()
	s.wg.Wait()
	for _, x := range []broken{cur, ready} {
		if x != nil {
			x.Close()
		}
	}
	return nil
}

// fail marks the group down because of err (unless it already is, for
// this group), closes it and starts reconnecting. It returns the error
// the step fails with.
func (s *Supervisor) fail(g broken, err error) error {
	s.mu.Lock()
	if s.cur != g || s.closed {
		d := s.down
		s.mu.Unlock()
		if d == nil {
			return err
		}
		return d.clone()
	}
	s.cur = nil
	s.counts.Failures++
	s.down = &DownError{Since: time.Now(), Cause: err}
	s.down.blame(err, s.addrs, s.o.Name)
	d := s.down.clone()
	if !s.looping {
		s.looping = true
		go s.reconnect()
	}
	s.mu.Unlock()
	g.Close()
	s.logf("worker group down: %v; reconnecting", err)
	return d
}

// reconnect tries the workers again with backoff until a group
// connects (it is then installed by the next Epoch) or Close.
func (s *Supervisor) reconnect() {
	wait := s.o.Backoff
	for {
		select {
		case <-s.stop:
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, s.o.MaxBackoff)
		addrs, err := s.restartDead()
		if err == nil {
			err = probe(addrs, s.name)
		}
		var x executor.Executor
		if err == nil {
			x, err = s.o.Connect(addrs)
		}
		s.mu.Lock()
		s.counts.Attempts++
		if s.closed {
			s.looping = false
			s.mu.Unlock()
			if err == nil {
				x.(broken).Close()
			}
			return
		}
		if err != nil {
			s.down.Last, s.down.Attempts = err, s.down.Attempts+1
			s.down.blame(err, addrs, s.o.Name)
			s.mu.Unlock()
			continue
		}
		s.ready, s.down, s.looping = x.(broken), nil, false
		s.counts.Reconnects++
		s.mu.Unlock()
		s.logf("worker group reconnected: %v", addrs)
		return
	}
}

// restartDead starts again the spawned workers that exited and returns
// the addresses to connect to.
func (s *Supervisor) restartDead() ([]string, error) {
	if s.o.Spawned == nil {
		return s.Addrs(), nil
	}
	n, err := s.o.Spawned.RestartDead()
	addrs := s.o.Spawned.Current()
	s.mu.Lock()
	s.counts.Restarts += uint64(n)
	s.addrs = addrs
	s.mu.Unlock()
	if n > 0 {
		s.logf("restarted %d worker process(es): %v", n, addrs)
	}
	return addrs, err
}

// watch breaks the group as soon as a spawned worker exits or a worker
// refuses connections, rather than at the next step (which would then
// fail a request).
func (s *Supervisor) watch() {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	var probed time.Time
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		s.mu.Lock()
		cur, addrs := s.cur, s.addrs
		s.mu.Unlock()
		if cur == nil {
			continue
		}
		var err error
		if s.o.Spawned != nil {
			if i, why := s.o.Spawned.firstDead(); i >= 0 {
				err = &WorkerError{Worker: i, err: fmt.Errorf("%s: %s: the worker process %s", s.o.What, s.o.Name(i), why)}
			}
		}
		if err == nil && s.o.Probe > 0 && time.Since(probed) >= s.o.Probe {
			probed = time.Now()
			err = probe(addrs, s.name)
		}
		if err != nil {
			s.fail(cur, err)
		}
	}
}

// probe checks that every worker accepts a connection, so a reconnect
// attempt does not make the live ones load their shards for a group that
// cannot form. A connection closed before a hello is dropped quietly.
func probe(addrs []string, name func(int) string) error {
	for i, a := range addrs {
		c, err := net.DialTimeout("tcp", a, 2*time.Second)
		if err != nil {
			return &WorkerError{Worker: i, err: fmt.Errorf("%s at %s: not reachable: %w", name(i), a, err)}
		}
		c.Close()
	}
	return nil
}

// name is worker i's place with the group's kind: "tensor parallel: rank 1".
func (s *Supervisor) name(i int) string { return s.o.What + ": " + s.o.Name(i) }

func (s *Supervisor) logf(format string, args ...any) {
	if s.o.Log != nil {
		fmt.Fprintf(s.o.Log, format+"\n", args...)
	}
}

// DownError is why a supervised group does not serve: what broke it,
// the latest reconnect attempt's failure, and the workers blamed. Steps
// fail with it while the group is down; HTTP clients see a 503.
type DownError struct {
	Since    time.Time
	Cause    error // what broke the group
	Last     error // the latest reconnect attempt's failure (nil before one)
	Attempts int   // failed reconnect attempts
	Workers  []DownWorker
}

// DownWorker is a worker blamed for the group being down.
type DownWorker struct {
	Worker  int    `json:"worker"`
	Name    string `json:"name"`
	Address string `json:"address"`
	Error   string `json:"error"`
}

func (e *DownError) Error() string {
	msg := "worker group down: " + e.Cause.Error()
	if e.Last != nil {
		msg += fmt.Sprintf("; reconnecting (%d attempts, last: %v)", e.Attempts, e.Last)
	} else {
		msg += "; reconnecting"
	}
	return msg
}

func (e *DownError) Unwrap() error   { return e.Cause }
func (e *DownError) HTTPStatus() int { return http.StatusServiceUnavailable }

// HealthDetails are the fields /health adds to its 503 body.
func (e *DownError) HealthDetails() map[string]any {
	ws := e.Workers
	if ws == nil {
		ws = []DownWorker{}
	}
	return map[string]any{"workers_down": ws, "down_since": e.Since.UTC().Format(time.RFC3339Nano), "reconnect_attempts": e.Attempts}
}

// blame names the worker err blames (if it names one) as the one down.
func (e *DownError) blame(err error, addrs []string, name func(int) string) {
	we, ok := errors.AsType[*WorkerError](err)
	if !ok || we.Worker < 0 || we.Worker >= len(addrs) {
		return
	}
	e.Workers = []DownWorker{{Worker: we.Worker, Name: name(we.Worker), Address: addrs[we.Worker], Error: err.Error()}}
}

func (e *DownError) clone() *DownError {
	c := *e
	c.Workers = append([]DownWorker(nil), e.Workers...)
	return &c
}
