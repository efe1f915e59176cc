package cluster

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"pagoda/executor"
	"pagoda/kvcache"
	"pagoda/model"
)

// A pipeline stage is a worker holding a contiguous range of layers. The
// coordinator sends every step (or micro-batch) to every stage; stage 0
// embeds the tokens and runs its layers, then writes its residual stream
// to stage 1 over their own connection, which runs its layers on it, and
// so on; the last stage answers the coordinator with the logits, the
// others with an empty output that carries their compute time. Every
// stage writes one frame downstream per step, the hidden states or the
// step's error, so an error upstream fails the step on every later stage
// instead of leaving it waiting.
//
// Under tensor × pipeline parallelism a stage is a tensor-parallel group
// of ranks with its own mesh: each rank holds its shard of the stage's
// layers, and rank r hands its hidden states to rank r of the next stage.
// After a stage's last all-reduce every rank of it holds the same bits
// (the mesh sums in rank order), so each next-stage rank gets the full
// activations from its own counterpart: the hand-off runs over as many
// links in parallel as there are ranks, no rank relays for another, and
// a rank's failure reaches the next stage on the same path as its
// outputs. Only the last stage's rank 0 answers with the logits.

// stageRank is one session's state on a stage worker.
type stageRank struct {
	m          *model.Model
	kv         *kvcache.Follower
	prev, next net.Conn // nil on the first / the last stage
	pr         *bufio.Reader
	nw         *bufio.Writer
	rbuf, wbuf []byte
	in         executor.StepOutput // the hidden states received
	b          model.Batch
	rowTime    time.Duration // Worker.stageRowTime
	wire       codec         // the hidden states' form on the wire
	sent       *atomic.Int64 // bytes written to the next stage (Worker.sent)
	// mesh is the stage's tensor-parallel mesh (nil: the stage is this
	// worker alone); logits says this worker answers with the logits
	// (the last stage's rank 0).
	mesh   *Mesh
	logits bool
	// timeout bounds each read from the previous stage and write to the
	// next (Timeouts.Exchange).
	timeout time.Duration
}

func (s *stageRank) shape() *shape { return shapeOf(&s.m.Config) }

func (s *stageRank) close() {
	s.closeLinks()
	if s.kv != nil {
		s.kv.Close()
	}
	if s.m != nil {
		s.m.Close()
	}
}

func (s *stageRank) closeLinks() {
	for _, c := range []net.Conn{s.prev, s.next} {
		if c != nil {
			c.Close()
		}
	}
	if s.mesh != nil {
		s.mesh.Close()
	}
}

// Execute runs the step on this stage's layers.
func (s *stageRank) Execute(in *executor.StepInput) (executor.StepOutput, error) {
	hidden, err := s.receive()
	var out []float32
	var busy time.Duration
	if err == nil {
		out, busy, err = s.compute(in, hidden)
	}
	if err != nil && s.mesh != nil {
		// The stage's other ranks must not wait out an exchange with
		// this one: they fail theirs at once and pass the error on.
		s.mesh.fail(err)
	}
	if s.next == nil {
		if err != nil {
			return executor.StepOutput{}, err
		}
		if !s.logits {
			return executor.StepOutput{Busy: busy, KV: s.kv.Reports()}, nil
		}
		res := executor.StepOutput{Logits: out, Busy: busy, KV: s.kv.Reports()}
		if in.TopK > 0 {
			// Only the last stage has logits: it ships each row's top k.
			res.TopIDs, res.Logits, err = executor.TopK(out, in.Rows(), in.TopK, nil, nil)
		}
		return res, err
	}
	if serr := s.send(out, err); err == nil {
		err = serr
	}
	if err != nil {
		return executor.StepOutput{}, err
	}
	return executor.StepOutput{Busy: busy, KV: s.kv.Reports()}, nil
}

// receive reads the step's hidden states from the previous stage (nil
// on the first stage).
func (s *stageRank) receive() ([]float32, error) {
	if s.prev == nil {
		return nil, nil
	}
	s.prev.SetReadDeadline(time.Now().Add(s.timeout))
	var err error
	if s.rbuf, err = executor.ReadFrame(s.pr, s.rbuf); err == nil {
		err = s.wire.decodeHidden(s.rbuf, &s.in)
	}
	if err != nil {
		return nil, fmt.Errorf("from the previous stage: %w", err)
	}
	return s.in.Logits, nil
}

// compute runs the stage's layers on the step. Under tensor × pipeline
// a failed exchange is the step's error (the layers have no error path,
// so the rows after it are not to be used), and a mesh that already
// failed is not run at all.
func (s *stageRank) compute(in *executor.StepInput, hidden []float32) ([]float32, time.Duration, error) {
	if s.mesh != nil {
		if err := s.mesh.Err(); err != nil {
			return nil, 0, err
		}
		// Only the last stage's output head all-gathers.
		s.mesh.SetTopK(in.TopK)
		defer s.mesh.SetTopK(0)
	}
	start := time.Now()
	s.b = model.Batch{Tokens: in.Tokens, Pos: in.Pos, Seq: in.Seq, Logits: in.Logits, KV: in.KV}
	out, err := s.m.ForwardStage(&s.b, s.kv, hidden)
	s.b = model.Batch{}
	if s.mesh != nil {
		if merr := s.mesh.Err(); merr != nil {
			err = merr
		}
	}
	if s.rowTime > 0 {
		time.Sleep(s.rowTime * time.Duration(len(in.Tokens)))
	}
	return out, time.Since(start), err
}

// send writes the hidden states, or the step's error, to the next stage.
func (s *stageRank) send(hidden []float32, err error) error {
	if s.next == nil {
		return nil
	}
	if err != nil {
		s.wbuf = executor.AppendError(s.wbuf[:0], err)
	} else {
		s.wbuf = s.wire.appendHidden(s.wbuf[:0], hidden)
	}
	s.sent.Add(int64(len(s.wbuf) + 4))
	s.next.SetWriteDeadline(time.Now().Add(s.timeout))
	if werr := executor.WriteFrame(s.nw, s.wbuf); werr != nil {
		return fmt.Errorf("to the next stage: %w", werr)
	}
	return nil
}

// joinStage checks the hello, connects to the neighbouring stages (and,
// under tensor × pipeline, the stage's mesh) and loads the stage's layers
// (its rank's shard of them) and their KV storage.
func (w *Worker) joinStage(h *hello) (*stageRank, error) {
	tp := max(h.TPRanks, 1)
	switch {
	case h.Ranks < 2 || h.Ranks > 256:
		return nil, fmt.Errorf("a pipeline of %d stages", h.Ranks)
	case h.Rank < 0 || h.Rank >= h.Ranks:
		return nil, fmt.Errorf("stage %d of %d", h.Rank, h.Ranks)
	case tp > 256 || h.TPRank < 0 || h.TPRank >= tp:
		return nil, fmt.Errorf("rank %d of a stage of %d", h.TPRank, tp)
	case len(h.Peers) != h.Ranks*tp:
		return nil, fmt.Errorf("%d worker addresses for %d stages of %d ranks", len(h.Peers), h.Ranks, tp)
	case h.KV == nil || h.Model == nil || h.Layers == nil:
		return nil, errors.New("hello without the model's shape, the KV storage or the stage's layers")
	case h.Session == "":
		return nil, errors.New("hello without a session")
	}
	s := &stageRank{rowTime: w.stageRowTime, sent: &w.sent, timeout: timeoutsOf(h).exchange()}
	var err error
	if s.wire.d, err = ParseWireDType(h.Wire); err != nil {
		return nil, err
	}
	mesh, err := w.link(h, s)
	if err != nil {
		return nil, err
	}
	o := w.Options
	o.Stage = model.Stage{Lo: h.Layers[0], Hi: h.Layers[1]}
	o.Reserve = h.KV.bytes
	if tp > 1 {
		s.mesh = NewMesh(h.TPRank, mesh)
		s.mesh.timeout = s.timeout
		s.mesh.SetWire(s.wire.d)
		s.mesh.also = &w.sent
		o.Rank, o.Ranks, o.Group = h.TPRank, tp, s.mesh
	}
	s.logits = h.Rank == h.Ranks-1 && h.TPRank == 0
	if h.Threads > 0 {
		o.Threads = h.Threads
	}
	if h.Context > 0 {
		o.ContextLen = h.Context
	}
	fail := func(err error) (*stageRank, error) {
		s.close()
		return nil, err
	}
	if s.m, err = model.Open(w.Model, o); err != nil {
		return fail(capHint(err))
	}
	if err := h.Model.diff(shapeOf(&s.m.Config)); err != nil {
		return fail(err)
	}
	kc, err := h.KV.config(&s.m.Config, o.Stage)
	if err == nil {
		kc.Ops = s.m.Ops()
		s.kv, err = kvcache.NewFollower(kc)
	}
	if err != nil {
		return fail(fmt.Errorf("KV storage: %w", err))
	}
	return s, nil
}

// link connects this worker to its neighbours: it dials the same rank of
// the next stage and the lower ranks of its own stage, and takes the
// connections of the previous stage's same rank and of its stage's
// higher ranks. It returns the stage's mesh connections by rank (nil at
// this rank; none when the stage is one worker).
func (w *Worker) link(h *hello, s *stageRank) ([]net.Conn, error) {
	tp := max(h.TPRanks, 1)
	me := h.Rank*tp + h.TPRank
	mesh := make([]net.Conn, tp)
	fail := func(err error) ([]net.Conn, error) {
		for _, c := range mesh {
			if c != nil {
				c.Close()
			}
		}
		s.closeLinks()
		return nil, err
	}
	deadline := time.Now().Add(w.joinTimeout())
	ch := w.joinChan(h.Session)
	defer func() {
		w.mu.Lock()
		delete(w.joining, h.Session)
		w.mu.Unlock()
	}()
	dial := func(i int, what string) (net.Conn, error) {
		c, err := net.DialTimeout("tcp", h.Peers[i], time.Until(deadline))
		if err == nil {
			err = writeMsg(bufio.NewWriter(c), hello{Kind: "peer", Session: h.Session, Rank: me, Wire: h.Wire})
			if err != nil {
				c.Close()
			}
		}
		if err != nil {
			return nil, fmt.Errorf("%s at %s: %w", what, h.Peers[i], err)
		}
		return c, nil
	}
	for r := 0; r < h.TPRank; r++ {
		c, err := dial(h.Rank*tp+r, fmt.Sprintf("tensor parallel: rank %d of stage %d", r, h.Rank))
		if err != nil {
			return fail(err)
		}
		mesh[r] = c
	}
	if h.Rank+1 < h.Ranks {
		c, err := dial(me+tp, fmt.Sprintf("pipeline: stage %d", h.Rank+1))
		if err != nil {
			return fail(err)
		}
		s.next, s.nw = c, bufio.NewWriterSize(c, 1<<16)
	}
	need := tp - 1 - h.TPRank
	if h.Rank > 0 {
		need++
	}
	for ; need > 0; need-- {
		var p peerConn
		select {
		case p = <-ch:
		case <-time.After(time.Until(deadline)):
			return fail(fmt.Errorf("pipeline: %d of this worker's neighbours (the previous stage, the stage's higher ranks) did not connect within %v", need, w.joinTimeout()))
		}
		if !sameWire(p.wire, h.Wire) {
			p.c.Close()
			return fail(fmt.Errorf("pipeline: worker %d sends %q activations on the wire, this one was told %q", p.rank, p.wire, h.Wire))
		}
		switch r := p.rank - h.Rank*tp; {
		case h.Rank > 0 && p.rank == me-tp && s.prev == nil:
			s.prev, s.pr = p.c, bufio.NewReaderSize(p.c, 1<<16)
		case r > h.TPRank && r < tp && mesh[r] == nil:
			mesh[r] = p.c
		default:
			p.c.Close()
			return fail(fmt.Errorf("pipeline: an unexpected connection from worker %d (this is stage %d rank %d of %d)", p.rank, h.Rank, h.TPRank, tp))
		}
	}
	if tp == 1 {
		return nil, nil
	}
	return mesh, nil
}
