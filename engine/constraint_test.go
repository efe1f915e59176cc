package engine

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"pagoda/grammar"
	"pagoda/sample"
)

// funcCompiler compiles a spec to the constraint factory named by its
// Schema: the engine side of a test's constraints.
type funcCompiler map[string]func() sample.Constraint

func (f funcCompiler) Compile(_ context.Context, s *grammar.Spec) (func() sample.Constraint, error) {
	mk, ok := f[s.Schema]
	if !ok {
		return nil, fmt.Errorf("no constraint %q", s.Schema)
	}
	return mk, nil
}

// countdown allows only token want, and fails once it has accepted
// limit tokens (-1: never).
type countdown struct {
	want, limit int32
	n           int32
}

func (c *countdown) Mask(logits []float32) error {
	if c.limit >= 0 && c.n >= c.limit {
		return errors.New("no token allowed")
	}
	for i := range logits {
		if int32(i) != c.want {
			logits[i] = -1e30
		}
	}
	return nil
}

func (c *countdown) Accept(tok int32) error {
	c.n++
	return nil
}

// TestConstrainedSampling: each of n completions gets its own constraint
// (one of them fails after 3 tokens and alone ends with FinishError and
// its error; the others follow their masks to max_tokens).
func TestConstrainedSampling(t *testing.T) {
	made := 0
	cfg := fakeConfig()
	cfg.Constraints = funcCompiler{"countdown": func() sample.Constraint {
		made++
		if made == 2 {
			return &countdown{want: 7, limit: 3}
		}
		return &countdown{want: int32(5 + made), limit: -1}
	}}
	e := startEngine(t, &fakeModel{}, cfg)
	if _, err := e.Submit(context.Background(), &Request{Prompt: []int32{3}, Constraint: &grammar.Spec{Schema: "nothing"}}); !errors.Is(err, ErrBadConstraint) {
		t.Fatalf("a constraint that does not compile: %v, want ErrBadConstraint", err)
	}
	req := &Request{ID: "c", Prompt: []int32{3, 4, 5}, MaxTokens: 6, N: 3, Sampling: sample.Params{Temperature: 1},
		Constraint: &grammar.Spec{Schema: "countdown"}}
	ch, err := e.Submit(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	toks := make([][]int32, 3)
	finish := make([]FinishReason, 3)
	errs := make([]error, 3)
	for ev := range ch {
		toks[ev.Index] = append(toks[ev.Index], ev.Tokens...)
		if ev.Finish != FinishNone {
			finish[ev.Index], errs[ev.Index] = ev.Finish, ev.Err
		}
	}
	if made != 3 {
		t.Fatalf("%d constraints for 3 completions", made)
	}
	for i := range 3 {
		if i == 1 {
			if finish[i] != FinishError || errs[i] == nil || len(toks[i]) != 3 {
				t.Errorf("completion 1: finish %q err %v tokens %v", finish[i], errs[i], toks[i])
			}
			continue
		}
		if finish[i] != FinishLength || len(toks[i]) != 6 {
			t.Errorf("completion %d: finish %q tokens %v", i, finish[i], toks[i])
		}
		for _, tok := range toks[i] {
			if tok != toks[i][0] || (tok != 6 && tok != 8) {
				t.Errorf("completion %d ignored its mask: %v", i, toks[i])
				break
			}
		}
	}
}
