package engine

import (
	"context"
	"sync"
)

// outbox decouples the engine loop from a request's consumer: the loop
// appends without ever blocking, a pump goroutine runs the output
// processor (outProc) over what it appends and delivers in order.
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

// pump runs the request's output processor over the events the loop
// pushes and delivers its events to out until the final one, or until ctx
// ends (the consumer left), then closes out. For a request with stop
// strings, events are processed as they arrive, also while a slow
// consumer holds up delivery, so a stop string stops the sequence without
// waiting for the client to read.
func (o *outbox) pump(ctx context.Context, out chan<- Event, p *outProc) {
	defer close(out)
	// ready is being delivered; next gathers what is processed meanwhile
	// and is merged as one batch when ready is through, as a consumer
	// that lags sees it.
	var ready, next []Event
	final := false
	emit := func(ev Event) { next = append(next, ev) }
	for {
		o.mu.Lock()
		q := o.q
		o.q = nil
		o.mu.Unlock()
		for _, ev := range q {
			if !final {
				final = p.process(ev, emit)
			}
		}
		if len(ready) == 0 {
			ready, next = coalesce(next), nil
		}
		if len(ready) == 0 {
			if final {
				return
			}
			select {
			case <-o.sig:
			case <-ctx.Done():
				return
			}
			continue
		}
		// Only stop strings need the events processed while the consumer
		// lags; otherwise waking for each one would cost the loop's
		// goroutines wake-ups for nothing.
		sig := o.sig
		if len(p.stops) == 0 {
			sig = nil
		}
		select {
		case out <- ready[0]:
			ready = ready[1:]
		case <-sig:
		case <-ctx.Done():
			return
		}
	}
}

// coalesce merges runs of events of one completion that piled up behind a
// slow consumer into one event carrying all their tokens, so a lagging
// client costs one growing event instead of one per token. Only adjacent
// events merge, which keeps the Usage event last.
func coalesce(q []Event) []Event {
	if len(q) < 2 {
		return q
	}
	out := q[:1]
	for _, ev := range q[1:] {
		last := &out[len(out)-1]
		if last.Index != ev.Index || last.Finish != FinishNone || last.Err != nil || last.Usage != nil || last.Prompt != ev.Prompt ||
			(last.Logprob == nil) != (ev.Logprob == nil) || (last.Top == nil) != (ev.Top == nil) {
			out = append(out, ev)
			continue
		}
		last.Tokens = append(last.Tokens, ev.Tokens...)
		last.Text += ev.Text
		last.Logprob = append(last.Logprob, ev.Logprob...)
		last.Top = append(last.Top, ev.Top...)
		last.Finish, last.Err, last.Usage = ev.Finish, ev.Err, ev.Usage
	}
	return out
}
