package kvcache

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"pagoda/kernels"
	"pagoda/model"
)

// simSeq is one sequence driven through a cache by simRun: its rows are
// pseudo-random functions of (token, position, layer), like a model's
// first layer, so runs in different caches see the same inputs.
type simSeq struct {
	id     int32
	pol    Policy // bound with Bind (nil: the default)
	tokens []int32
	prompt int
}

const (
	simBS, simHD, simNKV, simNH, simLayers = 4, 32, 2, 4, 3
)

var simParams = model.AttnParams{NHead: simNH, NKVHead: simNKV, HeadDim: simHD, Scale: 0.35}

func simRow(tok int32, pos, layer, kind, n int) []float32 {
	r := rand.New(rand.NewPCG(uint64(tok)*7919+uint64(layer)*31+uint64(kind), uint64(pos)+1))
	row := make([]float32, n)
	for i := range row {
		row[i] = float32(r.NormFloat64())
	}
	return row
}

func simRope() *Rotary {
	return &Rotary{Freqs: []float32{1, 0.3, 0.1, 0.03, 0.01, 0.003, 0.001, 0.0003}, HeadDim: simHD}
}

func simCache(t *testing.T, pol Policy, blocks int, kv ...Format) *Cache {
	t.Helper()
	cfg := Config{NLayer: simLayers, NKVHead: simNKV, HeadDim: simHD, BlockSize: simBS, NumBlocks: blocks,
		DType: F32, PrefixCache: true, Policy: pol, Rope: simRope(), Ops: kernels.Generic()}
	if len(kv) == 2 {
		cfg.KFormat, cfg.VFormat = kv[0], kv[1]
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// simOut is one sequence's attention outputs by position·simLayers+layer.
type simOut map[int][]float32

// simRun computes every sequence in one batch per step (the rest of the
// prompt after a prefix hit in one chunk, then a token a step) and returns
// each sequence's attention outputs.
func simRun(t *testing.T, c *Cache, seqs []*simSeq) map[int32]simOut {
	t.Helper()
	out := map[int32]simOut{}
	done := map[int32]int{}
	for _, s := range seqs {
		if err := c.Policies.Bind(s.id, s.pol); err != nil {
			t.Fatal(err)
		}
		c.NotePrompt(s.id, s.prompt)
		hit := c.LookupSeq(s.id, s.tokens[:s.prompt], 0)
		done[s.id] = len(hit) * simBS
		out[s.id] = simOut{}
		if !c.Allocate(s.id, hit, done[s.id], s.prompt) {
			t.Fatal("allocate prompt")
		}
	}
	for {
		b := &model.Batch{}
		type span struct {
			s      *simSeq
			lo, hi int
		}
		var spans []span
		for _, s := range seqs {
			from := done[s.id]
			if from >= len(s.tokens) {
				continue
			}
			to := max(from+1, min(s.prompt, len(s.tokens)))
			if from >= s.prompt {
				to = from + 1
				if !c.Allocate(s.id, nil, from, to) {
					t.Fatal("allocate decode")
				}
			}
			spans = append(spans, span{s, len(b.Pos), len(b.Pos) + to - from})
			for p := from; p < to; p++ {
				b.Tokens, b.Pos, b.Seq = append(b.Tokens, s.tokens[p]), append(b.Pos, int32(p)), append(b.Seq, s.id)
			}
		}
		if len(spans) == 0 {
			return out
		}
		if err := c.Begin(b); err != nil {
			t.Fatal(err)
		}
		for l := 0; l < simLayers; l++ {
			for i := range b.Pos {
				c.Store(l, i, simRow(b.Tokens[i], int(b.Pos[i]), l, 0, simNKV*simHD), simRow(b.Tokens[i], int(b.Pos[i]), l, 1, simNKV*simHD))
			}
			for _, sp := range spans {
				n := sp.hi - sp.lo
				var q []float32
				for i := sp.lo; i < sp.hi; i++ {
					q = append(q, simRow(b.Tokens[i], int(b.Pos[i]), l, 2, simNH*simHD)...)
				}
				o := make([]float32, n*simNH*simHD)
				c.Attend(l, sp.lo, sp.hi, q, o, simParams)
				for i := 0; i < n; i++ {
					out[sp.s.id][int(b.Pos[sp.lo+i])*simLayers+l] = o[i*simNH*simHD : (i+1)*simNH*simHD]
				}
			}
		}
		for _, sp := range spans {
			done[sp.s.id] += sp.hi - sp.lo
			c.Commit(sp.s.id, sp.s.tokens, done[sp.s.id], 0)
		}
		if err := c.Check(); err != nil {
			t.Fatal(err)
		}
	}
}

// sameOut reports whether every row got computed equals want's, and got
// has every decode row (a prefix hit skips prompt rows only).
func sameOut(got, want simOut, decodeFrom, n int) bool {
	for k, v := range got {
		if !slices.Equal(v, want[k]) {
			return false
		}
	}
	for k := decodeFrom * simLayers; k < n*simLayers; k++ {
		if got[k] == nil {
			return false
		}
	}
	return true
}

func simTokens(seed int32, prompt, n int) []int32 {
	toks := make([]int32, n)
	for i := range toks {
		toks[i] = seed*100 + int32(i%7)
		if i < 8 {
			toks[i] = int32(i) // a shared prefix of two blocks
		}
	}
	return toks
}

// assertFreed checks that nothing of the sequences is left: no blocks, no
// bindings, no attached policies, no policy state in the defaults.
func assertFreed(t *testing.T, c *Cache) {
	t.Helper()
	if err := c.Check(); err != nil {
		t.Fatal(err)
	}
	if u := c.Usage(); u.Used != 0 || u.Seqs != 0 {
		t.Fatalf("blocks leaked: %+v", u)
	}
	if s, p := c.Policies.Bound(); s != 0 || p != 0 {
		t.Fatalf("%d sequences still bound, %d policies attached", s, p)
	}
	for _, st := range c.Policies.questShared {
		if st != nil && len(st.seqs) != 0 {
			t.Fatalf("shared quest state of %d sequences left", len(st.seqs))
		}
	}
	for gi := range c.groups {
		switch p := c.groups[gi].Policy.(type) {
		case *QuestPolicy:
			if len(p.st.seqs) != 0 {
				t.Fatalf("quest state of %d sequences left", len(p.st.seqs))
			}
		case *H2OPolicy:
			if len(p.m.seqs) != 0 {
				t.Fatalf("h2o state of %d sequences left", len(p.m.seqs))
			}
		case *SnapKVPolicy:
			if len(p.m.seqs) != 0 || len(p.prompts) != 0 {
				t.Fatalf("snapkv state of %d sequences left", len(p.m.seqs))
			}
		}
	}
}

var simPolicies = []string{"full", "streaming:sinks=2,window=8", "quest:budget=8,dense=1", "h2o:heavy=4,recent=4", "snapkv:capacity=8,window=4,kernel=3"}

// TestSeqPoliciesMatchAlone: sequences running different policies in one
// cache and one batch each attend exactly as they do alone in a cache
// whose default is their policy, whatever the cache's default; freeing
// them leaves no block, binding or policy state behind.
func TestSeqPoliciesMatchAlone(t *testing.T) {
	testSeqPoliciesMatchAlone(t, nil, []string{"full", "quest:budget=8,dense=1", "h2o:heavy=4,recent=4"}, 2)
}

// TestSeqPoliciesQuantized: the same with keys and values in quantized
// formats: q8_0 keys with q4_0 values, and KIVI. KIVI runs one round: a
// prefix hit on KIVI blocks is not batch invariant even with one policy
// (a hit block is read quantized where the sequence alone read part of
// it from the full-precision residual), which is KIVI's, not policies'.
func TestSeqPoliciesQuantized(t *testing.T) {
	for _, kv := range [][2]string{{"q8_0", "q4_0"}, {"kivi4:g=4,r=8", "kivi4:g=4,r=8"}} {
		t.Run(kv[0]+"/"+kv[1], func(t *testing.T) {
			k, err := ParseFormat(kv[0])
			if err != nil {
				t.Fatal(err)
			}
			v, err := ParseFormat(kv[1])
			if err != nil {
				t.Fatal(err)
			}
			rounds := 2
			if _, ok := k.(KIVI); ok {
				rounds = 1
			}
			testSeqPoliciesMatchAlone(t, []Format{k, v}, []string{"quest:budget=8,dense=1"}, rounds)
		})
	}
}

func testSeqPoliciesMatchAlone(t *testing.T, kv []Format, defaults []string, rounds int) {
	const prompt, n = 12, 40
	want := map[string]simOut{}
	for i, spec := range simPolicies {
		pol, err := ParsePolicy(spec)
		if err != nil {
			t.Fatal(err)
		}
		c := simCache(t, pol, 64, kv...)
		s := &simSeq{id: 7, tokens: simTokens(int32(i+1), prompt, n), prompt: prompt}
		want[spec] = simRun(t, c, []*simSeq{s})[7]
		c.Free(7)
		assertFreed(t, c)
	}
	for _, def := range defaults {
		t.Run("default="+def, func(t *testing.T) {
			dp, _ := ParsePolicy(def)
			c := simCache(t, dp, 128, kv...)
			for round := 0; round < rounds; round++ { // the second round meets the first's cached blocks
				var seqs []*simSeq
				for i, spec := range simPolicies {
					pol, _ := ParsePolicy(spec)
					if spec == def && i%2 == 0 {
						pol = nil // the default by omission
					}
					seqs = append(seqs, &simSeq{id: int32(10*round + i), pol: pol, tokens: simTokens(int32(i+1), prompt, n), prompt: prompt})
				}
				got := simRun(t, c, seqs)
				for i, spec := range simPolicies {
					if !sameOut(got[seqs[i].id], want[spec], prompt, n) {
						t.Fatalf("round %d: %s beside other policies attends differently than alone", round, spec)
					}
				}
				for _, s := range seqs {
					c.Free(s.id)
				}
				assertFreed(t, c)
			}
		})
	}
}

// TestSeqPolicyPrefixRules: a plain sequence never takes a block another
// policy computed over less than the full history; an H2O sequence takes
// no prefix hit; a Quest sequence hitting blocks a plain one filled gets
// its key bounds computed; preemption (Free) and a fork release and share
// bindings.
func TestSeqPolicyPrefixRules(t *testing.T) {
	const prompt, n = 12, 40
	c := simCache(t, nil, 128)
	stream, _ := ParsePolicy("streaming:sinks=2,window=8")
	quest, _ := ParsePolicy("quest:budget=8,dense=1")
	h2o, _ := ParsePolicy("h2o:heavy=4,recent=4")
	toks := simTokens(3, prompt, n)

	// A streaming sequence registers its blocks past sinks+window in its
	// own namespace: a plain lookup of the same tokens stops at 8+2 → 2 blocks.
	simRun(t, c, []*simSeq{{id: 1, pol: stream, tokens: toks, prompt: prompt}})
	if got := len(c.LookupSeq(2, toks, 0)); got != 2 {
		t.Fatalf("a plain sequence hits %d blocks of a streaming one's, want 2 (the exact ones)", got)
	}
	if err := c.Policies.Bind(3, stream); err != nil {
		t.Fatal(err)
	}
	if got := len(c.LookupSeq(3, toks, 0)); got != (n-1)/simBS {
		t.Fatalf("a streaming sequence hits %d blocks of another's, want %d", got, (n-1)/simBS)
	}
	if err := c.Policies.Bind(3, nil); err != nil {
		t.Fatal(err)
	}
	c.Free(1)
	c.Free(3)
	assertFreed(t, c)

	// Plain then H2O and Quest on the same tokens.
	simRun(t, c, []*simSeq{{id: 4, tokens: toks, prompt: prompt}})
	if err := c.Policies.Bind(5, h2o); err != nil {
		t.Fatal(err)
	}
	if got := len(c.LookupSeq(5, toks, 0)); got != 0 {
		t.Fatalf("an h2o sequence hit %d blocks", got)
	}
	c.Free(5)
	c.Free(4)
	// Quest alone, for reference, then Quest hitting the plain blocks
	// (their key bounds were never computed: they must be now).
	ref := simCache(t, quest, 128)
	const qp = 24
	want := simRun(t, ref, []*simSeq{{id: 1, tokens: toks, prompt: qp}})[1]
	if err := c.Policies.Bind(6, quest); err != nil {
		t.Fatal(err)
	}
	if got := len(c.LookupSeq(6, toks[:qp], 0)); got != (qp-1)/simBS {
		t.Fatalf("quest hit %d blocks, want %d", got, (qp-1)/simBS)
	}
	out := simRun(t, c, []*simSeq{{id: 6, pol: quest, tokens: toks, prompt: qp}})
	if len(out[6]) == len(want) || !sameOut(out[6], want, qp, n) {
		t.Fatal("quest over hit blocks attends differently (or hit nothing)")
	}
	// Fork shares the binding; freeing both drops the policy.
	if err := c.Fork(6, 8); err != nil {
		t.Fatal(err)
	}
	if s, p := c.Policies.Bound(); s != 2 || p != 1 {
		t.Fatalf("after fork: %d bound, %d policies", s, p)
	}
	c.Free(6)
	c.Free(8)
	assertFreed(t, c)

	// Per-sequence Quests of any settings share one table of key bounds.
	c.Policies.Bind(10, quest)
	c.Policies.Bind(11, NewQuest(4, 0))
	if a, b := c.Policies.of(0, 10).(*QuestPolicy), c.Policies.of(0, 11).(*QuestPolicy); a.st != b.st || a.Budget == b.Budget {
		t.Fatal("two quest settings do not share their key bounds")
	}
	c.Free(10)
	c.Free(11)

	// Binding a sequence that holds blocks to another policy fails.
	c.Policies.Bind(9, quest)
	c.Allocate(9, nil, 0, 4)
	if err := c.Policies.Bind(9, h2o); err == nil {
		t.Fatal("a sequence holding blocks changed its policy")
	}
	c.Free(9)
	assertFreed(t, c)
}

// TestCheckPolicy: what a sequence cannot run.
func TestCheckPolicy(t *testing.T) {
	c, err := New(Config{NLayer: 1, NKVHead: 1, HeadDim: 8, NumBlocks: 4, DType: F32})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []Policy{StreamingPolicy{Sinks: 4, Window: 8}, WindowPolicy{W: 8}, NewQuest(0, 1), sinkPolicy{bs: 4, W: 4}} {
		if err := c.Policies.Bind(1, p); err == nil {
			t.Errorf("bound %s", fmt.Sprint(p))
		}
	}
	if s, n := c.Policies.Bound(); s != 0 || n != 0 {
		t.Fatalf("failed binds left %d, %d", s, n)
	}
}
