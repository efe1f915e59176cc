package kvcache

import (
	"fmt"
	"math"
	"strings"

	"pagoda/model"
)

// Policies per sequence.
//
// Decision: the cache keeps policy slots per sequence rather than a
// routing Policy that dispatches on the sequence. Every place the cache
// asks a group's policy something about a sequence (Begin, Attend, Commit,
// Lookup, Allocate, Free, Truncate, Fork) asks Policies.of(group, seq): the
// policy the sequence was bound to (Bind), or the group's own. A router
// would have to implement every optional interface (ScoreObserver,
// PageSelector, QueryShifter, Tracker, Sealer, the unexported ones) and
// answer "not me" for sequences whose policy lacks it, which Attend would
// still pay for on every query and head; with slots, Attend type-asserts
// the one policy its sequence runs, and a cache whose sequences all use
// the default does exactly what it did before.
//
// A distinct policy (by its configuration string) is attached to the cache
// once, while sequences use it, and dropped with its state when the last
// one is freed: H2O's masses and SnapKV's masks exist only for the
// sequences that run them. Quest's key bounds are per physical block, not
// per sequence: every per-sequence Quest of a group shares one table
// (sharedQuest), so a client choosing many settings cannot multiply it;
// the table is not counted in the cache's byte budget. A sequence's binding and its
// policy state go with Free (preemption included); the scheduler binds a
// sequence again, before its prefix lookup, each time it is admitted.
//
// Prefix caching per sequence: blocks are registered only below the
// sequence's own Sealed position (what its policy computed exactly), a
// lookup stops at its own policy's hit limit (H2O: none), and blocks a
// position-driven policy (StreamingLLM) computes over less than the full
// history are hashed in a namespace of that policy, so only sequences
// running the same configuration share them; blocks every query computed
// over the full history stay in the common namespace and serve everyone.
// Quest's per-block key bounds are stamped with the block's allocation, so
// a Quest sequence recomputes the bounds of hit blocks a plain sequence
// (or an earlier, dropped Quest instance) filled.

// SeqPolicies is the cache's per-sequence policy router: which policy
// each sequence runs (Bind), the attached policies and their state, and
// what follows from them for the manager (hash namespaces, limits).
type SeqPolicies struct {
	c            *Cache
	bound        map[int32]*seqPolicy  // sequences running a policy of their own
	policies     map[string]*seqPolicy // attached, by configuration
	defaultKey   string                // the routed groups' default policy
	defaultNS    uint64                // its hash namespace past defaultExact (0: none)
	defaultExact int
	questShared  []*questState // per group: the key bounds per-sequence Quests share
}

// seqPolicy is one per-sequence policy attached to the cache.
type seqPolicy struct {
	key    string   // its configuration
	groups []Policy // per group: the bound policy (the group's own where not routed)
	ns     uint64   // hash namespace of the blocks it computes inexactly
	exact  int      // positions below this are computed exactly (math.MaxInt: all)
	lossy  bool
	seqs   int // sequences bound to it
}

// exacter is a policy whose attention narrows with position alone
// (StreamingLLM): positions below exactBelow see everything before them.
type exacter interface{ exactBelow() int }

func (p StreamingPolicy) exactBelow() int {
	if p.Scheme == PosShift {
		return p.Ctx
	}
	return p.Sinks + p.Window
}

// policyKey names p for sharing attached instances: its configuration.
// It is also what a position-driven policy's hash namespace is derived
// from (namespace), so it must be canonical: equal settings give equal
// keys in every process, and every setting that changes what a block
// holds is in it (StreamingPolicy's String names all its fields).
func policyKey(p Policy) string {
	if s, ok := p.(fmt.Stringer); ok {
		return fmt.Sprintf("%T:%s", p, s)
	}
	return fmt.Sprintf("%T:%+v", p, p)
}

// isFull reports whether p is "no policy": FullPolicy.
func isFull(p Policy) bool {
	_, ok := p.(FullPolicy)
	return ok
}

// routed reports whether group gi takes a sequence's own policy: the
// groups that name none in the configuration.
func (ps *SeqPolicies) routed(gi int) bool {
	c := ps.c
	return len(c.cfg.Groups) == 0 || c.cfg.Groups[gi].Policy == nil
}

// resolve is what p means for a routed group: FullPolicy is the cache's
// policy without --kv-policy (the model's sliding window, if any).
func (ps *SeqPolicies) resolve(p Policy) Policy {
	c := ps.c
	if isFull(p) && c.cfg.Window > 0 {
		return WindowPolicy{c.cfg.Window}
	}
	return p
}

// Check reports whether sequences of this cache can run p (Bind
// would accept it): its settings are valid, and a policy that moves
// positions has the model's rotary embedding.
func (ps *SeqPolicies) Check(p Policy) error {
	c := ps.c
	if p == nil {
		return nil
	}
	p = ps.resolve(p)
	if ck, ok := p.(interface{ Check() error }); ok {
		if err := ck.Check(); err != nil {
			return err
		}
	}
	switch p.(type) {
	case FullPolicy, WindowPolicy, StreamingPolicy, *QuestPolicy, *H2OPolicy, *SnapKVPolicy:
	default:
		return fmt.Errorf("kvcache: policy %T cannot be chosen per sequence", p)
	}
	if w, ok := p.(WindowPolicy); ok && w.W != c.cfg.Window {
		return fmt.Errorf("kvcache: a window policy per sequence must be the model's own window (%d), not %d", c.cfg.Window, w.W)
	}
	for gi, g := range c.groups {
		if !ps.routed(gi) {
			continue
		}
		if _, ok := p.(QueryShifter); ok && (c.cfg.Rope == nil || c.cfg.Rope.HeadDim != g.KDim || 2*len(c.cfg.Rope.Freqs) > g.KDim) {
			return fmt.Errorf("kvcache: policy %v moves positions and needs the model's rotary embedding for head dim %d", p, g.KDim)
		}
	}
	return nil
}

// Bind makes seq run policy p in every group that names no policy of its
// own, until Free(seq); nil binds it to the cache's default. FullPolicy
// means no policy (the model's sliding window, if it has one). Bind a
// sequence before its first Lookup or Allocate; a sequence holding blocks
// cannot change its policy.
func (ps *SeqPolicies) Bind(seq int32, p Policy) error {
	c := ps.c
	if p != nil {
		if err := ps.Check(p); err != nil {
			return err
		}
	}
	key := ""
	if p != nil {
		key = policyKey(ps.resolve(p))
	}
	if key == ps.defaultKey {
		key = "" // the default itself: its slot, its state
	}
	old := ps.bound[seq]
	if (old == nil && key == "") || (old != nil && old.key == key) {
		return nil
	}
	if t := c.tables[seq]; t != nil && len(t.blocks) > 0 {
		return fmt.Errorf("kvcache: sequence %d holds blocks: its policy cannot change", seq)
	}
	ps.unbind(seq)
	if c.Link != nil {
		name := ""
		if key != "" {
			name = PolicyName(ps.resolve(p))
		}
		c.Link.notes = append(c.Link.notes, model.KVNote{Op: model.NoteBind, Seq: seq, Policy: name})
	}
	if key == "" {
		return nil
	}
	sp := ps.policies[key]
	if sp == nil {
		var err error
		if sp, err = ps.attach(key, ps.resolve(p)); err != nil {
			return err
		}
	}
	sp.seqs++
	if ps.bound == nil {
		ps.bound = map[int32]*seqPolicy{}
	}
	ps.bound[seq] = sp
	return nil
}

// init notes the default policy's key and namespace (New).
func (ps *SeqPolicies) init() {
	c := ps.c
	for gi, g := range c.groups {
		if !ps.routed(gi) {
			continue
		}
		ps.defaultKey = policyKey(g.Policy)
		ps.defaultExact = math.MaxInt
		if e, ok := g.Policy.(exacter); ok {
			ps.defaultExact = e.exactBelow()
			ps.defaultNS = namespace(ps.defaultKey)
		}
		return
	}
	ps.defaultKey = "-" // nothing is routed: every binding is a no-op policy change
}

func (ps *SeqPolicies) attach(key string, p Policy) (*seqPolicy, error) {
	c := ps.c
	sp := &seqPolicy{key: key, groups: make([]Policy, len(c.groups)), exact: math.MaxInt}
	for gi, g := range c.groups {
		sp.groups[gi] = g.Policy
		if !ps.routed(gi) {
			continue
		}
		b := p
		if c.Link != nil {
			b = c.Link.stand(p)
		} else if q, ok := p.(*QuestPolicy); ok {
			b = ps.sharedQuest(q, gi)
		} else if a, ok := p.(attacher); ok {
			var err error
			if b, err = a.attach(c, gi); err != nil {
				return nil, err
			}
		}
		sp.groups[gi] = b
		if l, ok := b.(Lossy); ok && l.Lossy() {
			sp.lossy = true
		}
	}
	if e, ok := p.(exacter); ok {
		sp.exact = e.exactBelow()
		sp.ns = namespace(key)
	}
	if ps.policies == nil {
		ps.policies = map[string]*seqPolicy{}
	}
	ps.policies[key] = sp
	return sp, nil
}

// sharedQuest binds q to the key bounds that every per-sequence Quest of
// group gi shares, whatever its budget and dense layers: one table over
// all the group's layers, made at the first such binding and kept with
// the cache (about an eighth of an f16 cache's bytes), so requests
// choosing many different Quest settings cost no more memory than one.
// A Quest that is the cache's default keeps its own.
func (ps *SeqPolicies) sharedQuest(q *QuestPolicy, gi int) Policy {
	c := ps.c
	if ps.questShared == nil {
		ps.questShared = make([]*questState, len(c.groups))
	}
	if ps.questShared[gi] == nil {
		all, _ := (&QuestPolicy{}).attach(c, gi)
		ps.questShared[gi] = all.(*QuestPolicy).st
	}
	return &QuestPolicy{Budget: q.Budget, Dense: q.Dense, st: ps.questShared[gi]}
}

// forkBinding binds child to parent's policy, state apart (Forked).
func (ps *SeqPolicies) forkBinding(parent, child int32) {
	if sp := ps.bound[parent]; ps.bound[child] != sp {
		ps.unbind(child)
		if sp != nil {
			sp.seqs++
			ps.bound[child] = sp
		}
	}
}

// unbind drops seq's binding, and the policy with its state when no
// sequence is left on it. The policy state of seq itself is gone already
// (Free tells the policy first).
func (ps *SeqPolicies) unbind(seq int32) {
	sp := ps.bound[seq]
	if sp == nil {
		return
	}
	delete(ps.bound, seq)
	if sp.seqs--; sp.seqs == 0 {
		delete(ps.policies, sp.key)
	}
}

// of is the policy seq runs in group gi.
func (ps *SeqPolicies) of(gi int, seq int32) Policy {
	c := ps.c
	if sp := ps.bound[seq]; sp != nil {
		return sp.groups[gi]
	}
	return c.groups[gi].Policy
}

// lossyOf reports whether seq's policy in group gi drops positions on purpose.
func (ps *SeqPolicies) lossyOf(gi int, seq int32) bool {
	c := ps.c
	if sp := ps.bound[seq]; sp != nil {
		l, ok := sp.groups[gi].(Lossy)
		return ok && l.Lossy()
	}
	return c.lossy[gi]
}

// blockExtra is the hash key of seq's logical block i: extra, or for a
// block its position-driven policy computed over less than the full
// history, extra in that policy's namespace (the cache's default policy
// has one too, fixed at New, so hashes never depend on who is bound).
func (ps *SeqPolicies) blockExtra(seq int32, i int, extra uint64) uint64 {
	c := ps.c
	sp := ps.bound[seq]
	if sp == nil {
		if ps.defaultNS == 0 || (i+1)*c.bs <= ps.defaultExact {
			return extra
		}
		return extra ^ ps.defaultNS
	}
	if sp.ns == 0 || (i+1)*c.bs <= sp.exact {
		return extra
	}
	return extra ^ sp.ns
}

// Bound is the number of sequences bound to a policy of their own and
// the number of such policies attached (for leak checks: both return to 0
// when every bound sequence is freed).
func (ps *SeqPolicies) Bound() (seqs, policies int) { return len(ps.bound), len(ps.policies) }

// PositionLimit is PositionLimit for a sequence running p (nil: the
// default).
func (ps *SeqPolicies) PositionLimit(p Policy) int {
	c := ps.c
	for gi, g := range c.groups {
		q := g.Policy
		if p != nil && ps.routed(gi) {
			q = ps.resolve(p)
		}
		if u, ok := q.(Unbounded); !ok || !u.Unbounded() {
			return 0
		}
	}
	return math.MaxInt32
}

// MaxSeqBlocks is MaxSeqBlocks for a sequence running p (nil: the
// default).
func (ps *SeqPolicies) MaxSeqBlocks(p Policy, chunk int) int {
	c := ps.c
	n := 0
	for gi, g := range c.groups {
		q := g.Policy
		if p != nil && ps.routed(gi) {
			q = ps.resolve(p)
		}
		m := q.MaxBlocks(chunk, c.bs)
		if m <= 0 {
			return 0
		}
		n += m
	}
	return n
}

// PolicyName is the configuration string of p as ParsePolicy reads it.
func PolicyName(p Policy) string {
	switch q := p.(type) {
	case nil, FullPolicy:
		return "full"
	case WindowPolicy:
		return fmt.Sprintf("window:w=%d", q.W)
	case fmt.Stringer:
		return q.String()
	}
	return strings.TrimPrefix(fmt.Sprintf("%T", p), "kvcache.")
}
