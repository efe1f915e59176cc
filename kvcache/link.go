package kvcache

import (
	"math"

	"pagoda/model"
)

// Policies with state across the process boundary.
//
// Decision: H2O's accumulated scores, SnapKV's votes and Quest's key
// bounds are made by attention, so they live where the pages are; the
// manager never calls into them. A KV manager without storage (NewManager)
// binds, in their place, a stand-in (remote) that answers what needs no
// state (Visible, MaxBlocks, the hit limit) and relays the rest: the
// manager writes every change a stateful policy must hear of — a commit
// with its block table, a truncation, a fork, a prompt length, a binding,
// a free — and every page copy as notes into the next step's plan
// (model.KVPlan.Notes); the storage's side (Follower) replays them on the
// real policies in the same order before the step runs, so attention sees
// the state it would in one process. What the policies then decide for
// the manager — blocks every head has evicted, the first position computed
// over an evicted history — comes back in the step's output
// (model.KVReport), and the manager frees and stops hashing accordingly.
//
// The price is one step: in one process a block dies at the commit that
// evicts its last position; across the boundary the eviction runs at the
// start of the next step and the manager frees the block when that step
// returns. Attention is unchanged, since the eviction still precedes the
// next query. Sealed positions need no delay: an eviction at the commit of
// position n seals from n, which the commit that registers blocks below n
// would not pass anyway, and a selection (Quest) seals during the step
// whose output reports it, before its commit.

// Link is a KV manager's side of storage on another process: the notes
// it owes the storage and the reports it got back.
type Link struct {
	c       *Cache
	notes   []model.KVNote
	reports map[int32]*linkReport
}

type linkReport struct {
	dead   []Span
	sealed int
}

// remote stands in a manager without storage for a policy whose state
// lives with the storage (see above): Policy's methods are the configured
// policy's, which need no state for Visible and MaxBlocks.
type remote struct {
	Policy
	l     *Link
	table bool // its storage side reads the block table at commits (Quest)
}

func (r remote) Lossy() bool { return true }

// Release implements Policy: what the storage reported dead.
func (r remote) Release(seq int32, next, bs int, dst []Span) []Span {
	rp := r.l.reports[seq]
	if rp == nil {
		return dst
	}
	for _, s := range rp.dead {
		if s.To*bs > next {
			s.To = next / bs
		}
		if s.From < s.To {
			dst = append(dst, s)
		}
	}
	return dst
}

// Sealed implements Sealer: as reported.
func (r remote) Sealed(seq int32) int {
	if rp := r.l.reports[seq]; rp != nil {
		return rp.sealed
	}
	return math.MaxInt
}

func (r remote) hitLimit(n int) int {
	if h, ok := r.Policy.(hitLimiter); ok {
		return h.hitLimit(n)
	}
	return n
}

// stand returns what a manager without storage binds in p's place.
func (l *Link) stand(p Policy) Policy {
	if _, ok := p.(attacher); !ok {
		return p
	}
	_, quest := p.(*QuestPolicy)
	return remote{Policy: p, l: l, table: quest}
}

// follows reports whether the storage's side keeps state for seq: it is
// bound to a policy of its own, or some group's policy is a stand-in.
func (l *Link) follows(seq int32) bool {
	c := l.c
	if c.Policies.bound[seq] != nil {
		return true
	}
	for _, g := range c.groups {
		if _, ok := g.Policy.(remote); ok {
			return true
		}
	}
	return false
}

// Following reports whether the storage's side keeps policy state for
// some sequence (a stand-in policy, or a sequence bound to a policy of
// its own). Its reports then feed the plans after the step that made
// them, so a manager must not plan a step before the previous one's
// output is back: an engine keeps one step in flight while it is true.
func (l *Link) Following() bool {
	if len(l.c.Policies.bound) > 0 {
		return true
	}
	for _, g := range l.c.groups {
		if _, ok := g.Policy.(remote); ok {
			return true
		}
	}
	return false
}

func (l *Link) note(op model.KVOp, seq, n int32) {
	l.notes = append(l.notes, model.KVNote{Op: op, Seq: seq, N: n})
}

// committed notes seq's commit of its first n tokens, with its block
// table when a policy it runs reads it.
func (l *Link) committed(seq int32, n int) {
	if !l.follows(seq) {
		return
	}
	nt := model.KVNote{Op: model.NoteCommit, Seq: seq, N: int32(n)}
	for gi := range l.c.groups {
		if r, ok := l.c.Policies.of(gi, seq).(remote); ok && r.table {
			if t := l.c.tables[seq]; t != nil {
				nt.Table = append([]int32(nil), t.blocks...)
			}
			break
		}
	}
	l.notes = append(l.notes, nt)
}

// truncated notes that seq keeps its first n tokens (0: freed).
func (l *Link) truncated(seq int32, n int) {
	if !l.follows(seq) {
		return
	}
	if n == 0 {
		l.note(model.NoteFree, seq, 0)
		delete(l.reports, seq)
		return
	}
	l.note(model.NoteTruncate, seq, int32(n))
	if rp := l.reports[seq]; rp != nil {
		rp.dead = clipSpans(rp.dead, n/l.c.bs)
		if rp.sealed >= n {
			rp.sealed = math.MaxInt
		}
	}
}

func (l *Link) forked(parent, child int32) {
	if !l.follows(parent) {
		return
	}
	l.note(model.NoteFork, parent, child)
	if rp := l.reports[parent]; rp != nil {
		l.reports[child] = &linkReport{dead: append([]Span(nil), rp.dead...), sealed: rp.sealed}
	}
}

// clipSpans keeps the parts of ascending spans below n.
func clipSpans(s []Span, n int) []Span {
	out := s[:0]
	for _, x := range s {
		x.To = min(x.To, n)
		if x.From < x.To {
			out = append(out, x)
		}
	}
	return out
}

// Take moves the notes owed to the storage into dst (a step's plan).
func (l *Link) Take(dst *model.KVPlan) {
	dst.Notes = append(dst.Notes[:0], l.notes...)
	clear(l.notes)
	l.notes = l.notes[:0]
}

// Pending is the number of notes not yet taken.
func (l *Link) Pending() int { return len(l.notes) }

// Report records what the storage's side reported with a step's output.
// A report for a sequence the manager no longer holds is stale (it was
// freed while the step ran) and is dropped.
func (l *Link) Report(rs []model.KVReport) {
	for _, r := range rs {
		if l.c.tables[r.Seq] == nil && l.c.Policies.bound[r.Seq] == nil {
			continue
		}
		rp := &linkReport{sealed: math.MaxInt}
		if r.Sealed >= 0 {
			rp.sealed = int(r.Sealed)
		}
		for i := 0; i+1 < len(r.Dead); i += 2 {
			rp.dead = append(rp.dead, Span{int(r.Dead[i]), int(r.Dead[i+1])})
		}
		if l.reports == nil {
			l.reports = map[int32]*linkReport{}
		}
		l.reports[r.Seq] = rp
	}
}
