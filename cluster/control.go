package cluster

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// The control plane: gRPC.
//
// A coordinator makes a worker a rank or a stage of its group by a gRPC
// call, pagoda.cluster.v1.Worker/Join, whose request is the hello (the
// group's shape, the worker's place in it, the KV storage) and whose
// answer is the worker's model shape and a token; the worker loads its
// shard and joins the mesh before it answers, and a refusal is a gRPC
// status with the reason. Leave ends a joined session that will not be
// used (another worker of the group failed to join). The worker also
// serves the standard gRPC health service (grpc.health.v1), which a
// cluster manager's probes and grpc-health-probe speak.
//
// The data plane stays on plain TCP: the steps, and the activations
// between the ranks and the stages, are frames of raw bytes on persistent
// connections (executor/wire.go, mesh.go), where a framework's
// per-message costs would be paid on every layer. After Join the
// coordinator opens the session's step connection with a one-frame
// hello naming the token. Both planes share the worker's one port: a
// connection that opens with HTTP/2's preface is gRPC's.
//
// Messages are JSON (the codec below): the hello is already a JSON
// document, and the control plane is a few calls per group, so no
// generated code is needed for it.

const (
	controlService = "pagoda.cluster.v1.Worker"
	joinMethod     = "/" + controlService + "/Join"
	leaveMethod    = "/" + controlService + "/Leave"
)

// jsonCodec carries the control plane's messages as JSON.
type jsonCodec struct{}

func (jsonCodec) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (jsonCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }
func (jsonCodec) Name() string                       { return "json" }

func init() { encoding.RegisterCodec(jsonCodec{}) }

// joined is Join's answer: the worker's reply and the token its step
// connection names.
type joined struct {
	reply
	Token string `json:"token"`
}

type leaveRequest struct {
	Token string `json:"token"`
}

// controlServer is what the service's handlers call.
type controlServer interface {
	join(ctx context.Context, h *hello) (*joined, error)
	leave(token string) error
}

var controlDesc = grpc.ServiceDesc{
	ServiceName: controlService,
	HandlerType: (*controlServer)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "Join", Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			h := new(hello)
			if err := dec(h); err != nil {
				return nil, err
			}
			return srv.(controlServer).join(ctx, h)
		}},
		{MethodName: "Leave", Handler: func(srv any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			r := new(leaveRequest)
			if err := dec(r); err != nil {
				return nil, err
			}
			return &struct{}{}, srv.(controlServer).leave(r.Token)
		}},
	},
	Metadata: "pagoda/cluster/control.go",
}

// pending is a joined member waiting for its step connection.
type pending struct {
	mb   member
	what string
	h    *hello
	// done is closed when the session ends (served, left or timed out).
	done  chan struct{}
	taken bool
}

// controlPlane is a worker's gRPC side.
type controlPlane struct {
	w      *Worker
	srv    *grpc.Server
	health *health.Server
	conns  *chanListener

	mu      sync.Mutex
	pending map[string]*pending
}

func newControlPlane(w *Worker, addr net.Addr) *controlPlane {
	cp := &controlPlane{w: w, srv: grpc.NewServer(), health: health.NewServer(), conns: newChanListener(addr), pending: map[string]*pending{}}
	cp.srv.RegisterService(&controlDesc, cp)
	healthpb.RegisterHealthServer(cp.srv, cp.health)
	go cp.srv.Serve(cp.conns)
	return cp
}

func (cp *controlPlane) close() {
	cp.health.Shutdown()
	cp.srv.Stop()
}

// join makes this worker a member of the hello's group: a rank (Kind
// "coordinator"), a stage ("stage") or a rank of a sequence-parallel
// ring ("seq").
func (cp *controlPlane) join(ctx context.Context, h *hello) (*joined, error) {
	w := cp.w
	what, joinAs := "rank", func(h *hello) (member, error) { return w.join(h) }
	switch h.Kind {
	case "coordinator":
	case "stage":
		what, joinAs = "stage", func(h *hello) (member, error) { return w.joinStage(h) }
	case "seq":
		what, joinAs = "sequence-parallel rank", func(h *hello) (member, error) { return w.joinSeq(h) }
	default:
		return nil, status.Errorf(codes.InvalidArgument, "a join of kind %q", h.Kind)
	}
	// A coordinator that reconnects right after hanging up finds the old
	// session still winding down: wait a little for it.
	if !w.acquire(5 * time.Second) {
		return nil, status.Error(codes.ResourceExhausted, "this worker already serves a group")
	}
	d, err := w.wireOf(h)
	var mb member
	if err == nil {
		mb, err = joinAs(h)
	}
	if err != nil {
		w.release()
		w.Log.Error("joining the group failed", what, h.Rank, "err", err)
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	var tok [16]byte
	rand.Read(tok[:])
	p := &pending{mb: mb, what: what, h: h, done: make(chan struct{})}
	token := hex.EncodeToString(tok[:])
	cp.mu.Lock()
	cp.pending[token] = p
	cp.mu.Unlock()
	cp.health.SetServingStatus(controlService, healthpb.HealthCheckResponse_SERVING)
	go func() {
		// A member whose coordinator never opens its step connection
		// (it failed, or another worker did) must not hold the worker.
		select {
		case <-p.done:
		case <-time.After(helloTimeout):
			cp.end(token, "its step connection never came")
		}
	}()
	return &joined{reply: reply{Model: mb.shape(), Wire: d.String()}, Token: token}, nil
}

func (cp *controlPlane) leave(token string) error {
	if !cp.end(token, "the coordinator left") {
		return status.Error(codes.NotFound, "no session waits under this token")
	}
	return nil
}

// end closes a member that has not started serving, and says whether
// there was one.
func (cp *controlPlane) end(token, why string) bool {
	cp.mu.Lock()
	p := cp.pending[token]
	if p == nil || p.taken {
		cp.mu.Unlock()
		return false
	}
	delete(cp.pending, token)
	cp.mu.Unlock()
	cp.w.Log.Info("group ended before its steps", p.what, p.h.Rank, "why", why)
	p.mb.close()
	cp.w.release()
	close(p.done)
	return true
}

// serve runs the steps of the session token names on c, its step
// connection, until the coordinator hangs up.
func (cp *controlPlane) serve(c net.Conn, token string) {
	defer c.Close()
	cp.mu.Lock()
	p := cp.pending[token]
	if p != nil && !p.taken {
		p.taken = true
		delete(cp.pending, token)
	} else {
		p = nil
	}
	cp.mu.Unlock()
	bw := bufio.NewWriter(c)
	if p == nil {
		writeMsg(bw, reply{Error: "no joined session under this token (it timed out or left)"})
		return
	}
	defer func() {
		p.mb.close()
		cp.w.release()
		close(p.done)
	}()
	if err := writeMsg(bw, reply{Model: p.mb.shape()}); err != nil {
		return
	}
	w := cp.w
	blocks := 0 // a sequence-parallel rank keeps its K/V outside any block pool
	if p.h.KV != nil {
		blocks = p.h.KV.NumBlocks
	}
	w.Log.Info("serving", p.what, p.h.Rank, "of", p.h.Ranks, "kv_blocks", blocks, "wire", p.h.Wire)
	err := serveSteps(c, p.mb)
	w.Log.Info("group ended", p.what, p.h.Rank, "err", err)
}

// chanListener is a net.Listener fed the connections the worker's accept
// loop found to be gRPC's.
type chanListener struct {
	addr net.Addr
	ch   chan net.Conn
	once sync.Once
	done chan struct{}
}

func newChanListener(addr net.Addr) *chanListener {
	return &chanListener{addr: addr, ch: make(chan net.Conn), done: make(chan struct{})}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return l.addr }

// hand passes c to the gRPC server, or closes it when the server is gone.
func (l *chanListener) hand(c net.Conn) {
	select {
	case l.ch <- c:
	case <-l.done:
		c.Close()
	}
}

// peekedConn is a connection whose first bytes were read to tell the
// planes apart, and are read again.
type peekedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *peekedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// isRing says whether c (as isControl left it) opens with a ring link's
// hello (ring.Link: "RING", u64 session, u32 rank, u32 ranks) and returns
// its first 12 bytes. A data-plane hello cannot: its length would be
// 0x474E4952, far over maxHello.
func isRing(c net.Conn) ([]byte, bool) {
	pc, ok := c.(*peekedConn)
	if !ok {
		return nil, false
	}
	b, err := pc.r.Peek(4)
	if err != nil || string(b) != "RING" {
		return nil, false
	}
	b, err = pc.r.Peek(12)
	return b, err == nil
}

// http2Preface is how every gRPC connection opens.
const http2Preface = "PRI * HTTP/2.0"

// isControl reads (and keeps) the first bytes of c to say whether it is
// the control plane's (gRPC). A connection closed before any byte (a TCP
// health check) gives io.EOF.
func isControl(c net.Conn) (net.Conn, bool, error) {
	br := bufio.NewReaderSize(c, 64) // the ring's hello fits too (isRing)
	pc := &peekedConn{Conn: c, r: br}
	// One byte first: a data-plane frame's first byte is rarely the
	// preface's, and a peer that sent a few bytes of garbage must not be
	// kept waiting for fourteen.
	b, err := br.Peek(1)
	if err != nil {
		return pc, false, err
	}
	if b[0] != http2Preface[0] {
		return pc, false, nil
	}
	b, _ = br.Peek(len(http2Preface))
	return pc, string(b) == http2Preface, nil
}

// dialControl joins the workers at addrs with their hellos, all at once
// (a worker answers once the whole mesh is up, which needs every rank's
// join), then opens each one's step connection. name(i) names worker i
// in errors. On any failure the workers that joined are left.
func dialControl(addrs []string, hellos []hello, timeout time.Duration, name func(int) string) ([]net.Conn, error) {
	if timeout == 0 {
		timeout = 10 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	n := len(addrs)
	ccs := make([]*grpc.ClientConn, n)
	defer func() {
		for _, cc := range ccs {
			if cc != nil {
				cc.Close()
			}
		}
	}()
	conns := make([]net.Conn, n)
	tokens := make([]string, n)
	fail := func(r int, err error) ([]net.Conn, error) {
		for i, c := range conns {
			if c != nil {
				c.Close()
			} else if tokens[i] != "" && ccs[i] != nil {
				lctx, lcancel := context.WithTimeout(context.Background(), 5*time.Second)
				ccs[i].Invoke(lctx, leaveMethod, &leaveRequest{Token: tokens[i]}, &struct{}{}, grpc.CallContentSubtype("json"))
				lcancel()
			}
		}
		return nil, &WorkerError{Worker: r, err: fmt.Errorf("%s at %s: %w", name(r), addrs[r], err)}
	}
	for r, a := range addrs {
		cc, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return fail(r, err)
		}
		ccs[r] = cc
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range addrs {
		wg.Go(func() {
			var j joined
			err := ccs[r].Invoke(ctx, joinMethod, &hellos[r], &j, grpc.CallContentSubtype("json"), grpc.WaitForReady(true))
			switch {
			case err != nil:
				errs[r] = controlError(err)
			case !sameWire(j.Wire, hellos[r].Wire):
				tokens[r] = j.Token
				errs[r] = fmt.Errorf("the worker does not take %s activations on the wire (it answered %q)", hellos[r].Wire, j.Wire)
			default:
				tokens[r] = j.Token
			}
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			return fail(r, err)
		}
	}
	for r, a := range addrs {
		c, err := stepConn(ctx, a, tokens[r])
		if err != nil {
			return fail(r, err)
		}
		conns[r] = c
	}
	return conns, nil
}

// stepConn opens the step connection of the session token names.
func stepConn(ctx context.Context, addr, token string) (net.Conn, error) {
	var d net.Dialer
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := d.DialContext(dctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(helloTimeout))
	var rep reply
	if err := writeMsg(bufio.NewWriter(c), hello{Kind: "steps", Session: token}); err == nil {
		err = readMsg(c, &rep)
	}
	if err == nil && rep.Error != "" {
		err = errors.New(rep.Error)
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("step connection: %w", err)
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

// controlError turns a refusal's gRPC status into its reason.
func controlError(err error) error {
	if s, ok := status.FromError(err); ok {
		switch s.Code() {
		case codes.FailedPrecondition, codes.ResourceExhausted, codes.InvalidArgument:
			return errors.New(s.Message())
		case codes.Unavailable, codes.DeadlineExceeded:
			return fmt.Errorf("%s (%s)", s.Message(), s.Code())
		}
	}
	return err
}

var _ io.Reader = (*peekedConn)(nil)
