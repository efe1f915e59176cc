package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"pagoda/executor"
	"pagoda/kvcache"
	"pagoda/model"
)

// Worker serves one rank of a tensor-parallel group at a time: a
// coordinator connects, says which rank of how many it is and where the
// other ranks listen, and the worker loads its shard of the model, builds
// its shard of the KV storage, joins the mesh and executes steps until the
// coordinator hangs up. Then it frees all of it and waits for the next.
// A coordinator may instead make it one stage of a pipeline (a range of
// layers; stage.go), or one rank of such a stage (its shard of the
// stage's layers).
type Worker struct {
	// Model is the model file; every rank opens the same one and binds
	// only its shard.
	Model string
	// Options are the load options (threads, tokenizer); rank, ranks and
	// the group are set per session.
	Options model.Options
	Log     *slog.Logger
	// Wire, when set, is the only form of activations on the wire this
	// worker takes ("f32", "f16", "bf16"); a coordinator asking for
	// another is refused. Empty: whatever the coordinator's hello says.
	Wire string
	// JoinTimeout bounds how long a session waits for the other ranks'
	// mesh connections (0: one minute).
	JoinTimeout time.Duration
	// stageRowTime, when set, adds a sleep of that much per row to a
	// pipeline stage's compute: a device that does not take a CPU core
	// from the other stages, for measuring the schedule's bubble apart
	// from the machine's contention (tests only).
	stageRowTime time.Duration

	sent atomic.Int64 // see Sent

	mu      sync.Mutex
	slot    chan struct{}            // holds a token while a session runs
	joining map[string]chan peerConn // by session: mesh connections from higher ranks
	rings   map[uint64]*ringListener // by session: ring connections (seqpar.go)
}

type peerConn struct {
	rank int
	wire string
	c    net.Conn
}

// Sent is the bytes of activations this worker has written to other
// workers (mesh exchanges, hidden states to the next stage), headers
// included, over all its sessions: what the wire form changes.
func (w *Worker) Sent() int64 { return w.sent.Load() }

// helloTimeout bounds how long a new connection may take to say who it is.
const helloTimeout = 30 * time.Second

// Serve accepts connections on ln until it fails (it is closed): the
// control plane's (gRPC: joins, health; control.go) and the data plane's
// (a session's steps, the mesh's and the stages' links) on the one port.
func (w *Worker) Serve(ln net.Listener) error {
	if w.Log == nil {
		w.Log = slog.New(slog.DiscardHandler)
	}
	cp := newControlPlane(w, ln.Addr())
	defer cp.close()
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go w.handle(cp, c)
	}
}

func (w *Worker) handle(cp *controlPlane, c net.Conn) {
	c.SetDeadline(time.Now().Add(helloTimeout))
	c, control, err := isControl(c)
	if err == nil && !control {
		if hdr, ok := isRing(c); ok {
			c.SetDeadline(time.Time{})
			w.handRing(c, hdr)
			return
		}
	}
	var h hello
	if err == nil && !control {
		err = readMsg(c, &h)
	}
	if err != nil {
		level := slog.LevelWarn
		if err == io.EOF {
			// Closed before a byte: a TCP health check (a Kubernetes
			// tcpSocket probe), every few seconds; not worth a line.
			level = slog.LevelDebug
		}
		w.Log.Log(context.Background(), level, "dropping a connection", "from", c.RemoteAddr(), "err", err)
		c.Close()
		return
	}
	c.SetDeadline(time.Time{})
	if control {
		cp.conns.hand(c)
		return
	}
	switch h.Kind {
	case "peer":
		if ch := w.joinChan(h.Session); ch != nil {
			select {
			case ch <- peerConn{h.Rank, h.Wire, c}:
				return
			default:
			}
		}
		w.Log.Warn("dropping a mesh connection of no session here", "from", c.RemoteAddr(), "session", h.Session, "rank", h.Rank)
		c.Close()
	case "steps":
		cp.serve(c, h.Session)
	default:
		w.Log.Warn("dropping a connection", "from", c.RemoteAddr(), "kind", h.Kind)
		c.Close()
	}
}

// joinChan is the channel of session's incoming mesh connections.
// Connections from higher ranks can arrive before this worker hears its
// own hello, so whichever comes first makes it.
func (w *Worker) joinChan(session string) chan peerConn {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.joining == nil {
		w.joining = map[string]chan peerConn{}
	}
	ch := w.joining[session]
	if ch == nil && session != "" {
		ch = make(chan peerConn, 64)
		w.joining[session] = ch
		go func() {
			// A session that never starts here must not keep its
			// connections forever.
			time.Sleep(w.joinTimeout() + helloTimeout)
			w.mu.Lock()
			if w.joining[session] == ch {
				delete(w.joining, session)
			}
			w.mu.Unlock()
		}()
	}
	return ch
}

func (w *Worker) joinTimeout() time.Duration {
	if w.JoinTimeout > 0 {
		return w.JoinTimeout
	}
	return time.Minute
}

// member is what a session serves: a rank's shard (tensor parallel) or
// a stage's layers (pipeline parallel).
type member interface {
	executor.Executor
	shape() *shape
	close()
}

// serveSteps runs a session's steps on its connection until the
// coordinator hangs up.
func serveSteps(c net.Conn, mb member) error { return executor.Serve(c, c, mb) }

// wireOf is the activations' form the hello asks for, if this worker
// takes it.
func (w *Worker) wireOf(h *hello) (WireDType, error) {
	d, err := ParseWireDType(h.Wire)
	if err != nil {
		return 0, err
	}
	if w.Wire != "" {
		mine, err := ParseWireDType(w.Wire)
		if err != nil {
			return 0, fmt.Errorf("this worker's own %v", err)
		}
		if mine != d {
			return 0, fmt.Errorf("the coordinator asks for %s activations on the wire, this worker is started with --wire-dtype %s", d, mine)
		}
	}
	return d, nil
}

// sameWire says whether two hellos' wire forms are the same ("" is f32).
func sameWire(a, b string) bool {
	da, errA := ParseWireDType(a)
	db, errB := ParseWireDType(b)
	return errA == nil && errB == nil && da == db
}

func (w *Worker) acquire(wait time.Duration) bool {
	w.mu.Lock()
	if w.slot == nil {
		w.slot = make(chan struct{}, 1)
	}
	slot := w.slot
	w.mu.Unlock()
	select {
	case slot <- struct{}{}:
		return true
	case <-time.After(wait):
		return false
	}
}

func (w *Worker) release() { <-w.slot }

// rank is one session's state: the shard, its KV storage, the mesh.
type rank struct {
	m      *model.Model
	kv     *kvcache.Follower
	mesh   *Mesh
	local  *executor.Local
	logits bool
}

func (r *rank) shape() *shape { return shapeOf(&r.m.Config) }

func (r *rank) close() {
	r.mesh.Close()
	if r.kv != nil {
		r.kv.Close() // its pages are mappings outside the heap
	}
	r.m.Close()
}

// Execute runs the step on this rank's shard. A failure on one rank
// breaks the mesh, so the others fail their step at once rather than
// wait for an exchange that will not come.
//
// A step asking for top-k rows (StepInput.TopK) has the ranks exchange
// their vocabulary slices' top k instead of whole slices; the local
// executor then reduces the gathered rows, which hold only those, to the
// same top k the whole rows have.
func (r *rank) Execute(in *executor.StepInput) (executor.StepOutput, error) {
	r.mesh.SetTopK(in.TopK)
	out, err := r.local.Execute(in)
	r.mesh.SetTopK(0)
	if merr := r.mesh.Err(); merr != nil {
		return executor.StepOutput{}, merr
	}
	if err != nil {
		r.mesh.fail(err)
		return executor.StepOutput{}, err
	}
	if !r.logits {
		return executor.StepOutput{KV: out.KV}, nil
	}
	return out, nil
}

// join checks the hello, connects the mesh and loads the shard.
func (w *Worker) join(h *hello) (*rank, error) {
	switch {
	case h.Ranks < 2 || h.Ranks > 256:
		return nil, fmt.Errorf("a group of %d ranks", h.Ranks)
	case h.Rank < 0 || h.Rank >= h.Ranks:
		return nil, fmt.Errorf("rank %d of %d", h.Rank, h.Ranks)
	case len(h.Peers) != h.Ranks:
		return nil, fmt.Errorf("%d peer addresses for %d ranks", len(h.Peers), h.Ranks)
	case h.KV == nil || h.Model == nil:
		return nil, errors.New("hello without the model's shape or the KV storage")
	case h.Session == "":
		return nil, errors.New("hello without a session")
	}
	conns, err := w.connect(h)
	if err != nil {
		return nil, err
	}
	mesh := NewMesh(h.Rank, conns)
	mesh.timeout = timeoutsOf(h).exchange()
	d, err := ParseWireDType(h.Wire)
	if err != nil {
		mesh.Close()
		return nil, err
	}
	mesh.SetWire(d)
	mesh.also = &w.sent
	o := w.Options
	o.Rank, o.Ranks, o.Group = h.Rank, h.Ranks, mesh
	o.Reserve = h.KV.bytes
	if h.Threads > 0 {
		o.Threads = h.Threads
	}
	if h.Context > 0 {
		o.ContextLen = h.Context
	}
	m, err := model.Open(w.Model, o)
	if err != nil {
		mesh.Close()
		return nil, capHint(err)
	}
	if err := h.Model.diff(shapeOf(&m.Config)); err != nil {
		m.Close()
		mesh.Close()
		return nil, err
	}
	kc, err := h.KV.config(&m.Config, m.Stage())
	if err == nil {
		kc.Ops = m.Ops()
	}
	var kv *kvcache.Follower
	if err == nil {
		kv, err = kvcache.NewFollower(kc)
	}
	if err != nil {
		m.Close()
		mesh.Close()
		return nil, fmt.Errorf("KV storage: %w", err)
	}
	return &rank{m: m, kv: kv, mesh: mesh, local: executor.NewLocal(m, kv), logits: h.Logits}, nil
}

// capHint adds the fix to a shard refused by this worker's --max-memory.
func capHint(err error) error {
	var me *model.MemoryError
	if errors.As(err, &me) {
		return fmt.Errorf("%w (this worker's --max-memory); split the model across more workers (a larger --tensor-parallel or --pipeline-parallel), give this worker more memory, or a smaller --kv-cache-memory to the coordinator", err)
	}
	return err
}

// connect makes the mesh: this rank dials every lower rank and takes the
// connections of every higher one.
func (w *Worker) connect(h *hello) ([]net.Conn, error) {
	conns := make([]net.Conn, h.Ranks)
	fail := func(err error) ([]net.Conn, error) {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
		return nil, err
	}
	deadline := time.Now().Add(w.joinTimeout())
	for r := 0; r < h.Rank; r++ {
		c, err := net.DialTimeout("tcp", h.Peers[r], time.Until(deadline))
		if err != nil {
			return fail(fmt.Errorf("mesh: rank %d at %s: %w", r, h.Peers[r], err))
		}
		conns[r] = c
		if err := writeMsg(bufio.NewWriter(c), hello{Kind: "peer", Session: h.Session, Rank: h.Rank, Wire: h.Wire}); err != nil {
			return fail(fmt.Errorf("mesh: rank %d at %s: %w", r, h.Peers[r], err))
		}
	}
	ch := w.joinChan(h.Session)
	defer func() {
		w.mu.Lock()
		delete(w.joining, h.Session)
		w.mu.Unlock()
	}()
	for need := h.Ranks - 1 - h.Rank; need > 0; {
		select {
		case p := <-ch:
			if p.rank <= h.Rank || p.rank >= h.Ranks || conns[p.rank] != nil {
				p.c.Close()
				return fail(fmt.Errorf("mesh: unexpected connection from rank %d", p.rank))
			}
			if !sameWire(p.wire, h.Wire) {
				p.c.Close()
				return fail(fmt.Errorf("mesh: rank %d sends %q activations on the wire, this rank was told %q", p.rank, p.wire, h.Wire))
			}
			conns[p.rank] = p.c
			need--
		case <-time.After(time.Until(deadline)):
			return fail(fmt.Errorf("mesh: %d higher ranks did not connect within %v", need, w.joinTimeout()))
		}
	}
	return conns, nil
}
