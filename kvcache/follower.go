package kvcache

import (
	"errors"
	"fmt"
	"math"

	"pagoda/model"
)

// Follower is the storage's side of a KV manager on another process, for
// workers: the pages, and the policies that keep state beside them (H2O,
// SnapKV, Quest, and whatever a sequence is bound to), kept in step by
// replaying the notes each plan carries (link.go). It allocates nothing:
// block tables arrive with the plans and the commits.
type Follower struct {
	// Cache is the storage and the policies bound to it; its tables
	// hold only what commits carried (Quest reads them).
	*Cache
	next    map[int32]int // tokens each followed sequence has committed
	seen    map[int32]int // positions each sequence's steps have computed
	touched []int32       // sequences the step's notes changed
	reports []model.KVReport
	told    map[int32]bool // sequences Reports has reported this step
}

// NewFollower allocates storage for cfg with its policies bound to it.
func NewFollower(cfg Config) (*Follower, error) {
	c, err := New(cfg)
	if err != nil {
		return nil, err
	}
	return &Follower{Cache: c, next: map[int32]int{}, seen: map[int32]int{}, told: map[int32]bool{}}, nil
}

// Begin implements model.KVCache: the plan's notes, then its step.
func (f *Follower) Begin(b *model.Batch) error {
	if b.KV == nil {
		return errors.New("kvcache: a step without a KV plan reached storage with no KV manager")
	}
	if err := f.Apply(b.KV.Notes); err != nil {
		return err
	}
	if err := f.Cache.Begin(b); err != nil {
		return err
	}
	// A sequence's rows are consecutive and ascending: its last row is
	// the furthest it computed.
	for i, seq := range b.Seq {
		if i+1 == len(b.Seq) || b.Seq[i+1] != seq {
			f.seen[seq] = max(f.seen[seq], int(b.Pos[i])+1)
		}
	}
	return nil
}

// Apply replays a manager's notes, in order. A note that names pages
// outside the storage or a policy it cannot run is an error; the notes
// before it have been applied.
func (f *Follower) Apply(notes []model.KVNote) error {
	c := f.Cache
	for _, n := range notes {
		if n.N < 0 {
			return fmt.Errorf("kvcache: note %d for sequence %d with a negative count %d", n.Op, n.Seq, n.N)
		}
		switch n.Op {
		case model.NoteCopy:
			if min(n.Seq, n.N) < 0 || int(max(n.Seq, n.N)) >= c.npages {
				return fmt.Errorf("kvcache: note copies page %d to %d of %d", n.N, n.Seq, c.npages)
			}
			c.copyBlock(n.Seq, n.N)
		case model.NoteBind:
			var p Policy
			if n.Policy != "" {
				var err error
				if p, err = ParsePolicy(n.Policy); err != nil {
					return err
				}
			}
			delete(c.tables, n.Seq) // a sequence is bound before it holds blocks
			if err := c.Policies.Bind(n.Seq, p); err != nil {
				return err
			}
		case model.NotePrompt:
			c.NotePrompt(n.Seq, int(n.N))
		case model.NoteCommit:
			if err := f.commit(n); err != nil {
				return err
			}
		case model.NoteTruncate:
			c.track(n.Seq, func(tr Tracker) { tr.Truncated(n.Seq, int(n.N)) })
			f.next[n.Seq] = min(f.next[n.Seq], int(n.N))
			f.seen[n.Seq] = min(f.seen[n.Seq], int(n.N))
			f.touched = append(f.touched, n.Seq)
		case model.NoteFork:
			f.fork(n.Seq, n.N)
		case model.NoteFree:
			c.track(n.Seq, func(tr Tracker) { tr.Truncated(n.Seq, 0) })
			c.Policies.unbind(n.Seq)
			delete(c.tables, n.Seq)
			delete(f.next, n.Seq)
			delete(f.seen, n.Seq)
		default:
			return fmt.Errorf("kvcache: unknown note %d", n.Op)
		}
	}
	return nil
}

// commit runs the policies' commit step (H2O's eviction, SnapKV's
// compression, Quest's bounds) over the table the note carries.
func (f *Follower) commit(n model.KVNote) error {
	c := f.Cache
	if int(n.N) > f.seen[n.Seq] {
		return fmt.Errorf("kvcache: note commits %d tokens of sequence %d, which has computed %d", n.N, n.Seq, f.seen[n.Seq])
	}
	for _, pg := range n.Table {
		if pg < released || int(pg) >= c.npages {
			return fmt.Errorf("kvcache: note gives sequence %d page %d of %d", n.Seq, pg, c.npages)
		}
	}
	if n.Table != nil {
		t := c.tables[n.Seq]
		if t == nil {
			t = &seqTable{}
			c.tables[n.Seq] = t
		}
		t.blocks = append(t.blocks[:0], n.Table...)
	}
	for gi := range c.groups {
		if tr, ok := c.Policies.of(gi, n.Seq).(Tracker); ok {
			tr.Committed(n.Seq, int(n.N))
		}
	}
	f.next[n.Seq] = int(n.N)
	f.touched = append(f.touched, n.Seq)
	return nil
}

func (f *Follower) fork(parent, child int32) {
	c := f.Cache
	c.Policies.forkBinding(parent, child)
	c.track(parent, func(tr Tracker) { tr.Forked(parent, child) })
	f.next[child] = f.next[parent]
	f.seen[child] = f.seen[parent]
	f.touched = append(f.touched, child)
}

// Reports is what the policies decided for the sequences the last step's
// notes changed or that it ran under a policy that seals (valid until the
// next Begin): the blocks every head has evicted below the committed
// length, and the first position computed over an evicted history.
func (f *Follower) Reports() []model.KVReport {
	c := f.Cache
	f.reports = f.reports[:0]
	clear(f.told)
	add := func(seq int32) {
		if f.told[seq] {
			return
		}
		f.told[seq] = true
		sealed, stateful := math.MaxInt, false
		for gi := range c.groups {
			p := c.Policies.of(gi, seq)
			if _, ok := p.(Tracker); ok {
				stateful = true
			}
			if s, ok := p.(Sealer); ok {
				sealed = min(sealed, s.Sealed(seq))
			}
		}
		if !stateful {
			return
		}
		r := model.KVReport{Seq: seq, Sealed: -1}
		if sealed != math.MaxInt {
			r.Sealed = int32(sealed)
		}
		for _, s := range c.dead(seq, f.next[seq]) {
			r.Dead = append(r.Dead, int32(s.From), int32(s.To))
		}
		f.reports = append(f.reports, r)
	}
	for _, seq := range f.touched {
		if _, ok := f.next[seq]; ok {
			add(seq)
		}
	}
	for _, s := range c.step.seqs {
		add(s.id)
	}
	f.touched = f.touched[:0]
	return f.reports
}
