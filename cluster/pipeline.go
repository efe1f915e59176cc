package cluster

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"pagoda/executor"
	"pagoda/kvcache"
	"pagoda/model"
)

// Pipeline is the coordinator's side of a pipeline of stage workers: an
// Executor that cuts each step by rows into micro-batches and sends every
// micro-batch to every stage at once, without waiting for the previous
// one's output. Each stage runs the micro-batches in order as their hidden
// states arrive from the stage before, so while stage 1 runs micro-batch 0
// stage 0 already runs micro-batch 1 (GPipe's schedule, forward only). The
// last stage's logits, concatenated in micro-batch order, are the step's.
//
// Under tensor × pipeline parallelism (PipelineOptions.Tensor) every stage
// is a tensor-parallel group: the remotes are the workers stage-major, a
// micro-batch goes to every worker of every stage, and the last stage's
// rank 0 answers with the logits.
type Pipeline struct {
	links
	remotes []*executor.Remote
	tensor  int           // ranks per stage
	wait    time.Duration // for each answer (Timeouts.answer)
	micro   int
	minRows int
	stats   PipelineStats // guarded by links.mu
	// The steps in flight (guarded by links.mu): how many, since when
	// at least one, and the last one's done channels per worker.
	flying             int
	since              time.Time
	lastSent, lastRead []chan struct{}
}

// PipelineOptions configure ConnectPipeline.
type PipelineOptions struct {
	// Model is the coordinator's view of the model: each stage's must
	// have the same shape.
	Model *model.Config
	// KV is the manager's configuration; every stage builds the same
	// blocks for its own layers.
	KV kvcache.Config
	// Threads per worker (0: the worker's own default); Context
	// overrides the model's context length on the workers (0: the
	// model's).
	Threads, Context int
	// MicroBatches is how many pieces a step is cut into (at most its
	// rows); 0 or 1 sends each step whole, so only one stage computes at
	// a time.
	MicroBatches int
	// MinRows keeps every micro-batch at least this many rows (0 or 1:
	// any): a step of fewer rows is cut into fewer micro-batches, or none.
	// On a CPU a matrix product of one row costs nearly what one of four
	// does, so cutting a small decode step buys overlap with repeated
	// weight reads.
	MinRows int
	// Timeout bounds connecting and the workers' loading (0: 10 minutes).
	Timeout time.Duration
	// Wire is the form of the hidden states handed from stage to stage
	// (and of the all-reduces within a tensor-parallel stage).
	Wire WireDType
	// Tensor makes every stage a tensor-parallel group of this many
	// ranks (0 or 1: one worker per stage); the addresses are then
	// stage-major, stage s's rank r at s·Tensor + r, and Model is rank
	// 0's shard (OpenGridShape).
	Tensor int
	// Exchange bounds each exchange between workers (a hand-off, a mesh
	// message; 0: two minutes); the coordinator waits a little longer for
	// each answer.
	Exchange time.Duration
}

// PipelineStats is what the stages did since the pipeline connected.
type PipelineStats struct {
	Steps, MicroBatches int
	// MaxInFlight is the most steps that were in flight at once (1:
	// every step ran alone).
	MaxInFlight int
	// Wall is the time during which at least one step was in flight
	// (with one step at a time, the time Execute took); Busy, per
	// stage (per worker, stage-major, under tensor × pipeline), the time
	// it computed (as it measured it).
	Wall time.Duration
	Busy []time.Duration
}

// Bubble is the fraction of the stages' time spent idle while steps ran:
// 1 − Σ busy / (stages × wall).
func (s PipelineStats) Bubble() float64 {
	if s.Wall <= 0 || len(s.Busy) == 0 {
		return 0
	}
	var busy time.Duration
	for _, b := range s.Busy {
		busy += b
	}
	return 1 - float64(busy)/(float64(len(s.Busy))*float64(s.Wall))
}

// StageLayers cuts layers into stages contiguous ranges as equal as they
// can be, the earlier stages taking the remainder.
func StageLayers(layers, stages int) ([]model.Stage, error) {
	if stages < 2 || stages > layers {
		return nil, fmt.Errorf("pipeline parallel: %d stages for a model of %d layers (need 2 to %d)", stages, layers, layers)
	}
	out := make([]model.Stage, stages)
	lo := 0
	for s := range out {
		n := layers / stages
		if s < layers%stages {
			n++
		}
		out[s] = model.Stage{Lo: lo, Hi: lo + n}
		lo += n
	}
	return out, nil
}

// ConnectPipeline makes the workers at addrs stages 0…n-1 of a new
// pipeline, the layers cut by StageLayers (with o.Tensor > 1, n stages of
// o.Tensor ranks each, stage-major). It returns when every worker has
// loaded its layers and linked to its neighbours, or with the first
// worker's error.
func ConnectPipeline(addrs []string, o PipelineOptions) (*Pipeline, error) {
	if o.Model == nil {
		return nil, errors.New("pipeline parallel: no model shape")
	}
	tp := max(o.Tensor, 1)
	if tp > 256 || len(addrs)%tp != 0 {
		return nil, fmt.Errorf("tensor × pipeline parallel: %d workers are not stages of %d ranks", len(addrs), tp)
	}
	n := len(addrs) / tp
	stages, err := StageLayers(o.Model.NLayer, n)
	if err != nil {
		return nil, err
	}
	what := "pipeline parallel"
	if tp > 1 {
		what = "tensor × pipeline parallel"
	}
	// Layer groups split by layers, not by the heads a rank holds.
	spec, err := specOf(o.KV, what, tp == 1)
	if err != nil {
		return nil, err
	}
	session := newSession()
	hellos := make([]hello, len(addrs))
	for s, st := range stages {
		for r := range tp {
			h := hello{Kind: "stage", Session: session, Rank: s, Ranks: n, Peers: addrs, Threads: o.Threads,
				Context: o.Context, Model: shapeOf(o.Model), KV: spec, Layers: &[2]int{st.Lo, st.Hi}, Wire: o.Wire.String(),
				Logits: s == n-1 && r == 0, ExchangeMS: o.Exchange.Milliseconds()}
			if tp > 1 {
				h.TPRank, h.TPRanks = r, tp
			}
			hellos[s*tp+r] = h
		}
	}
	p := &Pipeline{links: links{closed: "pipeline parallel: the pipeline is closed"}, tensor: tp, wait: Timeouts{Exchange: o.Exchange}.answer(),
		micro: max(o.MicroBatches, 1), minRows: max(o.MinRows, 1)}
	conns, err := dialControl(addrs, hellos, o.Timeout, func(i int) string { return "pipeline parallel: " + p.name(i) })
	if err != nil {
		return nil, err
	}
	p.conns = conns
	for _, c := range conns {
		p.remotes = append(p.remotes, executor.NewRemote(c, c))
	}
	p.stats.Busy = make([]time.Duration, len(conns))
	return p, nil
}

// name is worker i's place in the pipeline, for errors.
func (p *Pipeline) name(i int) string {
	if p.tensor <= 1 {
		return fmt.Sprintf("stage %d", i)
	}
	return fmt.Sprintf("stage %d rank %d", i/p.tensor, i%p.tensor)
}

// Execute runs the step through the stages as micro-batches and returns
// the last stage's logits in row order. A failure breaks the pipeline
// for good (the stages' KV storage is in an unknown state): later steps
// fail with the first error.
func (p *Pipeline) Execute(in *executor.StepInput) (executor.StepOutput, error) {
	return p.Submit(in)()
}

// Submit sends the step to the stages and returns without waiting for
// its output; wait returns it. Every stage runs the steps in the order
// they were submitted, so step N+1 enters stage 0 while step N is still
// in the later stages (the engine's steps in flight, engine.Submitter),
// and a step finds in each stage's KV storage whatever the steps
// submitted before it wrote there. The waits must be called in the
// order of the submits (each reads the connections' next answers), from
// one goroutine, as must Submit; in is read until wait returns. A
// failure breaks the pipeline as Execute's does: every later step fails.
func (p *Pipeline) Submit(in *executor.StepInput) (wait func() (executor.StepOutput, error)) {
	if err := p.err(); err != nil {
		return failed(err)
	}
	mbs, err := microBatches(in, p.micro, p.minRows)
	if err != nil {
		return failed(err)
	}
	f := p.launch(mbs)
	return func() (executor.StepOutput, error) {
		<-f.done
		if f.err != nil {
			p.fail(f.err)
			// A step after the one that broke the pipeline fails with
			// that step's cause, not with the closed connections.
			return executor.StepOutput{}, p.err()
		}
		return p.collect(in, f), nil
	}
}

func failed(err error) func() (executor.StepOutput, error) {
	return func() (executor.StepOutput, error) { return executor.StepOutput{}, err }
}

// collect is the step's output: the last stage's logits in micro-batch
// order (which is row order) and every stage's KV reports.
func (p *Pipeline) collect(in *executor.StepInput, f *flight) executor.StepOutput {
	outs := f.outs
	last := len(p.remotes) - p.tensor // the last stage's rank 0
	var res executor.StepOutput
	for j := range f.mbs {
		res.Logits = append(res.Logits, outs[last][j].Logits...)
		if in.TopK > 0 {
			res.TopIDs = append(res.TopIDs, outs[last][j].TopIDs...)
		}
	}
	if in.KV != nil { // each stage's policies saw its own layers
		parts := make([][]model.KVReport, len(outs))
		for s := range outs {
			for _, o := range outs[s] {
				parts[s] = append(parts[s], o.KV...)
			}
		}
		res.KV = executor.MergeReports(parts)
	}
	return res
}

// microBatches cuts in into at most k pieces of consecutive rows, as
// equal as they can be, each of at least minRows rows where the step has
// as many.
func microBatches(in *executor.StepInput, k, minRows int) ([]*executor.StepInput, error) {
	T := len(in.Tokens)
	k = min(k, T/max(minRows, 1))
	if k <= 1 {
		return []*executor.StepInput{in}, nil
	}
	out := make([]*executor.StepInput, k)
	for j := range out {
		var err error
		if out[j], err = in.Slice(j*T/k, (j+1)*T/k); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// flight is one step on its way through the stages.
type flight struct {
	mbs  []*executor.StepInput
	outs [][]executor.StepOutput // by worker, by micro-batch
	errs []error                 // each worker's own (first) error
	// sent and read close when this step's writes to, and reads from,
	// each worker are done: the next step's wait for them, so each
	// connection carries the steps in order.
	sent, read []chan struct{}
	once       sync.Once
	cause      error // the failure that closed the connections
	err        error // the step's, once done
	done       chan struct{}
}

// launch sends every micro-batch to every stage and reads every stage's
// outputs, each connection's writes and reads on their own goroutines so
// no stage waits on the coordinator, after the steps launched before. A
// stage's error arrives as its output for that micro-batch (every stage
// still answers every one); a broken or silent connection closes them
// all, so nothing waits forever.
func (p *Pipeline) launch(mbs []*executor.StepInput) *flight {
	n := len(p.remotes)
	f := &flight{mbs: mbs, outs: make([][]executor.StepOutput, n), errs: make([]error, n),
		sent: make([]chan struct{}, n), read: make([]chan struct{}, n), done: make(chan struct{})}
	for s := range n {
		f.sent[s], f.read[s] = make(chan struct{}), make(chan struct{})
		f.outs[s] = make([]executor.StepOutput, len(mbs))
	}
	p.mu.Lock()
	prevSent, prevRead := p.lastSent, p.lastRead
	p.lastSent, p.lastRead = f.sent, f.read
	if p.flying == 0 {
		p.since = time.Now()
	}
	p.flying++
	p.stats.MaxInFlight = max(p.stats.MaxInFlight, p.flying)
	p.mu.Unlock()
	var wg sync.WaitGroup
	for s := range n {
		wg.Go(func() {
			defer close(f.sent[s])
			if prevSent != nil {
				<-prevSent[s]
			}
			p.send(f, s)
		})
		wg.Go(func() {
			defer close(f.read[s])
			if prevRead != nil {
				<-prevRead[s]
			}
			p.receive(f, s)
		})
	}
	go func() {
		wg.Wait()
		f.err = p.verdict(f)
		p.landed(f)
		close(f.done)
	}()
	return f
}

// cut closes every connection because worker s's failed (once per step).
func (p *Pipeline) cut(f *flight, s int, err error) {
	f.once.Do(func() {
		f.cause = &WorkerError{Worker: s, err: fmt.Errorf("pipeline parallel: %s: %w", p.name(s), err)}
		p.closeConns()
	})
}

func (p *Pipeline) send(f *flight, s int) {
	for _, mb := range f.mbs {
		if err := p.remotes[s].Send(mb); err != nil {
			p.cut(f, s, err)
			return
		}
	}
}

func (p *Pipeline) receive(f *flight, s int) {
	for j := range f.mbs {
		p.conns[s].SetReadDeadline(time.Now().Add(p.wait))
		out, err := p.remotes[s].Receive()
		err = stalled(err, p.wait)
		var re *executor.RemoteError
		switch {
		case errors.As(err, &re):
			if f.errs[s] == nil {
				f.errs[s] = err
			}
		case err != nil:
			f.errs[s] = err
			p.cut(f, s, err)
			return
		}
		f.outs[s][j] = out
	}
}

// verdict is the step's error: a connection that failed (a stage died,
// hung or hung up) is the cause of whatever the others report; otherwise
// the lowest stage's own error is (the later stages pass it on).
func (p *Pipeline) verdict(f *flight) error {
	if f.cause != nil {
		return f.cause
	}
	for s, err := range f.errs {
		if err != nil {
			return &WorkerError{Worker: s, err: fmt.Errorf("pipeline parallel: %s: %w", p.name(s), err)}
		}
	}
	return nil
}

// landed counts a finished step in the stats. Wall grows only while some
// step is in flight, so steps that overlap are not counted twice.
func (p *Pipeline) landed(f *flight) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.flying--; p.flying == 0 {
		p.stats.Wall += time.Since(p.since)
	}
	if f.err != nil {
		return
	}
	p.stats.Steps++
	p.stats.MicroBatches += len(f.mbs)
	for s := range f.outs {
		for _, o := range f.outs[s] {
			p.stats.Busy[s] += o.Busy
		}
	}
}

// Stats is what the stages did since the pipeline connected.
func (p *Pipeline) Stats() PipelineStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.Busy = append([]time.Duration(nil), s.Busy...)
	return s
}

// OpenStageShape opens the coordinator's view of a model served by a
// pipeline: its first layer only (with the embedding), for the
// configuration, tokenizer and metadata the scheduler and server need. It
// never runs the forward pass (Forward refuses a stage).
func OpenStageShape(path string, o model.Options) (*model.Model, error) {
	return OpenGridShape(path, 1, o)
}

// OpenGridShape is OpenStageShape for tensor × pipeline parallelism with
// tensor ranks per stage: rank 0's shard of the first layer, whose shapes
// (heads per rank) are what every worker's must match. Its collective
// refuses to compute.
func OpenGridShape(path string, tensor int, o model.Options) (*model.Model, error) {
	o.Stage = model.Stage{Lo: 0, Hi: 1}
	if tensor > 1 {
		o.Rank, o.Ranks, o.Group = 0, tensor, noExchange{}
	}
	return model.Open(path, o)
}
