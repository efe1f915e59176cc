package cluster

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"pagoda/executor"
)

// fakeGroup is a group whose next step fails as told.
type fakeGroup struct {
	id     int
	mu     sync.Mutex
	next   error // the next step's error
	breaks bool  // and it breaks the group
	broke  error
	closed bool
}

func (g *fakeGroup) Execute(in *executor.StepInput) (executor.StepOutput, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.broke != nil {
		return executor.StepOutput{}, g.broke
	}
	err := g.next
	g.next = nil
	if err != nil && g.breaks {
		g.broke = err
	}
	return executor.StepOutput{Logits: []float32{float32(g.id)}}, err
}

func (g *fakeGroup) Close() error { g.mu.Lock(); g.closed = true; g.mu.Unlock(); return nil }
func (g *fakeGroup) err() error   { g.mu.Lock(); defer g.mu.Unlock(); return g.broke }

// listening is the address of a listener that takes connections and
// hangs up (what the reconnect's probe needs), closed with the test.
func listening(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return ln.Addr().String()
}

// TestSupervisor: a step error that leaves the group serving passes
// through; one that breaks it marks the group down (a 503 naming the
// worker blamed), fails later steps at once, and reconnects in the
// background — blaming whichever worker each failed attempt names — until
// one connects; the new group serves only after Epoch reported it.
func TestSupervisor(t *testing.T) {
	var mu sync.Mutex
	var groups []*fakeGroup
	refuse := true // reconnect attempts fail, blaming worker 0
	connect := func(addrs []string) (executor.Executor, error) {
		mu.Lock()
		defer mu.Unlock()
		if len(groups) > 0 && refuse {
			return nil, &WorkerError{Worker: 0, err: fmt.Errorf("worker 0 at %s: refused", addrs[0])}
		}
		g := &fakeGroup{id: len(groups)}
		groups = append(groups, g)
		return g, nil
	}
	addrs := []string{listening(t), listening(t)}
	s, err := Supervise(SuperviseOptions{Addrs: addrs, Connect: connect, What: "tensor parallel",
		Name: func(i int) string { return fmt.Sprintf("rank %d", i) }, Backoff: 5 * time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ep := s.Epoch()
	if _, err := s.Execute(&executor.StepInput{}); err != nil || s.Health() != nil {
		t.Fatalf("serving: %v, health %v", err, s.Health())
	}
	g0 := groups[0]
	g0.next = errors.New("refused before reaching the workers")
	if _, err := s.Execute(&executor.StepInput{}); err == nil || s.Health() != nil || s.Counts().Failures != 0 {
		t.Fatalf("a step error that leaves the group serving: %v, health %v", err, s.Health())
	}
	g0.next, g0.breaks = &WorkerError{Worker: 1, err: errors.New("tensor parallel: rank 1: EOF")}, true
	_, err = s.Execute(&executor.StepInput{})
	de, ok := errors.AsType[*DownError](err)
	if !ok || de.HTTPStatus() != 503 || len(de.Workers) != 1 || de.Workers[0].Worker != 1 || de.Workers[0].Address != addrs[1] ||
		!strings.Contains(err.Error(), "worker group down: tensor parallel: rank 1: EOF") {
		t.Fatalf("the breaking step: %v", err)
	}
	if !g0.closed {
		t.Fatal("the broken group was not closed")
	}
	// The failed attempts blame worker 0 now.
	deadline := time.Now().Add(10 * time.Second)
	for {
		h, _ := s.Health().(*DownError)
		if h == nil {
			t.Fatal("up while every attempt fails")
		}
		if h.Attempts >= 2 {
			if len(h.Workers) != 1 || h.Workers[0].Worker != 0 || !strings.Contains(h.Last.Error(), "worker 0 at "+addrs[0]+": refused") {
				t.Fatalf("after %d failed attempts: %+v, last %v", h.Attempts, h.Workers, h.Last)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no reconnect attempts: %v", h)
		}
		time.Sleep(time.Millisecond)
	}
	mu.Lock()
	refuse = false
	mu.Unlock()
	for s.Health() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("not reconnected: %v", s.Health())
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := s.Execute(&executor.StepInput{}); !errors.Is(err, errReconnected) {
		t.Fatalf("a step before Epoch reported the new group: %v", err)
	}
	if s.Epoch() != ep+1 {
		t.Fatal("Epoch did not move")
	}
	out, err := s.Execute(&executor.StepInput{})
	if err != nil || out.Logits[0] != 1 {
		t.Fatalf("after Epoch: %v %v", out.Logits, err)
	}
	if c := s.Counts(); c.Failures != 1 || c.Reconnects != 1 || c.Attempts < 3 {
		t.Fatalf("counts %+v", c)
	}
}

// TestSupervisorCloseDuringReconnect: Close returns at once while a
// reconnect waits on a worker that does not answer, and the group that
// attempt connects afterwards is closed, not installed.
func TestSupervisorCloseDuringReconnect(t *testing.T) {
	release := make(chan struct{})
	var late *fakeGroup
	var mu sync.Mutex
	first := true
	connect := func([]string) (executor.Executor, error) {
		if first {
			first = false
			return &fakeGroup{next: errors.New("boom"), breaks: true}, nil
		}
		<-release
		mu.Lock()
		defer mu.Unlock()
		late = &fakeGroup{}
		return late, nil
	}
	s, err := Supervise(SuperviseOptions{Addrs: []string{listening(t)}, Connect: connect, Backoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s.Execute(&executor.StepInput{})
	time.Sleep(20 * time.Millisecond) // the reconnect is waiting in connect
	start := time.Now()
	s.Close()
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Close took %v", d)
	}
	close(release)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		mu.Lock()
		done := late != nil && late.err() == nil && func() bool { late.mu.Lock(); defer late.mu.Unlock(); return late.closed }()
		mu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the late group was not closed")
		}
	}
	if _, err := s.Execute(&executor.StepInput{}); err == nil {
		t.Fatal("a step after Close ran")
	}
}
