package engine

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"pagoda/executor"
	"pagoda/kvcache"
	"pagoda/tokenizer"
)

// countingExec is an executor "elsewhere": a Follower's storage behind a
// local executor, counting the steps that asked for top-k rows.
type countingExec struct {
	*executor.Local
	mu        sync.Mutex
	top, full int
}

func (c *countingExec) Execute(in *executor.StepInput) (executor.StepOutput, error) {
	c.mu.Lock()
	if in.TopK > 0 {
		c.top++
	} else {
		c.full++
	}
	c.mu.Unlock()
	return c.Local.Execute(in)
}

// TestTopOneSteps: with an executor on the far side of the boundary,
// greedy requests that want nothing but the token run their steps on
// each row's top logit only (StepInput.TopK = 1); any request in the step
// that needs whole rows (log-probabilities, penalties, a logit bias,
// sampling) gets them. Both give the tokens of the in-process engine.
func TestTopOneSteps(t *testing.T) {
	m := openStories(t)
	tok := m.Tokenizer()
	texts := []string{"Once upon a time", "The cat", "Lily and Ben went to the park. They saw a big dog", "One day"}
	mk := func(i int, s string) *Request {
		r := &Request{ID: fmt.Sprint(i), Prompt: tok.Encode(s, tokenizer.Options{AddSpecial: true}), MaxTokens: 20, IgnoreEOS: true}
		// The requests that need whole rows stop early, so the greedy ones
		// run steps alone afterwards whatever order the scheduler admits
		// them in (under -race they are often admitted in the same step
		// and would otherwise share every step).
		switch i {
		case 1:
			r.Sampling.FrequencyPenalty = 0.5
			r.MaxTokens = 6
		case 3:
			r.Logprobs = true
			r.MaxTokens = 6
		}
		return r
	}
	start := func(ex *countingExec) *Engine {
		cfg := modelConfig(m)
		cfg.KVBlocks = 64
		if ex != nil {
			cfg.Executor = func(kc kvcache.Config) (executor.Executor, error) {
				f, err := kvcache.NewFollower(kc)
				if err != nil {
					return nil, err
				}
				ex.Local = executor.NewLocal(m, f)
				return ex, nil
			}
		}
		e, err := New(m, tok, cfg)
		if err != nil {
			t.Fatal(err)
		}
		e.Start()
		return e
	}
	ref := start(nil)
	var want []result
	for i, s := range texts {
		want = append(want, run(t, ref, mk(i, s)))
	}
	ref.Stop(context.Background())

	for _, tc := range []struct {
		name     string
		subset   []int // requests run together
		top      bool  // some steps ask for top-1 rows
		fullRows bool  // some steps ask for whole rows
	}{
		{"greedy only", []int{0, 2}, true, false},
		{"with penalties", []int{0, 1, 2}, true, true},
		{"with logprobs", []int{2, 3}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ex := &countingExec{}
			e := start(ex)
			defer e.Stop(context.Background())
			got := make([]result, len(texts))
			var wg sync.WaitGroup
			for _, i := range tc.subset {
				wg.Go(func() { got[i] = run(t, e, mk(i, texts[i])) })
			}
			wg.Wait()
			for _, i := range tc.subset {
				if !slices.Equal(got[i].tokens[0], want[i].tokens[0]) {
					t.Errorf("request %d: %v, in process %v", i, got[i].tokens[0], want[i].tokens[0])
				}
			}
			if (ex.top > 0) != tc.top || (ex.full > 0) != tc.fullRows {
				t.Errorf("%d top-1 steps and %d whole-row steps", ex.top, ex.full)
			}
		})
	}
}
