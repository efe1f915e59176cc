package engine

import (
	"context"
	"sync"
)

// outbox decouples the engine loop from a request's consumer: the loop
// appends without ever blocking, a pump goroutine delivers in order.
type outbox struct {
	mu     sync.Mutex
	q      []Event
	closed bool
	sig    chan struct{}
}

func newOutbox() *outbox { return &outbox{sig: make(chan struct{}, 1)} }

func (o *outbox) push(ev Event, last bool) {
	o.mu.Lock()
	if !o.closed {
		o.q = append(o.q, ev)
		o.closed = last
	}
	o.mu.Unlock()
	select {
	case o.sig <- struct{}{}:
	default:
	}
}

// pump delivers events to out until the final one, or until ctx ends (the
// consumer left), then closes out.
func (o *outbox) pump(ctx context.Context, out chan<- Event) {
	defer close(out)
	for {
		o.mu.Lock()
		q, closed := o.q, o.closed
		o.q = nil
		o.mu.Unlock()
		for _, ev := range q {
			select {
			case out <- ev:
			case <-ctx.Done():
				return
			}
		}
		if len(q) > 0 {
			continue
		}
		if closed {
			return
		}
		select {
		case <-o.sig:
		case <-ctx.Done():
			return
		}
	}
}
