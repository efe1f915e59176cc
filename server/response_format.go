package server

import (
	"bytes"
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"sync"

	"pagoda/grammar"
	"pagoda/sample"
)

// responseFormat is OpenAI's response_format: text, json_object (any JSON
// object) or json_schema (a document valid against the schema), enforced
// by grammar-constrained sampling.
type responseFormat struct {
	Type       string          `json:"type"`
	JSONSchema *jsonSchemaSpec `json:"json_schema"`
}

type jsonSchemaSpec struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Schema      json.RawMessage `json:"schema"`
	Strict      *bool           `json:"strict"`
}

// GrammarVocaber is optionally implemented by a Backend whose generation
// can be constrained (response_format json_object and json_schema): the
// vocabulary indexed for the grammar matcher.
type GrammarVocaber interface {
	GrammarVocab() *grammar.Vocab
}

// constraints keeps compiled response formats and forced tool calls by
// the SHA-256 of what they were compiled from, least recently used first
// out, so repeated requests with one schema share its grammar and its
// cache of masks (at most about 8 MB each, see package grammar). Schemas
// refused are kept too, so a hostile schema sent again costs a hash;
// refusals for time or a client that left are not, as they may not
// repeat.
type constraints struct {
	mu    sync.Mutex
	m     map[[32]byte]*list.Element
	order list.List // of *constraintEntry, most recent first
}

type constraintEntry struct {
	key [32]byte
	c   *grammar.Constraint
	err error
}

const maxConstraints = 16

func (cs *constraints) get(key [32]byte) (*constraintEntry, bool) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	e, ok := cs.m[key]
	if !ok {
		return nil, false
	}
	cs.order.MoveToFront(e)
	return e.Value.(*constraintEntry), true
}

func (cs *constraints) put(ce *constraintEntry) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.m == nil {
		cs.m = map[[32]byte]*list.Element{}
	}
	if e, ok := cs.m[ce.key]; ok {
		e.Value = ce
		cs.order.MoveToFront(e)
		return
	}
	cs.m[ce.key] = cs.order.PushFront(ce)
	for cs.order.Len() > maxConstraints {
		old := cs.order.Back()
		cs.order.Remove(old)
		delete(cs.m, old.Value.(*constraintEntry).key)
	}
}

// constraint returns the sampling constraint of rf, nil for plain text.
// Compiling stops when ctx is done (the client left).
func (s *Server) constraint(ctx context.Context, rf *responseFormat) (func() sample.Constraint, *apiError) {
	if rf == nil {
		return nil, nil
	}
	var key string
	var compile func(context.Context) (*grammar.Grammar, error)
	switch rf.Type {
	case "", "text":
		return nil, nil
	case "json_object":
		key = "json_object"
		compile = func(context.Context) (*grammar.Grammar, error) { return grammar.JSONObject(), nil }
	case "json_schema":
		if rf.JSONSchema == nil {
			return nil, badRequest("response_format", "response_format json_schema needs a json_schema object with a schema")
		}
		sc := bytes.TrimSpace(rf.JSONSchema.Schema)
		if len(sc) == 0 || string(sc) == "null" {
			return nil, badRequest("response_format", "response_format.json_schema.schema is required")
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, sc); err != nil {
			return nil, badRequest("response_format", "response_format.json_schema.schema is not valid JSON: %v", err)
		}
		key = "schema:" + buf.String()
		compile = func(ctx context.Context) (*grammar.Grammar, error) {
			return grammar.Compile(ctx, buf.Bytes(), "", "", s.o.GrammarLimits)
		}
	default:
		return nil, badRequest("response_format", "response_format type %q is not supported (text, json_object or json_schema)", rf.Type)
	}
	f, err := s.cachedConstraint(ctx, key, compile)
	if err != nil {
		if errors.Is(err, errNoGrammar) {
			return nil, badRequest("response_format", "response_format %q is not supported by this backend", rf.Type)
		}
		return nil, badRequest("response_format", "response_format.json_schema.schema: %v", err)
	}
	return f, nil
}

var errNoGrammar = errors.New("server: the backend cannot constrain generation")

// cachedConstraint returns the constraint compiled under key, compiling it
// the first time.
func (s *Server) cachedConstraint(ctx context.Context, key string, compile func(context.Context) (*grammar.Grammar, error)) (func() sample.Constraint, error) {
	gv, ok := s.b.(GrammarVocaber)
	if !ok {
		return nil, errNoGrammar
	}
	h := sha256.Sum256([]byte(key))
	ce, ok := s.cons.get(h)
	if !ok {
		g, err := compile(ctx)
		ce = &constraintEntry{key: h, err: err}
		if err == nil {
			ce.c = grammar.New(g, gv.GrammarVocab())
		}
		var se *grammar.SchemaError
		if err == nil || errors.As(err, &se) && !se.Transient {
			s.cons.put(ce)
		}
	}
	if ce.err != nil {
		return nil, ce.err
	}
	c := ce.c
	return func() sample.Constraint { return c.Matcher() }, nil
}
