package cluster

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"pagoda/executor"
	"pagoda/kvcache"
	"pagoda/model"
)

// Group is the coordinator's side of a tensor-parallel group: an Executor
// that sends each step to every rank and returns rank 0's logits. Every
// rank must run every step (each holds a slice of every layer), so the
// step goes out to all of them at once and the group waits for all.
type Group struct {
	links
	wait    time.Duration // for each rank's answer (Timeouts.answer)
	remotes []*executor.Remote
	outs    []executor.StepOutput
	errs    []error
}

// GroupOptions configure Connect.
type GroupOptions struct {
	// Model is the coordinator's view of the model (it may be one rank's
	// shard): each worker's must have the same shape.
	Model *model.Config
	// KV is the manager's configuration; every rank builds the same
	// blocks for its own heads.
	KV kvcache.Config
	// Threads per worker (0: the worker's own default).
	Threads int
	// Context overrides the model's context length on the workers (0:
	// the model's).
	Context int
	// Timeout bounds connecting and the workers' loading (0: 10 minutes).
	Timeout time.Duration
	// Wire is the form of the collectives' payloads between the ranks.
	Wire WireDType
	// Exchange bounds each exchange between the ranks (0: two minutes);
	// the coordinator waits a little longer for each rank's answer.
	Exchange time.Duration
}

// Connect makes the workers at addrs ranks 0…n-1 of a new group. It
// returns when every rank has loaded its shard and joined the mesh, or
// with the first rank's error.
func Connect(addrs []string, o GroupOptions) (*Group, error) {
	n := len(addrs)
	if n < 2 {
		return nil, fmt.Errorf("tensor parallel: %d workers (need at least 2)", n)
	}
	if o.Model == nil {
		return nil, errors.New("tensor parallel: no model shape")
	}
	spec, err := specOf(o.KV, "tensor parallel", false)
	if err != nil {
		return nil, err
	}
	// Every rank must get its hello before any can finish joining the
	// mesh: dialControl joins all at once.
	conns, err := dialControl(addrs, groupHellos(addrs, o, spec), o.Timeout, func(r int) string { return fmt.Sprintf("tensor parallel: worker %d", r) })
	if err != nil {
		return nil, err
	}
	g := &Group{links: links{conns: conns, closed: "tensor parallel: the group is closed"}, wait: Timeouts{Exchange: o.Exchange}.answer(),
		remotes: make([]*executor.Remote, n), outs: make([]executor.StepOutput, n), errs: make([]error, n)}
	for r, c := range g.conns {
		g.remotes[r] = executor.NewRemote(c, c)
	}
	return g, nil
}

// groupHellos are the joins of a new group's ranks.
func groupHellos(addrs []string, o GroupOptions, spec *kvSpec) []hello {
	session, n := newSession(), len(addrs)
	hellos := make([]hello, n)
	for r := range hellos {
		hellos[r] = hello{Kind: "coordinator", Session: session, Rank: r, Ranks: n, Peers: addrs, Threads: o.Threads,
			Context: o.Context, Model: shapeOf(o.Model), KV: spec, Logits: r == 0, Wire: o.Wire.String(), ExchangeMS: o.Exchange.Milliseconds()}
	}
	return hellos
}

// Execute runs the step on every rank and returns rank 0's output. A
// failure breaks the group for good: the ranks' KV storage and mesh are
// in an unknown state, so later steps fail with the first error. A rank
// whose connection failed or that did not answer in time is the cause
// of what the others report (their exchanges with it failed), so its
// error is the one returned; otherwise the lowest rank's.
func (g *Group) Execute(in *executor.StepInput) (executor.StepOutput, error) {
	if err := g.err(); err != nil {
		return executor.StepOutput{}, err
	}
	var wg sync.WaitGroup
	for r, x := range g.remotes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.conns[r].SetReadDeadline(time.Now().Add(g.wait))
			g.outs[r], g.errs[r] = x.Execute(in)
			g.errs[r] = stalled(g.errs[r], g.wait)
		}()
	}
	wg.Wait()
	first := -1
	for r, err := range g.errs {
		if err == nil {
			continue
		}
		if _, ok := errors.AsType[*executor.RemoteError](err); !ok {
			first = r
			break
		}
		if first < 0 {
			first = r
		}
	}
	if first >= 0 {
		err := &WorkerError{Worker: first, err: fmt.Errorf("tensor parallel: rank %d: %w", first, g.errs[first])}
		g.fail(err)
		return executor.StepOutput{}, err
	}
	out := g.outs[0]
	if len(out.KV) > 0 { // each rank's policies saw its own KV heads
		parts := make([][]model.KVReport, len(g.outs))
		for r := range g.outs {
			parts[r] = g.outs[r].KV
		}
		out.KV = executor.MergeReports(parts)
	}
	return out, nil
}

// newSession names a new group's lifetime (see hello.Session).
func newSession() string {
	var sid [8]byte
	rand.Read(sid[:])
	return hex.EncodeToString(sid[:])
}

// OpenShape opens the coordinator's view of the model: rank 0's shard of
// ranks, for the configuration, tokenizer and metadata the scheduler and
// server need, at 1/ranks of the weights' memory. It never runs the
// forward pass: its collective refuses to.
func OpenShape(path string, ranks int, o model.Options) (*model.Model, error) {
	o.Rank, o.Ranks, o.Group = 0, ranks, noExchange{}
	return model.Open(path, o)
}

// noExchange is the collective of a model that must not compute.
type noExchange struct{}

func (noExchange) AllReduce(int, []float32) {
	panic("cluster: the coordinator's shard ran the forward pass")
}

func (noExchange) AllGather(int, []float32, []float32, int) {
	panic("cluster: the coordinator's shard ran the forward pass")
}
