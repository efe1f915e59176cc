package engine

import "pagoda/executor"

// checkRestart drops the KV state planned against storage the executor
// no longer has: when a Restartable executor's epoch moves (its worker
// processes were reconnected after a failure, with new, empty storage),
// every running sequence is preempted, so it is recomputed from its
// tokens on the new storage and its request carries on, and the prefix
// cache is emptied, so nothing is found in blocks that hold nothing.
// Requests whose step failed when the workers went down have already
// ended with that error. A function, not a method: Engine's method set
// is full.
func checkRestart(e *Engine) {
	r, ok := e.ex.(executor.Restartable)
	if !ok {
		return
	}
	ep := r.Epoch()
	if ep == e.epoch {
		return
	}
	e.epoch = ep
	// From the last, so the sequences wait again in their running order.
	for n := len(e.sch.running); n > 0; n = len(e.sch.running) {
		e.sch.preempt(e.sch.running[n-1])
	}
	e.moves = e.moves[:0]
	e.kv.Pool().DropCached()
	if e.kv.Link != nil {
		e.kv.Link.Reset()
	}
}
