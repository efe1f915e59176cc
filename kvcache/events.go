package kvcache

import (
	"sync"
	"time"
)

// KV events: the changes to the prefix cache's contents, for a
// prefix-aware router that keeps an index of which replica holds which
// block hashes (vLLM's KV events: BlockStored, BlockRemoved,
// AllBlocksCleared, published in batches with a sequence number).
//
// Decision: the pool records one event per block where it registers a
// full block (register) and where a registered block leaves the prefix
// cache (uncache: evicted for reuse, or rolled back by Truncate); both
// already hold the hash, the parent hash and a private copy of the
// tokens, so recording hashes nothing again and copies nothing. The
// cache's owner (the engine loop) flushes the step's events as one batch
// into a bounded ring. Readers copy batches out of the ring under its
// lock and wait on a channel for more; the writer never waits for a
// reader. A reader that falls further behind than the ring holds skips to
// the oldest batch kept and sees the gap in the sequence numbers, which
// tells it to rebuild its index (vLLM's replay-on-gap) rather than trust
// it.

// EventKind is what happened to a block.
type EventKind uint8

const (
	BlockStored      EventKind = iota + 1 // a full block was registered in the prefix cache
	BlockRemoved                          // a registered block left it (evicted, rolled back)
	AllBlocksCleared                      // the cache holds nothing (a new cache: the process started)
)

func (k EventKind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "unknown"
}

// BlockEvent is one block's change. Tokens is the pool's own copy of the
// block's tokens, never written after registration: readers must not
// write it either.
type BlockEvent struct {
	Kind      EventKind
	Hash      uint64  // BlockStored, BlockRemoved: the block's chain hash
	Parent    uint64  // BlockStored: the hash of the block before it, when HasParent
	HasParent bool    // false for a sequence's first block
	Tokens    []int32 // BlockStored: the block's token ids (BlockSize of them)
}

// EventBatch is the events of one flush (one engine step), in order.
type EventBatch struct {
	Seq    uint64 // 0, 1, 2, ... per EventLog: a jump means lost batches
	Time   time.Time
	Events []BlockEvent
}

// DefaultEventBatches is the ring size serve uses: a router that reads
// within this many steps of the engine loses nothing.
const DefaultEventBatches = 4096

// EventLog collects a cache's block events and keeps the latest batches.
// Attach it with Config.Events; the goroutine that owns the cache calls
// Flush, any goroutine may Read.
type EventLog struct {
	pending   []BlockEvent // owned by the cache's goroutine until Flush
	blockSize int          // set by New before any reader can see the log

	mu      sync.Mutex
	ring    []EventBatch // circular: ring[(head+i)%len] is the i-th oldest of n
	head, n int
	next    uint64        // the sequence number of the next batch
	wake    chan struct{} // closed by the next Flush, made only while someone waits
}

// NewEventLog keeps the last batches batches (at least 1).
func NewEventLog(batches int) *EventLog {
	return &EventLog{ring: make([]EventBatch, max(batches, 1))}
}

// BlockSize is the tokens per block of the cache the log is attached to.
func (l *EventLog) BlockSize() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.blockSize
}

// attach starts the log of a new, empty cache: what a reader knew of an
// earlier cache (before a restart) no longer holds.
func (l *EventLog) attach(blockSize int) {
	l.mu.Lock()
	l.blockSize = blockSize
	l.mu.Unlock()
	l.pending = append(l.pending, BlockEvent{Kind: AllBlocksCleared})
}

func (l *EventLog) stored(h, parent uint64, hasParent bool, tokens []int32) {
	l.pending = append(l.pending, BlockEvent{Kind: BlockStored, Hash: h, Parent: parent, HasParent: hasParent, Tokens: tokens})
}

func (l *EventLog) removed(h uint64) {
	l.pending = append(l.pending, BlockEvent{Kind: BlockRemoved, Hash: h})
}

// Flush publishes the events since the last Flush as one batch stamped
// with the time; with none it does nothing. Call it from the goroutine that owns
// the cache, between steps. It never waits for readers beyond the copy
// one of them may be making, and allocates nothing once the ring is full
// and nobody waits.
func (l *EventLog) Flush() {
	if len(l.pending) == 0 {
		return
	}
	l.mu.Lock()
	i := (l.head + l.n) % len(l.ring)
	if l.n == len(l.ring) {
		l.head = (l.head + 1) % len(l.ring)
	} else {
		l.n++
	}
	// The overwritten batch's slice becomes the next pending one: readers
	// only ever hold copies.
	old := l.ring[i].Events
	l.ring[i] = EventBatch{Seq: l.next, Time: time.Now(), Events: l.pending}
	l.next++
	clear(old)
	l.pending = old[:0]
	if l.wake != nil {
		close(l.wake)
		l.wake = nil
	}
	l.mu.Unlock()
}

// readMax bounds the batches one Read copies, so a reader replaying the
// whole ring holds the lock a Flush may wait for only briefly.
const readMax = 64

// Read appends to dst copies of the kept batches numbered from on (at
// most readMax of them: call again from after the last), and returns
// them. When there are none yet it also returns a channel that is closed
// when the next batch is published. The first batch returned is
// numbered above from when the batches between were overwritten (the
// reader lost them); from beyond the next number (a reader that followed
// an earlier process) reads from the oldest kept.
func (l *EventLog) Read(from uint64, dst []EventBatch) ([]EventBatch, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	oldest := l.next - uint64(l.n)
	if from < oldest || from > l.next {
		from = oldest
	}
	if from == l.next {
		if l.wake == nil {
			l.wake = make(chan struct{})
		}
		return dst, l.wake
	}
	for s := from; s < l.next && s < from+readMax; s++ {
		b := l.ring[(l.head+int(s-oldest))%len(l.ring)]
		b.Events = append([]BlockEvent(nil), b.Events...)
		dst = append(dst, b)
	}
	return dst, nil
}

// Next is the sequence number the next batch will get.
func (l *EventLog) Next() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.next
}
