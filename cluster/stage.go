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
}

func (s *stageRank) shape() *shape { return shapeOf(&s.m.Config) }

func (s *stageRank) close() {
	for _, c := range []net.Conn{s.prev, s.next} {
		if c != nil {
			c.Close()
		}
	}
	if s.kv != nil {
		s.kv.Close()
	}
	s.m.Close()
}

// Execute runs the step on this stage's layers.
func (s *stageRank) Execute(in *executor.StepInput) (executor.StepOutput, error) {
	var hidden []float32
	if s.prev != nil {
		s.prev.SetReadDeadline(time.Now().Add(opTimeout))
		var err error
		if s.rbuf, err = executor.ReadFrame(s.pr, s.rbuf); err == nil {
			err = s.wire.decodeHidden(s.rbuf, &s.in)
		}
		if err != nil {
			err = fmt.Errorf("from the previous stage: %w", err)
			s.send(nil, err)
			return executor.StepOutput{}, err
		}
		hidden = s.in.Logits
	}
	start := time.Now()
	s.b = model.Batch{Tokens: in.Tokens, Pos: in.Pos, Seq: in.Seq, Logits: in.Logits, KV: in.KV}
	out, err := s.m.ForwardStage(&s.b, s.kv, hidden)
	s.b = model.Batch{}
	if s.rowTime > 0 {
		time.Sleep(s.rowTime * time.Duration(len(in.Tokens)))
	}
	busy := time.Since(start)
	if s.next == nil {
		if err != nil {
			return executor.StepOutput{}, err
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
	s.next.SetWriteDeadline(time.Now().Add(opTimeout))
	if werr := executor.WriteFrame(s.nw, s.wbuf); werr != nil {
		return fmt.Errorf("to the next stage: %w", werr)
	}
	return nil
}

// joinStage checks the hello, connects to the neighbouring stages and
// loads the stage's layers and their KV storage.
func (w *Worker) joinStage(h *hello) (*stageRank, error) {
	switch {
	case h.Ranks < 2 || h.Ranks > 256:
		return nil, fmt.Errorf("a pipeline of %d stages", h.Ranks)
	case h.Rank < 0 || h.Rank >= h.Ranks:
		return nil, fmt.Errorf("stage %d of %d", h.Rank, h.Ranks)
	case len(h.Peers) != h.Ranks:
		return nil, fmt.Errorf("%d stage addresses for %d stages", len(h.Peers), h.Ranks)
	case h.KV == nil || h.Model == nil || h.Layers == nil:
		return nil, errors.New("hello without the model's shape, the KV storage or the stage's layers")
	case h.Session == "":
		return nil, errors.New("hello without a session")
	}
	s := &stageRank{rowTime: w.stageRowTime, sent: &w.sent}
	var err error
	if s.wire.d, err = ParseWireDType(h.Wire); err != nil {
		return nil, err
	}
	if err := w.link(h, s); err != nil {
		return nil, err
	}
	o := w.Options
	o.Stage = model.Stage{Lo: h.Layers[0], Hi: h.Layers[1]}
	o.Reserve = h.KV.bytes
	if h.Threads > 0 {
		o.Threads = h.Threads
	}
	if h.Context > 0 {
		o.ContextLen = h.Context
	}
	fail := func(err error) (*stageRank, error) {
		if s.m != nil {
			s.close()
		} else {
			for _, c := range []net.Conn{s.prev, s.next} {
				if c != nil {
					c.Close()
				}
			}
		}
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

// link dials the next stage and takes the previous stage's connection.
func (w *Worker) link(h *hello, s *stageRank) error {
	deadline := time.Now().Add(w.joinTimeout())
	ch := w.joinChan(h.Session)
	defer func() {
		w.mu.Lock()
		delete(w.joining, h.Session)
		w.mu.Unlock()
	}()
	if h.Rank+1 < h.Ranks {
		addr := h.Peers[h.Rank+1]
		c, err := net.DialTimeout("tcp", addr, time.Until(deadline))
		if err != nil {
			return fmt.Errorf("pipeline: stage %d at %s: %w", h.Rank+1, addr, err)
		}
		if err := writeMsg(bufio.NewWriter(c), hello{Kind: "peer", Session: h.Session, Rank: h.Rank, Wire: h.Wire}); err != nil {
			c.Close()
			return fmt.Errorf("pipeline: stage %d at %s: %w", h.Rank+1, addr, err)
		}
		s.next, s.nw = c, bufio.NewWriterSize(c, 1<<16)
	}
	if h.Rank == 0 {
		return nil
	}
	select {
	case p := <-ch:
		if p.rank != h.Rank-1 {
			p.c.Close()
			if s.next != nil {
				s.next.Close()
			}
			return fmt.Errorf("pipeline: a connection from stage %d, want %d", p.rank, h.Rank-1)
		}
		if !sameWire(p.wire, h.Wire) {
			p.c.Close()
			if s.next != nil {
				s.next.Close()
			}
			return fmt.Errorf("pipeline: stage %d sends %q activations on the wire, this stage was told %q", p.rank, p.wire, h.Wire)
		}
		s.prev, s.pr = p.c, bufio.NewReaderSize(p.c, 1<<16)
		return nil
	case <-time.After(time.Until(deadline)):
		if s.next != nil {
			s.next.Close()
		}
		return fmt.Errorf("pipeline: stage %d did not connect within %v", h.Rank-1, w.joinTimeout())
	}
}
