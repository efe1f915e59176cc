package engine

import (
	"time"

	"pagoda/executor"
	"pagoda/model"
)

// Steps in flight, as vLLM's virtual engines keep them for pipeline
// parallelism: with one step at a time only one stage of a pipeline
// computes at once (micro-batches overlap stages only within a step). An
// executor that is a Submitter takes step N+1 while step N is still in
// the later stages, so the engine keeps up to V steps in flight over
// disjoint sets of sequences: every sequence belongs to one of V virtual
// engines (the least loaded when its request arrives; forks stay with
// their parent), and a virtual engine's next step is planned only once
// its last one has landed (sampled and updated), since its sequences'
// next tokens come from that step. The scheduler, the KV manager and the
// sampler still run on the engine's goroutine alone; the steps land in the
// order they were submitted.
//
// Why it is exact: every stage runs the steps in submission order, which
// is the order the manager planned them in, so each stage's storage sees
// the same writes in the same order as with one step at a time: a block
// freed (a cancellation, a finished sequence) and reused by the next plan
// is written by the old step before the new one on every stage. What the
// manager learns late — the sampled tokens — belongs to sequences that are
// not planned until then. What would learn it too late is kept off: the
// engine runs one step at a time under speculative decoding (drafts and
// trees are made from the previous step's output), static batching, and
// while a sequence's KV policy keeps state on the workers
// (kvcache.Link.Following: its reports feed the next plan). A sequence
// cancelled while its step is in flight is freed at once; the step's
// output for it is dropped when it lands (sampleStep, Update).

// Submitter is an executor that takes a step before the previous steps'
// outputs are back (cluster.Pipeline, cluster.Supervisor over one): wait
// returns the step's output. The engine calls the waits in the order of
// the submits; the step's input is not touched until its wait returns.
type Submitter interface {
	Submit(in *executor.StepInput) (wait func() (executor.StepOutput, error))
}

// inflight is the engine's side of the steps in flight.
type inflight struct {
	sub   Submitter
	slots []vslot
	queue []int // virtual engines with a step in flight, oldest first
	next  int   // the virtual engine planned first in the next fill
	// drain: a step failed, so the executor is probably down; let the
	// others land before planning more, so checkRestart runs between.
	drain bool
}

// vslot is one virtual engine's step: its buffers, reused, and the step
// in flight.
type vslot struct {
	in   executor.StepInput
	plan model.KVPlan
	p    *plan
	t0   time.Time
	wait func() (executor.StepOutput, error)
}

// newInflight is the steps in flight cfg asks for, or nil (one step at a
// time): fewer than 2, an executor that cannot take them, or a feature
// that needs each step's output before the next is planned.
// The scheduler spreads requests over that many virtual engines.
func newInflight(ex executor.Executor, cfg Config, sch *scheduler) *inflight {
	sub, ok := ex.(Submitter)
	if cfg.InFlight < 2 || !ok || cfg.Spec.Proposer != nil || cfg.Static {
		return nil
	}
	sch.ves = min(cfg.InFlight, 64)
	return &inflight{sub: sub, slots: make([]vslot, sch.ves)}
}

// round is step for steps in flight: plan and submit a step for every
// virtual engine that has none in flight and work to do, then land the
// oldest step. False when nothing was in flight or could be planned.
func (f *inflight) round(e *Engine) bool {
	if len(f.queue) == 0 {
		// Between steps only: checkRestart preempts every running
		// sequence, which must not be in flight.
		checkRestart(e)
		f.drain = false
	}
	if !f.drain {
		f.fill(e)
	}
	if len(f.queue) == 0 {
		return false
	}
	f.land(e)
	return true
}

// fill submits steps, one per virtual engine, in turn.
func (f *inflight) fill(e *Engine) {
	defer func() { e.sch.only = -1 }()
	for range f.slots {
		if len(f.queue) == len(f.slots) {
			return
		}
		solo := e.kv.Link != nil && e.kv.Link.Following()
		if solo && len(f.queue) > 0 {
			return
		}
		v := f.next
		f.next = (v + 1) % len(f.slots)
		if f.slots[v].p != nil {
			continue
		}
		e.sch.only = v
		if solo {
			e.sch.only = -1 // one step at a time: it may take every sequence
		}
		if f.submit(e, v) && solo {
			return
		}
	}
}

// submit plans virtual engine v's step and submits it; false when it
// had nothing to run.
func (f *inflight) submit(e *Engine, v int) bool {
	sl := &f.slots[v]
	t0 := time.Now()
	p := e.sch.Schedule()
	e.account(p)
	if len(p.seqs) == 0 {
		return false
	}
	e.buildBatch(p, &sl.in)
	e.st.Steps++
	e.st.BatchedTokens += uint64(p.tokens)
	err := e.kv.Plan(sl.in.Pos, sl.in.Seq, e.treePar, &sl.plan)
	sl.in.KV = &sl.plan
	if err != nil {
		sl.wait = func() (executor.StepOutput, error) { return executor.StepOutput{}, err }
	} else {
		sl.wait = f.sub.Submit(&sl.in)
	}
	sl.p, sl.t0 = p, t0
	f.queue = append(f.queue, v)
	return true
}

// land waits for the oldest step in flight and applies its output.
func (f *inflight) land(e *Engine) {
	v := f.queue[0]
	f.queue = append(f.queue[:0], f.queue[1:]...)
	sl := &f.slots[v]
	out, err := sl.wait()
	if err != nil {
		f.drain = true
	}
	p := sl.p
	sl.p, sl.wait = nil, nil
	finishStep(e, p, &sl.in, &sl.plan, out, err, sl.t0)
}

// settle lands every step in flight once nothing is left to schedule
// (every sequence in them ended), so the loop never waits or returns
// with steps out. A function, not a method: Engine's method set is full.
func settle(e *Engine) {
	if e.pp == nil || !e.sch.idle() {
		return
	}
	for len(e.pp.queue) > 0 {
		e.pp.land(e)
	}
}
