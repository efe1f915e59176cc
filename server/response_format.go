package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"

	"pagoda/grammar"
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

// GrammarCacher is optionally implemented by a Backend whose engine
// compiles constraints itself (engine.Engine.Grammars): the server checks
// a request's constraint in the engine's cache before submitting it, so a
// schema is compiled once for both and its refusal is a 400 here.
type GrammarCacher interface {
	Grammars() *grammar.Cache
}

// constraint returns the constraint of rf as data for the engine, nil for
// plain text, once it has compiled. Compiling stops when ctx is done (the
// client left).
func (s *Server) constraint(ctx context.Context, rf *responseFormat) (*grammar.Spec, *apiError) {
	if rf == nil {
		return nil, nil
	}
	var spec grammar.Spec
	switch rf.Type {
	case "", "text":
		return nil, nil
	case "json_object":
		spec.Kind = grammar.KindJSONObject
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
		spec = grammar.Spec{Kind: grammar.KindJSONSchema, Schema: buf.String()}
	default:
		return nil, badRequest("response_format", "response_format type %q is not supported (text, json_object or json_schema)", rf.Type)
	}
	if err := s.checkConstraint(ctx, &spec); err != nil {
		if errors.Is(err, errNoGrammar) {
			return nil, badRequest("response_format", "response_format %q is not supported by this backend", rf.Type)
		}
		return nil, badRequest("response_format", "response_format.json_schema.schema: %v", err)
	}
	return &spec, nil
}

var errNoGrammar = errors.New("server: the backend cannot constrain generation")

// checkConstraint compiles spec (or finds it compiled) within the
// server's limits, so that a schema the engine could not compile is the
// client's 400 before anything is submitted. It compiles in the engine's
// cache when the backend shares it, otherwise in one of the server's own
// over the backend's vocabulary: compiled response formats and forced tool
// calls are kept by grammar.Spec.Key (a SHA-256), least recently used
// first out, refusals included (grammar.Cache).
func (s *Server) checkConstraint(ctx context.Context, spec *grammar.Spec) error {
	var c *grammar.Cache
	if gc, ok := s.b.(GrammarCacher); ok {
		c = gc.Grammars()
	}
	if c == nil {
		gv, ok := s.b.(GrammarVocaber)
		if !ok {
			return errNoGrammar
		}
		s.consOnce.Do(func() { s.cons = grammar.NewCache(gv.GrammarVocab) })
		c = s.cons
	}
	_, err := c.Get(ctx, *spec, s.o.GrammarLimits)
	return err
}
