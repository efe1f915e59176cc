package engine

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"pagoda/kvcache"
	"pagoda/model"
)

// schedReq is a request of a scheduler scenario. Its prompt is plen
// tokens, the first shared of them common to every request.
type schedReq struct {
	at     int // the step it arrives before
	plen   int
	shared int
	n      int // completions; 0 = 1
	out    int // tokens each completion generates
}

func (q schedReq) prompt(k int) []int32 {
	p := make([]int32, q.plen)
	for i := range p {
		if i < q.shared {
			p[i] = int32(3 + i%25)
		} else {
			p[i] = int32(3 + (k*13+i*7)%25)
		}
	}
	return p
}

// schedHarness drives a scheduler over a real small cache (4-token blocks)
// the way the engine does, without a model: every sampled token is a
// function of the sequence.
type schedHarness struct {
	sc   *scheduler
	kv   *kvcache.Cache
	reqs []*request
}

func newSchedHarness(t *testing.T, cfg Config, blocks int, prefix bool) *schedHarness {
	t.Helper()
	kv, err := kvcache.New(kvcache.Config{NLayer: 1, NKVHead: 1, HeadDim: 1, BlockSize: 4, NumBlocks: blocks, DType: kvcache.F32, PrefixCache: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MaxNumSeqs == 0 {
		cfg.MaxNumSeqs = 64
	}
	return &schedHarness{sc: newScheduler(cfg, managerKV{kv}), kv: kv}
}

func (h *schedHarness) submit(prompt []int32, n, maxTokens int) *request {
	r := &request{r: Request{ID: fmt.Sprint(len(h.reqs)), Prompt: prompt, N: max(n, 1)}, maxTokens: maxTokens}
	h.reqs = append(h.reqs, r)
	h.sc.add(r)
	return r
}

// describe writes a plan as "id:start+n" per sequence, "*" for one logits
// row or "*k" for k, "F" when it forks, then " P<id>" per preemption;
// "-" when empty.
func describe(p *plan) string {
	var parts []string
	for _, w := range p.seqs {
		s := fmt.Sprintf("%d:%d+%d", w.seq.id, w.start, w.n)
		switch {
		case w.rows == 1:
			s += "*"
		case w.rows > 1:
			s += fmt.Sprintf("*%d", w.rows)
		}
		if w.fork {
			s += "F"
		}
		parts = append(parts, s)
	}
	for _, v := range p.preempted {
		parts = append(parts, fmt.Sprintf("P%d", v.id))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}

// outcomes samples every planned sequence with logits, accepting no drafts;
// a completion is done after maxTokens outputs.
func (h *schedHarness) outcomes(p *plan) []outcome {
	res := make([]outcome, len(p.seqs))
	for i, w := range p.seqs {
		if w.rows == 0 {
			continue
		}
		s := w.seq
		outs := len(s.tokens) - len(s.req.r.Prompt) + 1
		res[i].next = int32(3 + (int(s.id)*7+len(s.tokens))%25)
		res[i].done = outs >= s.req.maxTokens
		if w.fork {
			for c := 1; c < s.req.r.N; c++ {
				res[i].forks = append(res[i].forks, forkToken{int32(3 + c), 1 >= s.req.maxTokens})
			}
		}
	}
	return res
}

func (h *schedHarness) step(t *testing.T) *plan {
	t.Helper()
	p := h.sc.Schedule()
	h.sc.Update(p, h.outcomes(p))
	if err := h.kv.Check(); err != nil {
		t.Fatal(err)
	}
	for _, s := range h.sc.running {
		if d := len(s.tokens) - s.numComputed; d < 1 {
			t.Fatalf("sequence %d computed %d of %d tokens: nothing left to sample from", s.id, s.numComputed, len(s.tokens))
		}
	}
	return p
}

// schedCase is a scheduler scenario: requests arrive before given steps,
// each step's plan is written as describe writes it.
type schedCase struct {
	name   string
	cfg    Config
	blocks int
	prefix bool
	reqs   []schedReq
	steps  []string
	// after, when set, runs after each step, and with step ==
	// len(steps) once all is done.
	after func(t *testing.T, h *schedHarness, step int)
}

func runSchedCases(t *testing.T, cases []schedCase) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newSchedHarness(t, tc.cfg, tc.blocks, tc.prefix)
			for i, want := range tc.steps {
				for k, q := range tc.reqs {
					if q.at == i {
						h.submit(q.prompt(k), q.n, q.out)
					}
				}
				if got := describe(h.step(t)); got != want {
					t.Fatalf("step %d planned %q, want %q", i, got, want)
				}
				if tc.after != nil {
					tc.after(t, h, i)
				}
			}
			if !h.sc.idle() {
				t.Fatalf("work left after the last step: %d running, %d waiting", len(h.sc.running), len(h.sc.waiting))
			}
			if u := h.kv.Usage(); u.Used != 0 || u.Seqs != 0 {
				t.Fatalf("blocks leaked: %+v", u)
			}
			if tc.after != nil {
				tc.after(t, h, len(tc.steps))
			}
		})
	}
}

// TestSchedulerBudget: chunked prefill, the token budget's edges, decodes
// before prefills, the long-prefill cap.
func TestSchedulerBudget(t *testing.T) {
	runSchedCases(t, []schedCase{
		{
			name: "chunked prefill over several steps",
			cfg:  Config{MaxNumBatchedTokens: 4}, blocks: 16,
			reqs:  []schedReq{{plen: 10, out: 2}},
			steps: []string{"0:0+4", "0:4+4", "0:8+2*", "0:10+1*"},
		},
		{
			name: "budget exactly the remaining tokens",
			cfg:  Config{MaxNumBatchedTokens: 10}, blocks: 16,
			reqs:  []schedReq{{plen: 6, out: 2}, {plen: 4, out: 2}},
			steps: []string{"0:0+6* 1:0+4*", "0:6+1* 1:4+1*"},
		},
		{
			name: "budget of one token",
			cfg:  Config{MaxNumBatchedTokens: 1}, blocks: 16,
			reqs:  []schedReq{{plen: 3, out: 2}},
			steps: []string{"0:0+1", "0:1+1", "0:2+1*", "0:3+1*"},
		},
		{
			name: "decodes first, prefill chunked to what is left",
			cfg:  Config{MaxNumBatchedTokens: 4}, blocks: 16,
			reqs:  []schedReq{{plen: 2, out: 3}, {at: 1, plen: 8, out: 1}},
			steps: []string{"0:0+2*", "0:2+1* 1:0+3", "0:3+1* 1:3+3", "1:6+2*"},
		},
		{
			name: "long prefill threshold",
			cfg:  Config{MaxNumBatchedTokens: 8, LongPrefillThreshold: 3}, blocks: 16,
			reqs:  []schedReq{{plen: 5, out: 1}, {plen: 5, out: 1}},
			steps: []string{"0:0+3 1:0+3", "0:3+2* 1:3+2*"},
		},
	})
}

// TestSchedulerAdmission: the sequence cap, static batching, n>1 forks,
// prefix hits, preemption by recompute and resumption.
func TestSchedulerAdmission(t *testing.T) {
	runSchedCases(t, []schedCase{
		{
			name: "max seqs",
			cfg:  Config{MaxNumBatchedTokens: 16, MaxNumSeqs: 1}, blocks: 16,
			reqs:  []schedReq{{plen: 3, out: 2}, {plen: 3, out: 1}},
			steps: []string{"0:0+3*", "0:3+1*", "1:0+3*"},
		},
		{
			name: "static batching",
			cfg:  Config{MaxNumBatchedTokens: 16, Static: true}, blocks: 16,
			reqs:  []schedReq{{plen: 3, out: 2}, {at: 1, plen: 3, out: 1}},
			steps: []string{"0:0+3*", "0:3+1*", "1:0+3*"},
		},
		{
			name: "continuous batching admits at once",
			cfg:  Config{MaxNumBatchedTokens: 16}, blocks: 16,
			reqs:  []schedReq{{plen: 3, out: 2}, {at: 1, plen: 3, out: 1}},
			steps: []string{"0:0+3*", "0:3+1* 1:0+3*"},
		},
		{
			name: "n>1 forks off the prompt's blocks",
			cfg:  Config{MaxNumBatchedTokens: 16}, blocks: 16,
			reqs:  []schedReq{{plen: 5, n: 3, out: 3}},
			steps: []string{"0:0+5*F", "0:5+1* 1:5+1* 2:5+1*", "0:6+1* 1:6+1* 2:6+1*"},
			after: func(t *testing.T, h *schedHarness, step int) {
				r := h.reqs[0]
				if len(r.seqs) != 3 || !r.forked {
					t.Fatalf("request has %d sequences, forked %v", len(r.seqs), r.forked)
				}
				for i, s := range r.seqs {
					if s.index != i || len(s.tokens) != 6+min(step, 2) || !slices.Equal(s.tokens[:5], r.r.Prompt) {
						t.Fatalf("step %d completion %d: index %d tokens %v", step, i, s.index, s.tokens)
					}
				}
				// Two prompt blocks shared by three sequences; then the
				// partial one is copied on write by all but the last writer.
				if want := []int{2, 4, 0, 0}[step]; h.kv.Usage().Used != want {
					t.Fatalf("step %d: %d blocks in use, want %d", step, h.kv.Usage().Used, want)
				}
				if step == 0 && !slices.Equal(h.kv.Table(1), h.kv.Table(0)) {
					t.Fatalf("fork holds %v, parent %v", h.kv.Table(1), h.kv.Table(0))
				}
			},
		},
		{
			name: "prefix hits",
			cfg:  Config{MaxNumBatchedTokens: 16}, blocks: 16, prefix: true,
			reqs: []schedReq{
				{plen: 10, shared: 10, out: 1},
				{at: 1, plen: 10, shared: 10, out: 1},
				{at: 2, plen: 12, shared: 8, out: 1},
				{at: 3, plen: 12, shared: 3, out: 1},
			},
			steps: []string{"0:0+10*", "1:8+2*", "2:8+4*", "3:0+12*"},
			after: func(t *testing.T, h *schedHarness, step int) {
				if step < 4 {
					return
				}
				var cached []int
				for _, r := range h.reqs {
					cached = append(cached, r.cached)
				}
				if fmt.Sprint(cached) != "[0 8 8 0]" {
					t.Fatalf("cached tokens %v", cached)
				}
				if q, hit := h.kv.Pool().Queries, h.kv.Pool().Hits; q != 44 || hit != 16 {
					t.Fatalf("prefix counters %d/%d, want 16/44", hit, q)
				}
			},
		},
		{
			name: "preemption by recompute, then resumption",
			cfg:  Config{MaxNumBatchedTokens: 16}, blocks: 4,
			reqs: []schedReq{{plen: 7, out: 6}, {plen: 7, out: 6}},
			steps: []string{
				"0:0+7* 1:0+7*", "0:7+1* 1:7+1*",
				"0:8+1* P1",                    // s0 needs a third block: the newest, s1, goes
				"0:9+1*", "0:10+1*", "0:11+1*", // s1's 9 tokens need 3 blocks, 1 is free
				"1:0+9*", "1:9+1*", "1:10+1*", "1:11+1*",
			},
			after: func(t *testing.T, h *schedHarness, step int) {
				if step < 10 {
					return
				}
				for _, r := range h.reqs {
					if got := len(r.seqs[0].tokens); got != 13 {
						t.Fatalf("request %s ended with %d tokens, want 7+6", r.r.ID, got)
					}
				}
			},
		},
	})
}

// TestSchedulerDrafts verifies drafts through Schedule and Update: a
// sequence with k drafts gets k+1 logits rows (fewer drafts when the
// budget is short); after j are accepted it holds them plus the next
// token, numComputed counts the kept ones, and the rejected ones were cut
// from the cache before their block could be hashed into the prefix cache.
func TestSchedulerDrafts(t *testing.T) {
	// The first token completes block 1, the drafts fill block 2: were it
	// hashed before the rollback, a rejected block would stay cached.
	prompt := []int32{3, 4, 5, 6, 7, 8, 9}
	const first, next = 20, 30
	draft := []int32{21, 22, 23, 24}
	for _, tc := range []struct {
		budget, accepted int
		plan             string
		flags            string // batch.Logits of the step, 1 = a row
	}{
		{budget: 16, accepted: 0, plan: "0:7+5*5", flags: "11111"},
		{budget: 16, accepted: 1, plan: "0:7+5*5", flags: "11111"},
		{budget: 16, accepted: 3, plan: "0:7+5*5", flags: "11111"},
		{budget: 16, accepted: 4, plan: "0:7+5*5", flags: "11111"},
		{budget: 2, accepted: 0, plan: "0:7+2*2", flags: "11"},
		{budget: 2, accepted: 1, plan: "0:7+2*2", flags: "11"},
	} {
		t.Run(fmt.Sprintf("budget%d/accept%d", tc.budget, tc.accepted), func(t *testing.T) {
			h := newSchedHarness(t, Config{MaxNumBatchedTokens: tc.budget}, 16, true)
			r := h.submit(slices.Clone(prompt), 1, 100)
			s := r.seqs[0]
			for s.numComputed < len(prompt) {
				p := h.sc.Schedule()
				h.sc.Update(p, []outcome{{next: first}})
			}
			s.draft = slices.Clone(draft)
			p := h.sc.Schedule()
			if got := describe(p); got != tc.plan {
				t.Fatalf("planned %q, want %q", got, tc.plan)
			}
			var e Engine
			e.buildBatch(p, &e.in)
			flags := ""
			for _, l := range e.in.Logits {
				flags += map[bool]string{true: "1", false: "0"}[l]
			}
			planned := p.seqs[0].draft
			wantTokens := append([]int32{first}, planned...)
			if flags != tc.flags || !slices.Equal(e.in.Tokens, wantTokens) || e.in.Pos[0] != 7 {
				t.Fatalf("batch tokens %v pos %v logits %s, want %v from 7, %s", e.in.Tokens, e.in.Pos, flags, wantTokens, tc.flags)
			}

			h.sc.Update(p, []outcome{{accepted: tc.accepted, next: next}})
			want := slices.Concat(prompt, []int32{first}, draft[:tc.accepted], []int32{next})
			if !slices.Equal(s.tokens, want) || s.numComputed != len(want)-1 || s.draft != nil {
				t.Fatalf("tokens %v computed %d draft %v, want %v computed %d", s.tokens, s.numComputed, s.draft, want, len(want)-1)
			}
			if err := h.kv.Check(); err != nil {
				t.Fatal(err)
			}
			if got, want := len(h.kv.Table(s.id)), (s.numComputed+3)/4; got != want {
				t.Fatalf("holds %d blocks for %d computed tokens, want %d", got, s.numComputed, want)
			}
			// Block 2 is the four drafts: cached only if all were kept.
			probe := slices.Concat(prompt, []int32{first}, draft, []int32{99})
			want3 := 2
			if tc.accepted == len(draft) {
				want3 = 3
			}
			if got := len(h.kv.Lookup(probe, 0)); got != want3 {
				t.Fatalf("lookup of the draft continuation hits %d blocks, want %d", got, want3)
			}

			// The sequence carries on from the corrected token; once its
			// block fills, the kept continuation is what the cache holds.
			for len(s.tokens) < 14 {
				p := h.sc.Schedule()
				if w := p.seqs[0]; w.start != s.numComputed || w.rows != w.n {
					t.Fatalf("after the drafts planned %q with %d computed", describe(p), s.numComputed)
				}
				h.sc.Update(p, []outcome{{next: 40}})
			}
			if got := len(h.kv.Lookup(slices.Concat(s.tokens[:12], []int32{99}), 0)); got != 3 {
				t.Fatalf("lookup of the kept continuation hits %d blocks, want 3", got)
			}
			if err := h.kv.Check(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestSchedulerManagerNoStorage drives the scheduler and a KV manager that
// has no storage at all (kvcache.NewManager) through a workload with
// preemption and n > 1, planning every step as the engine does: every
// row gets a slot in an allocated page of its own sequence, no two rows of
// a step share a slot, and everything is given back at the end.
func TestSchedulerManagerNoStorage(t *testing.T) {
	kv, err := kvcache.NewManager(kvcache.Config{NLayer: 2, NKVHead: 1, HeadDim: 8, BlockSize: 4, NumBlocks: 12, DType: kvcache.F32, PrefixCache: true})
	if err != nil {
		t.Fatal(err)
	}
	h := &schedHarness{sc: newScheduler(Config{MaxNumSeqs: 8, MaxNumBatchedTokens: 16}, managerKV{kv}), kv: kv}
	for k := range 6 {
		prompt := make([]int32, 5+3*k)
		for i := range prompt {
			prompt[i] = int32(1 + (i*5+k)%9)
		}
		h.submit(prompt, 1+k%2, 6+k)
	}
	var e Engine
	var plan model.KVPlan
	preempted := 0
	for steps := 0; !h.sc.idle(); steps++ {
		if steps > 500 {
			t.Fatal("no progress")
		}
		p := h.sc.Schedule()
		preempted += len(p.preempted)
		e.buildBatch(p, &e.in)
		if len(e.in.Tokens) > 0 {
			if err := kv.Plan(e.in.Pos, e.in.Seq, nil, &plan); err != nil {
				t.Fatalf("step %d: %v", steps, err)
			}
			seen := map[int32]bool{}
			for i, slot := range plan.Slots {
				tab := kv.Table(e.in.Seq[i])
				blk := int(e.in.Pos[i]) / 4
				if blk >= len(tab) || slot != tab[blk]*4+e.in.Pos[i]%4 || seen[slot] {
					t.Fatalf("step %d row %d: slot %d, table %v, position %d", steps, i, slot, tab, e.in.Pos[i])
				}
				seen[slot] = true
			}
			if err := kv.Begin(&model.Batch{Tokens: e.in.Tokens, Pos: e.in.Pos, Seq: e.in.Seq, KV: &plan}); err == nil {
				t.Fatal("a manager without storage ran a step")
			}
		}
		h.sc.Update(p, h.outcomes(p))
		if err := kv.Check(); err != nil {
			t.Fatal(err)
		}
	}
	if preempted == 0 {
		t.Fatal("the workload never preempted: the test shows less than it says")
	}
	if u := kv.Usage(); u.Used != 0 || u.Seqs != 0 {
		t.Fatalf("blocks leaked: %+v", u)
	}
	// Quest reads the stored keys: a manager without storage keeps no
	// state for it and tells the storage's side of each commit instead,
	// with the block table its bounds are computed over.
	qm, err := kvcache.NewManager(kvcache.Config{NLayer: 1, NKVHead: 1, HeadDim: 8, BlockSize: 4, NumBlocks: 4, Policy: kvcache.NewQuest(16, 0)})
	if err != nil {
		t.Fatal(err)
	}
	toks := []int32{1, 2, 3, 4, 5}
	if !qm.Allocate(7, nil, 0, 5) {
		t.Fatal("no room")
	}
	qm.Commit(7, toks, 5, 0)
	if err := qm.Plan([]int32{5}, []int32{7}, nil, &plan); err != nil {
		t.Fatal(err)
	}
	if len(plan.Notes) != 1 || plan.Notes[0].Op != model.NoteCommit || plan.Notes[0].N != 5 || !slices.Equal(plan.Notes[0].Table, qm.Table(7)) {
		t.Fatalf("notes %+v after a commit of 5 tokens with table %v", plan.Notes, qm.Table(7))
	}
}
