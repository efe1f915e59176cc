package cluster

import (
	"errors"
	"net"
	"sync"
)

// links are a coordinator's connections to its workers and whether they
// still serve. The first failure breaks them for good: the workers' KV
// storage is then in an unknown state, so every later step fails with
// that error.
type links struct {
	conns  []net.Conn
	closed string // the error after Close, naming the group

	mu     sync.Mutex // also guards what the embedding type keeps beside
	broken error
	done   bool
}

// err is the failure that broke the links, if any.
func (l *links) err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.broken
}

// fail breaks the links with err (unless already broken) and hangs up.
func (l *links) fail(err error) {
	l.mu.Lock()
	if l.broken == nil {
		l.broken = err
	}
	l.mu.Unlock()
	l.Close()
}

// closeConns closes the connections (without marking the links closed).
func (l *links) closeConns() {
	for _, c := range l.conns {
		if c != nil {
			c.Close()
		}
	}
}

// Close hangs up on every worker; they free what they hold and wait for
// the next coordinator.
func (l *links) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		return nil
	}
	l.done = true
	if l.broken == nil {
		l.broken = errors.New(l.closed)
	}
	l.closeConns()
	return nil
}
