package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	"pagoda/eagle"
	"pagoda/spec"
	"pagoda/testutil"
	"pagoda/tokenizer"
)

// featRecorder counts what a feature proposer is handed: calls, the
// requests among them that asked no drafts, and the most feature rows one
// request carried.
type featRecorder struct {
	*eagle.Proposer
	calls, noDraft, maxRows int
}

func (r *featRecorder) Propose(reqs []*spec.Req) error {
	r.calls++
	for _, q := range reqs {
		if q.Max == 0 {
			r.noDraft++
		}
		r.maxRows = max(r.maxRows, len(q.Features)/r.FeatureDim())
	}
	return r.Proposer.Propose(reqs)
}

// TestFeaturesPlainSteps: the plain steps of an engine that could
// speculate with EAGLE cost what a plain engine's do. With the controller
// held on plain (no trials), 8 greedy sequences in flight ask the
// executor for no hidden states once they decode, keep no feature rows
// and never call the proposer; the output is plain decoding's. (Before,
// every step returned and copied every row's state and every 256 tokens
// the rows were handed over in a Propose with no drafts asked.) With the
// controller switching arms every two steps, the output is still plain
// decoding's, no proposal is without drafts, and none carries more than
// 2·featTail rows of a sequence.
func TestFeaturesPlainSteps(t *testing.T) {
	m := openStories(t)
	tok := m.Tokenizer()
	d, err := eagle.Load("../models/stories260K.eagle.gguf", m, testutil.Shared(t, "models/gguf/stories260K.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	var reqs []*Request
	prompt := 0
	for i := range 8 {
		p := tok.Encode(fmt.Sprintf("Once upon a time there were %d cats.", i+2), tokenizer.Options{AddSpecial: true})
		prompt += len(p)
		reqs = append(reqs, &Request{ID: fmt.Sprint(i), Prompt: p, MaxTokens: 300 + 7*i, IgnoreEOS: true})
	}
	cfg := modelConfig(m)
	cfg.KVBlocks = 256
	ep, err := New(m, tok, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ep.Start()
	want := runAll(t, ep, reqs)
	ep.Stop(context.Background())

	// Requests that do not speculate: only the steps with prompts in
	// flight ask for hidden states, and nothing is kept.
	cfg.Spec = SpecConfig{Proposer: d.Proposer(eagle.ProposerOptions{}), Tokens: 8}
	e, err := New(m, tok, cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.Start()
	var opt []*Request
	for _, r := range reqs {
		c := *r
		c.SpecTokens = -1
		opt = append(opt, &c)
	}
	got := runAll(t, e, opt)
	e.Stop(context.Background())
	for i := range reqs {
		if fmt.Sprint(got[i].tokens) != fmt.Sprint(want[i].tokens) {
			t.Fatalf("opted out, request %d: %v, plain %v", i, got[i].tokens, want[i].tokens)
		}
	}
	if st := e.Stats(); e.feat.steps > uint64(len(reqs)) || e.feat.rows > 0 {
		t.Fatalf("requests that do not speculate: %d of %d steps asked for hidden states, %d rows kept", e.feat.steps, st.Steps, e.feat.rows)
	}

	for _, held := range []bool{true, false} {
		rec := &featRecorder{Proposer: d.Proposer(eagle.ProposerOptions{})}
		cfg.Spec = SpecConfig{Proposer: rec, Tokens: 8, Control: SpecControl{Window: 2, ProbeEvery: 2, Explore: 1, Stale: time.Hour}}
		e, err := New(m, tok, cfg)
		if err != nil {
			t.Fatal(err)
		}
		e.ctl = newSpecCtl(cfg.Spec.Control, ladderFor(rec, e.trees, e.specMax), e.specMax)
		e.ctl.ungated = !held
		if held {
			e.ctl.probes = 1 << 40 // the exploration budget is spent: no trials
		}
		e.Start()
		got := runAll(t, e, reqs)
		e.Stop(context.Background())
		for i := range reqs {
			if fmt.Sprint(got[i].tokens) != fmt.Sprint(want[i].tokens) {
				t.Fatalf("held %v, request %d: %v, plain %v", held, i, got[i].tokens, want[i].tokens)
			}
		}
		mustNoLeak(t, e)
		f, st := e.feat, e.Stats()
		t.Logf("held %v: %d steps, %d asked for hidden states, %d feature rows kept; %d proposals (%d without drafts), at most %d rows; accepted %d of %d",
			held, st.Steps, f.steps, f.rows, rec.calls, rec.noDraft, rec.maxRows, st.SpecAccepted, st.SpecDraftTokens)
		if rec.noDraft > 0 || rec.maxRows > 2*featTail {
			t.Fatalf("held %v: %d requests without drafts, up to %d feature rows handed over (most %d)", held, rec.noDraft, rec.maxRows, 2*featTail)
		}
		if held {
			// Only steps that decode nothing (a prompt alone) ask: the
			// controller cannot tell yet what the load will be.
			if rec.calls > 0 || f.steps > uint64(len(reqs)) || f.rows > uint64(prompt) || e.specSteps > 0 {
				t.Fatalf("held on plain: %d proposals, %d of %d steps asked for hidden states, %d rows kept (prompts: %d tokens)", rec.calls, f.steps, st.Steps, f.rows, prompt)
			}
		} else if st.SpecAccepted == 0 || f.steps < st.Steps/2 {
			t.Fatalf("switching: %d accepted, %d of %d steps asked for hidden states", st.SpecAccepted, f.steps, st.Steps)
		}
	}
}

// TestSpecCtlLeavesPlainSoon: a bucket exploiting plain asks for features
// in the ctlFeatLead steps before every window that speculates (the tail
// its proposal restarts from), on every step that speculates, and on few
// others: the plain window that closes a trial's bracket (the controller
// may switch to the spec arm after it), not a plain window that no trial
// follows within ctlFeatLead steps.
func TestSpecCtlLeavesPlainSoon(t *testing.T) {
	const window = 24
	c := newSpecCtl(SpecControl{Window: window, ProbeEvery: 8, Explore: 0.05}, nil, 4)
	if !c.wantsFeatures(0, armSpec, true) || c.wantsFeatures(0, armSpec, false) {
		t.Fatal("a step without candidates must ask for its prompts, and only then")
	}
	now := time.Unix(0, 0)
	var arms []int
	var soon []bool
	for range 6000 {
		now = now.Add(time.Millisecond)
		arm := c.choose(8, now)
		arms, soon = append(arms, arm), append(soon, c.leavesPlainSoon(8))
		tok := 8 // plain realises 8 tokens a step, spec 7: plain stays exploited
		if arm != armPlain {
			tok = 7
		}
		c.observe(ctlObs{n: 8, arm: arm, tokens: tok, rows: 8, sec: 1e-3})
	}
	spec, wins, asked := 0, 0, 0
	for i, a := range arms {
		if soon[i] {
			asked++
		}
		if a == armPlain {
			continue
		}
		spec++
		if !soon[i] {
			t.Fatalf("step %d speculates without asking for features", i)
		}
		if i > 0 && arms[i-1] == armPlain {
			wins++
			for j := max(0, i-ctlFeatLead); j < i; j++ {
				if !soon[j] {
					t.Fatalf("step %d, %d before a spec window, asks for no features", j, i-j)
				}
			}
		}
	}
	t.Logf("%d steps: %d speculate (%d windows), %d ask for features", len(arms), spec, wins, asked)
	if wins < 3 || asked > spec+(ctlFeatLead+window)*(wins+1) || asked > len(arms)/2 {
		t.Fatalf("%d of %d steps asked for features; %d speculated in %d windows", asked, len(arms), spec, wins)
	}
}
