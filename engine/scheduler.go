package engine

import (
	"fmt"
	"slices"

	"pagoda/kvcache"
	"pagoda/spec"
)

// kvManager is what the scheduler needs of the KV cache: block accounting
// and the prefix cache, never the storage. *kvcache.Cache satisfies it.
type kvManager interface {
	BlockSize() int
	// Bind and NotePrompt set up a sequence's KV policy (Request.KVPolicy)
	// before each admission: Free (preemption too) forgets them.
	Bind(seq int32, p kvcache.Policy) error
	NotePrompt(seq int32, n int)
	LookupSeq(seq int32, tokens []int32, extra uint64) []int32
	RecordPrefixQuery(queried, hit int)
	CanAllocate(seq int32, hit []int32, from, upto int) bool
	Allocate(seq int32, hit []int32, from, upto int) bool
	Commit(seq int32, tokens []int32, computed int, extra uint64)
	Truncate(seq int32, n int)
	Fork(parent, child int32) error
	Free(seq int32)
}

// managerKV is the KV cache as the scheduler's manager: binding a
// sequence's policy is its policy router's.
type managerKV struct{ *kvcache.Cache }

func (m managerKV) Bind(seq int32, p kvcache.Policy) error { return m.Policies.Bind(seq, p) }

// sequence is one completion as the scheduler sees it: numComputed chases
// len(tokens) (plus len(draft) while drafting).
type sequence struct {
	req         *request
	index       int // completion index within req
	id          int32
	tokens      []int32 // prompt then output
	numComputed int
	// draft holds proposed tokens to verify after tokens in the next step.
	// A proposer fills it before Schedule; the plan slices it, so it must
	// not be rewritten before Update, which clears it.
	draft []int32
	// parent makes draft a tree (spec.Req.Parent): node i follows node
	// parent[i], or the last token when -1; nil for a chain.
	parent   []int32
	finished bool
	spec     *seqSpec // speculation state, once it has speculated
	// ve is the virtual engine the sequence belongs to (inflight.go):
	// the steps of one are planned only while none of its steps is in
	// flight, so its sequences are never in two steps at once.
	ve int
}

// scheduled is one sequence's share of a step: the tokens at positions
// [start, start+n), its own tokens first, then draft.
type scheduled struct {
	seq   *sequence
	start int
	n     int
	draft []int32 // the last len(draft) of the n tokens
	// parent is the tree of the drafts (a prefix of the proposed tree is
	// one), nil for a chain.
	parent []int32
	// rows is how many logits rows the step yields for the sequence: 0 for
	// a prompt chunk that does not finish the prompt, 1 for the last one
	// or a plain decode, 1+len(draft) when verifying drafts.
	rows int
	// promptRows are logits rows just before rows that only score prompt
	// tokens (Request.PromptLogprobs): position p's row gives token p+1.
	promptRows int
	// fork: the prompt of a request with N > 1 finishes here; Update forks
	// the other completions off its blocks and the caller samples each.
	fork bool
}

// token is the i-th token the step computes for the sequence.
func (w *scheduled) token(i int) int32 {
	p := w.start + i
	if t := w.seq.tokens; p < len(t) {
		return t[p]
	}
	return w.draft[p-len(w.seq.tokens)]
}

// plan is one step's work.
type plan struct {
	seqs      []scheduled
	preempted []*sequence // by recompute, this step
	admitted  []*request  // scheduled for the first time; req.cached is set
	tokens    int
	rows      int
}

// outcome is the caller's verdict on one planned sequence with logits.
// Choosing accepted (rejection sampling) is the caller's job.
type outcome struct {
	accepted int // draft tokens kept: the leading ones of a chain, path's of a tree
	// path holds, for a tree, the kept nodes from the root down.
	path []int32
	next int32 // the token after them: a correction, a bonus or a plain sample
	done bool  // the completion ends with next; its blocks are freed
	// forks are the first tokens of completions 1..N-1 when the entry
	// forks (scheduled.fork), sampled from the same logits row.
	forks []forkToken
}

type forkToken struct {
	next int32
	done bool
}

// scheduler decides each step's work and applies its results. It owns the
// waiting and running queues and every block-table change; it knows
// nothing of models, samplers or streams, so it is tested alone.
type scheduler struct {
	cfg              Config // MaxNumBatchedTokens, MaxNumSeqs, LongPrefillThreshold, Static
	kv               kvManager
	waiting, running []*sequence
	nextID           int32
	// ves is the number of virtual engines requests are spread over (0 or
	// 1: one); only is the one Schedule plans for (-1: every one).
	ves, only int
}

func newScheduler(cfg Config, kv kvManager) *scheduler {
	return &scheduler{cfg: cfg, kv: kv, only: -1}
}

func (sc *scheduler) idle() bool { return len(sc.running) == 0 && len(sc.waiting) == 0 }

// add queues the first completion of r.
func (sc *scheduler) add(r *request) *sequence {
	s := sc.newSequence(r, 0, r.r.Prompt, 0)
	s.ve = sc.lightest()
	r.seqs = []*sequence{s}
	sc.waiting = append(sc.waiting, s)
	return s
}

func (sc *scheduler) newSequence(r *request, index int, tokens []int32, computed int) *sequence {
	s := &sequence{
		req: r, index: index, id: sc.nextID,
		tokens:      append(make([]int32, 0, len(tokens)+16), tokens...),
		numComputed: computed,
	}
	sc.nextID++
	return s
}

// Schedule picks this step's work within the token budget and the
// sequence cap, allocating KV blocks. Decodes go first so a long prefill
// (chunked to what the budget leaves) never stalls them; then running
// prefills; then waiting requests in arrival order, unless a preemption
// happened this step. When blocks run out, the newest running sequence is
// preempted by recompute: its blocks are freed and it goes back to the
// front of the waiting queue.
func (sc *scheduler) Schedule() *plan {
	p := &plan{}
	budget := sc.cfg.MaxNumBatchedTokens
	picked := map[*sequence]bool{}
	runningAtStart := len(sc.running)
	budget = sc.scheduleRunning(p, budget, picked)
	if len(p.preempted) > 0 || (sc.cfg.Static && runningAtStart > 0) {
		return p
	}
	sc.admitWaiting(p, budget)
	return p
}

func (sc *scheduler) scheduleRunning(p *plan, budget int, picked map[*sequence]bool) int {
	order := make([]*sequence, 0, len(sc.running))
	for _, s := range sc.running {
		if len(s.tokens)-s.numComputed == 1 && sc.mine(s) {
			order = append(order, s)
		}
	}
	for _, s := range sc.running {
		if len(s.tokens)-s.numComputed > 1 && sc.mine(s) {
			order = append(order, s)
		}
	}
	for _, s := range order {
		if budget == 0 {
			break
		}
		if s.finished || !sc.isRunning(s) {
			continue // preempted as a victim earlier in this loop
		}
		remaining := len(s.tokens) - s.numComputed
		if remaining == 1 {
			remaining += len(s.draft) // drafts ride only on a decode
		}
		n := sc.chunk(remaining, budget)
		if n <= 0 {
			continue // nothing to compute; cannot happen while the invariant holds
		}
		for !sc.kv.CanAllocate(s.id, nil, s.numComputed, s.numComputed+n) {
			v := sc.victim(picked)
			sc.preempt(v)
			p.preempted = append(p.preempted, v)
			if v == s {
				break
			}
		}
		if !sc.isRunning(s) {
			continue
		}
		sc.kv.Allocate(s.id, nil, s.numComputed, s.numComputed+n)
		p.add(s, n)
		picked[s] = true
		budget -= n
	}
	return budget
}

func (sc *scheduler) admitWaiting(p *plan, budget int) {
	for i := 0; i < len(sc.waiting) && budget > 0; {
		s := sc.waiting[i]
		if !sc.mine(s) {
			i++
			continue
		}
		seats := 1
		if !s.req.forked {
			seats = s.req.r.N
		}
		if len(sc.running)+seats > sc.cfg.MaxNumSeqs {
			break
		}
		// A waiting sequence holds no blocks (new, or preempted): bind it
		// to its request's policy before the lookup, which obeys it.
		if err := sc.kv.Bind(s.id, s.req.kvPolicy); err != nil {
			panic(fmt.Sprintf("engine: sequence %d: %v", s.id, err)) // Submit checked the policy
		}
		sc.kv.NotePrompt(s.id, len(s.req.r.Prompt))
		var hit []int32
		if s.numComputed == 0 && !s.req.r.PromptLogprobs {
			hit = sc.kv.LookupSeq(s.id, s.tokens, s.req.extra)
		}
		from := len(hit) * sc.kv.BlockSize()
		n := sc.chunk(len(s.tokens)-from, budget)
		if !sc.kv.Allocate(s.id, hit, from, from+n) {
			break
		}
		s.numComputed = from
		if !s.req.admitted {
			s.req.admitted = true
			s.req.cached = from
			sc.kv.RecordPrefixQuery(len(s.tokens), from)
			p.admitted = append(p.admitted, s.req)
		}
		sc.waiting = append(sc.waiting[:i], sc.waiting[i+1:]...)
		sc.running = append(sc.running, s)
		p.add(s, n)
		budget -= n
	}
}

// draftCand is a decoding sequence that may carry drafts this step.
type draftCand struct {
	seq   *sequence
	max   int     // most drafts it may carry
	alpha float64 // its estimated per-token acceptance rate
	gamma int     // drafts it carries: draftSizes decides
}

// draftSizes decides, before Schedule, how many drafts each candidate
// carries. Drafts count in the token budget like any token: together
// they never take the room the step's decodes need, so speculation can
// delay a prefill chunk but never a decode. Unless fixed, the cost model
// decides whether each extra draft pays: from the step's expected size
// (every decode plus the prefill the budget leaves room for), the fitted
// cost of a token and the sequence's acceptance rate; a large or
// prefill-heavy step is compute-bound, and its drafts dwindle to none.
func (sc *scheduler) draftSizes(cands []draftCand, cost *spec.Cost, fixed bool) {
	budget := sc.cfg.MaxNumBatchedTokens
	decodes, prefill := 0, 0
	for _, s := range sc.running {
		if rem := len(s.tokens) - s.numComputed; rem == 1 {
			decodes++
		} else {
			prefill += sc.chunk(rem, budget)
		}
	}
	if !sc.cfg.Static {
		for i, s := range sc.waiting {
			if len(sc.running)+i >= sc.cfg.MaxNumSeqs {
				break
			}
			prefill += sc.chunk(len(s.tokens)-s.numComputed, budget)
		}
	}
	tokens := min(budget, decodes+prefill)
	left := budget - decodes
	for i := range cands {
		c := &cands[i]
		g := c.max
		if !fixed {
			g = cost.Gamma(c.alpha, tokens, decodes, c.max)
		}
		c.gamma = max(0, min(g, left))
		left -= c.gamma
	}
}

// add plans n tokens of s from its numComputed on.
func (p *plan) add(s *sequence, n int) {
	w := scheduled{seq: s, start: s.numComputed, n: n}
	if extra := w.start + n - len(s.tokens); extra > 0 {
		w.draft = s.draft[:extra]
		if s.parent != nil {
			w.parent = s.parent[:extra]
		}
	}
	// Every position from the last token on predicts the next one.
	w.rows = max(0, w.start+n-(len(s.tokens)-1))
	w.fork = w.rows > 0 && s.req.r.N > 1 && !s.req.forked
	if r := s.req; r.r.PromptLogprobs {
		// Scored positions end where the sample rows begin, so the two
		// runs of rows stay contiguous at the chunk's end.
		from := max(w.start, r.promptDone)
		w.promptRows = max(0, min(w.start+n, len(r.r.Prompt)-1)-from)
	}
	p.seqs = append(p.seqs, w)
	p.tokens += n
	p.rows += w.rows + w.promptRows
}

// maxChunk is the most tokens one sequence computes in a step.
func (sc *scheduler) maxChunk() int {
	n := sc.cfg.MaxNumBatchedTokens
	if t := sc.cfg.LongPrefillThreshold; t > 0 && t < n {
		n = t
	}
	return n
}

// chunk is how many of a sequence's remaining tokens fit this step.
func (sc *scheduler) chunk(remaining, budget int) int {
	n := min(remaining, budget)
	if t := sc.cfg.LongPrefillThreshold; t > 0 && n > t {
		n = t
	}
	return n
}

func (sc *scheduler) isRunning(s *sequence) bool {
	for _, r := range sc.running {
		if r == s {
			return true
		}
	}
	return false
}

// victim is the newest running sequence not yet given work this step.
func (sc *scheduler) victim(picked map[*sequence]bool) *sequence {
	for i := len(sc.running) - 1; i >= 0; i-- {
		if !picked[sc.running[i]] && sc.mine(sc.running[i]) {
			return sc.running[i]
		}
	}
	panic("engine: no sequence to preempt")
}

func (sc *scheduler) preempt(s *sequence) {
	sc.kv.Free(s.id)
	s.numComputed = 0
	s.draft, s.parent = nil, nil
	if s.spec != nil {
		// Recomputed from the start: so are its features.
		s.spec.feats, s.spec.featFrom = s.spec.feats[:0], 0
	}
	sc.removeRunning(s)
	sc.waiting = append([]*sequence{s}, sc.waiting...)
}

// Update applies the results of a step planned by Schedule: res[i] is the
// outcome of p.seqs[i] (read only where rows > 0). Rejected drafts are cut
// from the cache before Commit hashes the computed blocks, so the prefix
// cache never holds a token the sequence did not keep.
func (sc *scheduler) Update(p *plan, res []outcome) {
	for i := range p.seqs {
		w := &p.seqs[i]
		s := w.seq
		s.draft, s.parent = nil, nil
		if s.finished {
			continue // aborted since Schedule
		}
		if w.rows == 0 {
			s.numComputed += w.n
			sc.kv.Commit(s.id, s.tokens, s.numComputed, s.req.extra)
			continue
		}
		o := &res[i]
		if o.accepted < 0 || o.accepted > len(w.draft) {
			panic(fmt.Sprintf("engine: sequence %d: %d drafts accepted of %d", s.id, o.accepted, len(w.draft)))
		}
		rejected := len(w.draft) - o.accepted
		s.numComputed += w.n - rejected
		if rejected > 0 {
			sc.kv.Truncate(s.id, s.numComputed)
		}
		if w.parent != nil {
			if len(o.path) != o.accepted {
				panic(fmt.Sprintf("engine: sequence %d: a path of %d nodes for %d accepted", s.id, len(o.path), o.accepted))
			}
			for _, k := range o.path {
				s.tokens = append(s.tokens, w.draft[k])
			}
		} else {
			s.tokens = append(s.tokens, w.draft[:o.accepted]...)
		}
		sc.kv.Commit(s.id, s.tokens, s.numComputed, s.req.extra)
		if w.fork {
			sc.fork(s, o.forks)
		}
		sc.appendToken(s, o.next, o.done)
	}
	sc.compactRunning()
}

// fork starts completions 1..N-1 of s's request off s's computed prompt,
// sharing its blocks, each with its first token.
func (sc *scheduler) fork(s *sequence, first []forkToken) {
	r := s.req
	if len(first) != r.r.N-1 {
		panic(fmt.Sprintf("engine: request %q forks %d completions, got %d first tokens", r.r.ID, r.r.N-1, len(first)))
	}
	r.forked = true
	for i, f := range first {
		c := sc.newSequence(r, i+1, s.tokens, s.numComputed)
		c.ve = s.ve
		if s.spec != nil && len(s.spec.feats) > 0 {
			// The prompt's features, which the completions share.
			c.spec = &seqSpec{feats: slices.Clone(s.spec.feats), featFrom: s.spec.featFrom}
		}
		if err := sc.kv.Fork(s.id, c.id); err != nil {
			panic(err) // s is running, so it has blocks
		}
		r.seqs = append(r.seqs, c)
		sc.running = append(sc.running, c)
		sc.appendToken(c, f.next, f.done)
	}
}

func (sc *scheduler) appendToken(s *sequence, tok int32, done bool) {
	s.tokens = append(s.tokens, tok)
	if done {
		s.finished = true
		sc.kv.Free(s.id)
	}
}

// abort ends s wherever it is, freeing its blocks.
func (sc *scheduler) abort(s *sequence) {
	s.finished = true
	s.draft, s.parent = nil, nil
	sc.kv.Free(s.id)
	sc.removeRunning(s)
	sc.removeWaiting(s)
}

func (sc *scheduler) compactRunning() {
	k := 0
	for _, s := range sc.running {
		if !s.finished {
			sc.running[k] = s
			k++
		}
	}
	clear(sc.running[k:])
	sc.running = sc.running[:k]
}

func (sc *scheduler) removeRunning(s *sequence) {
	for i, r := range sc.running {
		if r == s {
			sc.running = append(sc.running[:i], sc.running[i+1:]...)
			return
		}
	}
}

func (sc *scheduler) removeWaiting(s *sequence) {
	for i, r := range sc.waiting {
		if r == s {
			sc.waiting = append(sc.waiting[:i], sc.waiting[i+1:]...)
			return
		}
	}
}

// mine reports whether Schedule plans for s now: it belongs to the
// virtual engine being planned.
func (sc *scheduler) mine(s *sequence) bool { return sc.only < 0 || s.ve == sc.only }

// lightest is the virtual engine a new request joins: the one with the
// fewest unfinished sequences (the first on a tie), as vLLM places a
// request on the least loaded of its virtual engines.
func (sc *scheduler) lightest() int {
	if sc.ves <= 1 {
		return 0
	}
	load := make([]int, sc.ves)
	for _, q := range [][]*sequence{sc.running, sc.waiting} {
		for _, s := range q {
			if !s.finished {
				load[s.ve]++
			}
		}
	}
	best := 0
	for v, n := range load {
		if n < load[best] {
			best = v
		}
	}
	return best
}
