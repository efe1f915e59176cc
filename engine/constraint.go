package engine

import (
	"context"
	"errors"
	"fmt"

	"pagoda/grammar"
	"pagoda/sample"
	"pagoda/tokenizer"
)

// ErrBadConstraint matches (errors.Is) a request's constraint that does
// not compile (Request.Constraint).
var ErrBadConstraint = errors.New("engine: bad constraint")

// ConstraintCompiler turns a request's constraint (data) into the live
// constraint of each of its completions, on the engine's side.
type ConstraintCompiler interface {
	Compile(ctx context.Context, s *grammar.Spec) (func() sample.Constraint, error)
}

// grammarCompiler compiles specs through a grammar.Cache bound to the
// engine's vocabulary.
type grammarCompiler struct {
	cache *grammar.Cache
	lim   grammar.Limits
}

func newGrammarCompiler(tok tokenizer.Tokenizer, lim grammar.Limits) grammarCompiler {
	return grammarCompiler{grammar.NewCache(func() *grammar.Vocab { return grammar.NewVocab(tok) }), lim}
}

func (g grammarCompiler) Compile(ctx context.Context, s *grammar.Spec) (func() sample.Constraint, error) {
	c, err := g.cache.Get(ctx, *s, g.lim)
	if err != nil {
		return nil, err
	}
	return func() sample.Constraint { return c.Matcher() }, nil
}

// Grammars is the cache the engine compiles constraints through, so a
// front end in the same process that checks a schema before submitting
// (the server, for its 400s) compiles it once for both; nil when
// Config.Constraints replaces it.
func (e *Engine) Grammars() *grammar.Cache {
	if g, ok := e.cons.(grammarCompiler); ok {
		return g.cache
	}
	return nil
}

// compile compiles the request's constraint with cons (its KV policy was
// parsed by validate).
func (q *request) compile(ctx context.Context, cons ConstraintCompiler) error {
	if q.r.Constraint == nil {
		return nil
	}
	mk, err := cons.Compile(ctx, q.r.Constraint)
	if err != nil {
		return fmt.Errorf("engine: request %q: %w: %w", q.r.ID, ErrBadConstraint, err)
	}
	q.constraint = mk
	return nil
}
