package executor

// Restartable is an Executor whose storage can be replaced by a new,
// empty one: worker processes reconnected after a failure (a worker died,
// stalled or was cut off) hold none of the KV the engine's manager
// planned. Epoch changes each time that happens; an engine calls it
// between steps, never during one, and on a change drops every
// sequence's KV state and its prefix cache before planning the next step.
// The executor must not run a step on the new storage before Epoch has
// reported it.
type Restartable interface {
	Executor
	Epoch() uint64
}
