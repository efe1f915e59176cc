package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"pagoda/executor"
	"pagoda/model"
	"pagoda/ring"
)

// Sequence parallelism (Ring Attention) across worker processes.
//
// Every rank holds the whole model (weights replicated) and its share of
// one sequence's keys and values (model.SeqRank); attention passes K/V
// blocks around a ring of TCP links between the workers (ring.Link), on
// the workers' one port. The coordinator (SeqGroup) splits each prompt
// step's rows among the ranks (ring.Zigzag, which evens out the causal
// work), sends every rank the same decode rows, and puts together the
// logits the ranks return. A group serves one sequence at a time.
//
// The steps are the executor's (executor/wire.go); what a rank must do
// with its rows rides in the KV plan's notes, which say what the
// coordinator's manager did to the sequence:
//
//	NoteFree   the sequence the ranks hold is gone: forget it (first, before
//	           a new sequence's first step)
//	NoteCommit the sequence has computed its first N tokens after this
//	           step, whose rows are split among the ranks (a prefill step:
//	           a rank may have none, and still passes its blocks on)
//	neither    a decode step: every rank has the same rows
//
// The hello's Kind is "seq"; the ring's links open with ring.Link's own
// hello ("RING", the session, rank, ranks), which the worker's accept
// loop tells apart from the other planes and hands to the session.

// SeqOptions configure ConnectSeq.
type SeqOptions struct {
	// Model is the coordinator's model: every worker's must have its shape.
	Model *model.Config
	// Threads per worker (0: the worker's own default).
	Threads int
	// Context overrides the model's context length on the workers.
	Context int
	// Timeout bounds connecting and the workers' loading (0: 10 minutes).
	Timeout time.Duration
	// Exchange bounds each message around the ring (0: two minutes); the
	// coordinator waits a little longer for each rank's answer.
	Exchange time.Duration
}

// SeqGroup is the coordinator's side of a sequence-parallel group: an
// Executor whose steps are one sequence's, from its first token on.
type SeqGroup struct {
	links
	wait    time.Duration
	vocab   int
	remotes []*executor.Remote
	ins     []executor.StepInput
	outs    []executor.StepOutput
	errs    []error
	owner   []int // per row of the step: the rank that returns its logits
	plans   []model.KVPlan

	held bool // the ranks hold a sequence: seq, up to end
	seq  int32
	end  int

	stats SeqStats // guarded by links.mu
}

// SeqStats are what a group has run.
type SeqStats struct {
	Sequences, Steps int
	// Split are the rows of the latest sequence's split (prompt) steps
	// each rank ran: its share of the sequence's keys and values, less
	// the decode rows, which the rank holding the tail keeps.
	Split []int
}

// Stats are the group's counts so far.
func (g *SeqGroup) Stats() SeqStats {
	g.mu.Lock()
	defer g.mu.Unlock()
	st := g.stats
	st.Split = append([]int(nil), st.Split...)
	return st
}

// count records a step that ran.
func (g *SeqGroup) count(fresh, split bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	st := &g.stats
	st.Steps++
	if fresh {
		st.Sequences++
		st.Split = make([]int, len(g.remotes))
	}
	if split {
		for r := range g.ins {
			st.Split[r] += len(g.ins[r].Tokens)
		}
	}
}

// ConnectSeq makes the workers at addrs ranks 0…n-1 of a new
// sequence-parallel group: each loads the whole model and joins the ring.
func ConnectSeq(addrs []string, o SeqOptions) (*SeqGroup, error) {
	n := len(addrs)
	if n < 2 {
		return nil, fmt.Errorf("sequence parallel: %d workers (need at least 2)", n)
	}
	if o.Model == nil {
		return nil, errors.New("sequence parallel: no model shape")
	}
	session := newSession()
	hellos := make([]hello, n)
	for r := range hellos {
		hellos[r] = hello{Kind: "seq", Session: session, Rank: r, Ranks: n, Peers: addrs, Threads: o.Threads,
			Context: o.Context, Model: shapeOf(o.Model), ExchangeMS: o.Exchange.Milliseconds()}
	}
	conns, err := dialControl(addrs, hellos, o.Timeout, func(r int) string { return fmt.Sprintf("sequence parallel: worker %d", r) })
	if err != nil {
		return nil, err
	}
	g := &SeqGroup{links: links{conns: conns, closed: "sequence parallel: the group is closed"}, wait: Timeouts{Exchange: o.Exchange}.answer(),
		vocab: o.Model.VocabSize, remotes: make([]*executor.Remote, n), ins: make([]executor.StepInput, n),
		outs: make([]executor.StepOutput, n), errs: make([]error, n), plans: make([]model.KVPlan, n)}
	for r, c := range conns {
		g.remotes[r] = executor.NewRemote(c, c)
	}
	return g, nil
}

// errOneSequence is why a step that does not continue the sequence the
// ranks hold is refused.
const errOneSequence = "a sequence-parallel group serves one sequence at a time, from its first token"

// Execute runs one step of the sequence. A step whose first position is
// 0 starts a new sequence (the ranks forget the one they hold); any other
// must continue the held sequence right where it ends. Steps of at least
// two rows per rank (and every new sequence's first) are split among the
// ranks by ring.Zigzag; shorter ones (decode) go to every rank, and rank
// 0 returns their logits.
func (g *SeqGroup) Execute(in *executor.StepInput) (executor.StepOutput, error) {
	if err := g.err(); err != nil {
		return executor.StepOutput{}, err
	}
	T, P := len(in.Tokens), len(g.remotes)
	if T == 0 {
		return executor.StepOutput{}, nil // the engine's bookkeeping: the ranks keep no pages
	}
	if err := g.check(in); err != nil {
		return executor.StepOutput{}, err
	}
	fresh := in.Pos[0] == 0
	split := fresh || T >= 2*P
	g.plan(in, fresh, split)
	var wg sync.WaitGroup
	for r, x := range g.remotes {
		wg.Go(func() {
			g.conns[r].SetReadDeadline(time.Now().Add(g.wait))
			g.outs[r], g.errs[r] = x.Execute(&g.ins[r])
			g.errs[r] = stalled(g.errs[r], g.wait)
		})
	}
	wg.Wait()
	if r := blame(g.errs); r >= 0 {
		err := &WorkerError{Worker: r, err: fmt.Errorf("sequence parallel: rank %d: %w", r, g.errs[r])}
		g.fail(err)
		return executor.StepOutput{}, err
	}
	g.held, g.seq, g.end = true, in.Seq[0], int(in.Pos[T-1])+1
	g.count(fresh, split)
	return g.gather(in)
}

// check refuses what a sequence-parallel group cannot run.
func (g *SeqGroup) check(in *executor.StepInput) error {
	switch {
	case in.Hidden || in.Rope != nil || len(in.Moves) > 0:
		return errors.New("sequence parallel: hidden states, tree positions and KV moves (speculative decoding) are not supported")
	case in.KV != nil && len(in.KV.Notes) > 0:
		return errors.New("sequence parallel: KV policies are not supported")
	}
	for i := 1; i < len(in.Tokens); i++ {
		if in.Seq[i] != in.Seq[0] || in.Pos[i] != in.Pos[i-1]+1 {
			return fmt.Errorf("sequence parallel: a step of several sequences or with gaps (row %d: sequence %d at %d after %d at %d); %s",
				i, in.Seq[i], in.Pos[i], in.Seq[i-1], in.Pos[i-1], errOneSequence)
		}
	}
	if p := int(in.Pos[0]); p != 0 && (!g.held || in.Seq[0] != g.seq || p != g.end) {
		if !g.held {
			return fmt.Errorf("sequence parallel: a step of sequence %d from position %d, and the ranks hold no sequence; %s", in.Seq[0], p, errOneSequence)
		}
		return fmt.Errorf("sequence parallel: a step of sequence %d from position %d, and the ranks hold sequence %d up to %d; %s", in.Seq[0], p, g.seq, g.end, errOneSequence)
	}
	return nil
}

// plan writes each rank's step: its rows (split) or all of them, the
// logits marks of the rows it answers for, and the notes.
func (g *SeqGroup) plan(in *executor.StepInput, fresh, split bool) {
	T, P := len(in.Tokens), len(g.remotes)
	g.owner = g.owner[:0]
	for i := range T {
		g.owner = append(g.owner, 0)
		if split {
			g.owner[i] = zigzagOwner(i, T, P)
		}
	}
	for r := range g.ins {
		x := &g.ins[r]
		x.Tokens, x.Pos, x.Seq, x.Logits = x.Tokens[:0], x.Pos[:0], x.Seq[:0], x.Logits[:0]
		x.TopK = in.TopK
		p := &g.plans[r]
		p.Reset()
		if fresh {
			p.Notes = append(p.Notes, model.KVNote{Op: model.NoteFree, Seq: g.seq})
		}
		if split {
			p.Notes = append(p.Notes, model.KVNote{Op: model.NoteCommit, Seq: in.Seq[0], N: in.Pos[T-1] + 1})
		}
		x.KV = p
		for i := range T {
			if split && g.owner[i] != r {
				continue
			}
			x.Tokens, x.Pos, x.Seq = append(x.Tokens, in.Tokens[i]), append(x.Pos, in.Pos[i]), append(x.Seq, in.Seq[i])
			x.Logits = append(x.Logits, g.owner[i] == r && wants(in, i))
		}
	}
}

// zigzagOwner is the rank whose zigzag share of T rows over P ranks has
// row i.
func zigzagOwner(i, T, P int) int {
	c := i * 2 * P / T // the chunk, up to rounding
	for c > 0 && c*T/(2*P) > i {
		c--
	}
	for c < 2*P-1 && (c+1)*T/(2*P) <= i {
		c++
	}
	if c < P {
		return c
	}
	return 2*P - 1 - c
}

// wants says whether the step asks for row i's logits.
func wants(in *executor.StepInput, i int) bool {
	if in.Logits == nil {
		return i == len(in.Tokens)-1
	}
	return in.Logits[i]
}

// gather puts the ranks' logits (or top-k rows) back in the step's row
// order.
func (g *SeqGroup) gather(in *executor.StepInput) (executor.StepOutput, error) {
	var out executor.StepOutput
	next := make([]int, len(g.outs)) // rows taken from each rank's output
	for i := range in.Tokens {
		if !wants(in, i) {
			continue
		}
		r := g.owner[i]
		o := &g.outs[r]
		w := g.vocab
		if in.TopK > 0 {
			w = min(in.TopK, g.vocab)
			if (next[r]+1)*w > len(o.TopIDs) {
				return out, fmt.Errorf("sequence parallel: rank %d returned %d top-k ids, short of row %d", r, len(o.TopIDs), i)
			}
			out.TopIDs = append(out.TopIDs, o.TopIDs[next[r]*w:(next[r]+1)*w]...)
		}
		if (next[r]+1)*w > len(o.Logits) {
			return out, fmt.Errorf("sequence parallel: rank %d returned %d logits, short of row %d", r, len(o.Logits), i)
		}
		out.Logits = append(out.Logits, o.Logits[next[r]*w:(next[r]+1)*w]...)
		next[r]++
	}
	return out, nil
}

// blame is the rank whose error the step reports: one whose own
// connection failed or stayed silent (the others' errors are their
// exchanges with it), else the lowest that failed; -1 if none did.
func blame(errs []error) int {
	first := -1
	for r, err := range errs {
		if err == nil {
			continue
		}
		if _, ok := errors.AsType[*executor.RemoteError](err); !ok {
			return r
		}
		if first < 0 {
			first = r
		}
	}
	return first
}

// seqRank is a worker's member of a sequence-parallel group.
type seqRank struct {
	m    *model.Model
	link *ring.Link
	sr   *model.SeqRank
	b    model.Batch
}

func (s *seqRank) shape() *shape { return shapeOf(&s.m.Config) }

func (s *seqRank) close() {
	s.link.Close()
	s.m.Close()
}

// Execute runs the rank's part of one step (see the notes above). A
// failure closes the ring's links, so the other ranks fail their step at
// once instead of waiting out an exchange.
func (s *seqRank) Execute(in *executor.StepInput) (executor.StepOutput, error) {
	out, err := s.execute(in)
	if err != nil {
		s.link.Close()
		return executor.StepOutput{}, err
	}
	return out, nil
}

func (s *seqRank) execute(in *executor.StepInput) (executor.StepOutput, error) {
	prefill := false
	if in.KV != nil {
		for _, n := range in.KV.Notes {
			switch n.Op {
			case model.NoteFree:
				s.sr.Reset()
			case model.NoteCommit:
				prefill = true
			default:
				return executor.StepOutput{}, fmt.Errorf("sequence parallel: KV note %d is not a sequence-parallel step's", n.Op)
			}
		}
	}
	s.b = model.Batch{Tokens: in.Tokens, Pos: in.Pos, Seq: in.Seq, Logits: in.Logits}
	defer func() { s.b = model.Batch{} }()
	var logits []float32
	var err error
	switch {
	case prefill:
		logits, err = s.sr.Prefill(&s.b)
	case len(in.Tokens) == 0:
		return executor.StepOutput{}, errors.New("sequence parallel: a decode step without rows")
	default:
		logits, err = s.sr.Decode(&s.b)
	}
	if err != nil {
		return executor.StepOutput{}, err
	}
	out := executor.StepOutput{Logits: logits}
	if in.TopK > 0 && len(in.Tokens) > 0 {
		if out.TopIDs, out.Logits, err = executor.TopK(logits, in.Rows(), in.TopK, nil, nil); err != nil {
			return executor.StepOutput{}, err
		}
	}
	return out, nil
}

// joinSeq loads the whole model and joins the ring of the hello's group.
func (w *Worker) joinSeq(h *hello) (*seqRank, error) {
	switch {
	case h.Ranks < 2 || h.Ranks > 256:
		return nil, fmt.Errorf("a ring of %d ranks", h.Ranks)
	case h.Rank < 0 || h.Rank >= h.Ranks:
		return nil, fmt.Errorf("rank %d of %d", h.Rank, h.Ranks)
	case len(h.Peers) != h.Ranks:
		return nil, fmt.Errorf("%d peer addresses for %d ranks", len(h.Peers), h.Ranks)
	case h.Model == nil:
		return nil, errors.New("hello without the model's shape")
	}
	session, err := strconv.ParseUint(h.Session, 16, 64)
	if err != nil {
		return nil, fmt.Errorf("hello with session %q (want 16 hex digits)", h.Session)
	}
	// Taken now, so that the ring connections of ranks that load faster
	// wait for this one.
	ln := w.ringListener(session)
	defer w.dropRingListener(session, ln)
	o := w.Options
	o.Rank, o.Ranks, o.Group = 0, 1, nil
	if h.Threads > 0 {
		o.Threads = h.Threads
	}
	if h.Context > 0 {
		o.ContextLen = h.Context
	}
	o.Reserve = func(c *model.Config, _ model.Stage) (int64, error) {
		// This rank's share of a whole context's f32 K and V.
		nkv, kd, vd := c.KVShape()
		return int64(c.NLayer) * int64((c.ContextLen+h.Ranks-1)/h.Ranks) * int64(nkv) * int64(kd+vd) * 4, nil
	}
	m, err := model.Open(w.Model, o)
	if err != nil {
		return nil, capHint(err)
	}
	if err := h.Model.diff(shapeOf(&m.Config)); err != nil {
		m.Close()
		return nil, err
	}
	link, err := ring.Join(h.Rank, ln, h.Peers, session, w.joinTimeout())
	if err != nil {
		m.Close()
		return nil, err
	}
	link.Timeout = timeoutsOf(h).exchange()
	sr, err := model.NewSeqRank(m, link)
	if err != nil {
		link.Close()
		m.Close()
		return nil, err
	}
	return &seqRank{m: m, link: link, sr: sr}, nil
}

// ringListener is the listener of session's ring connections: the
// worker's accept loop hands it those that open with the ring's hello.
// Either side may come first (a faster rank dials before this one has
// loaded its model), so whichever does makes it.
func (w *Worker) ringListener(session uint64) *ringListener {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.rings == nil {
		w.rings = map[uint64]*ringListener{}
	}
	l := w.rings[session]
	if l == nil {
		l = &ringListener{ch: make(chan net.Conn, 16), kick: make(chan struct{})}
		w.rings[session] = l
		go func() {
			// A session that never joins here must not keep its
			// connections.
			time.Sleep(w.joinTimeout() + helloTimeout)
			w.dropRingListener(session, l)
		}()
	}
	return l
}

func (w *Worker) dropRingListener(session uint64, l *ringListener) {
	w.mu.Lock()
	if w.rings[session] == l {
		delete(w.rings, session)
	}
	w.mu.Unlock()
	for {
		select {
		case c := <-l.ch:
			c.Close()
		default:
			return
		}
	}
}

// handRing passes a ring connection to its session, or closes it.
func (w *Worker) handRing(c net.Conn, hdr []byte) {
	l := w.ringListener(binary.LittleEndian.Uint64(hdr[4:12]))
	select {
	case l.ch <- c:
	default:
		w.Log.Warn("dropping a ring connection", "from", c.RemoteAddr())
		c.Close()
	}
}

// ringListener is a net.Listener fed connections by the worker, with
// the deadline ring.Join sets (and moves to now to give up).
type ringListener struct {
	ch chan net.Conn

	mu       sync.Mutex
	deadline time.Time
	kick     chan struct{} // closed when the deadline changes
}

func (l *ringListener) Accept() (net.Conn, error) {
	for {
		l.mu.Lock()
		d, kick := l.deadline, l.kick
		l.mu.Unlock()
		var timeout <-chan time.Time
		var t *time.Timer
		if !d.IsZero() {
			t = time.NewTimer(time.Until(d))
			timeout = t.C
		}
		var c net.Conn
		var err error
		select {
		case c = <-l.ch:
		case <-timeout:
			err = os.ErrDeadlineExceeded
		case <-kick:
		}
		if t != nil {
			t.Stop()
		}
		if c != nil || err != nil {
			return c, err
		}
	}
}

func (l *ringListener) SetDeadline(t time.Time) error {
	l.mu.Lock()
	l.deadline = t
	close(l.kick)
	l.kick = make(chan struct{})
	l.mu.Unlock()
	return nil
}

func (l *ringListener) Close() error   { return nil }
func (l *ringListener) Addr() net.Addr { return &net.TCPAddr{} }
