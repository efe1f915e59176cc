package server

import (
	"bytes"
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

// constraints keeps compiled response formats by their JSON, so repeated
// requests with one schema share its grammar and its cache of masks (at
// most about 8 MB each, see package grammar).
type constraints struct {
	mu sync.Mutex
	m  map[string]*grammar.Constraint
}

const maxConstraints = 16

// constraint returns the sampling constraint of rf, nil for plain text.
func (s *Server) constraint(rf *responseFormat) (func() sample.Constraint, *apiError) {
	if rf == nil {
		return nil, nil
	}
	var key string
	var compile func() (*grammar.Grammar, error)
	switch rf.Type {
	case "", "text":
		return nil, nil
	case "json_object":
		key = "json_object"
		compile = func() (*grammar.Grammar, error) { return grammar.JSONObject(), nil }
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
		compile = func() (*grammar.Grammar, error) { return grammar.CompileSchema(buf.Bytes()) }
	default:
		return nil, badRequest("response_format", "response_format type %q is not supported (text, json_object or json_schema)", rf.Type)
	}
	f, err := s.cachedConstraint(key, compile)
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
func (s *Server) cachedConstraint(key string, compile func() (*grammar.Grammar, error)) (func() sample.Constraint, error) {
	gv, ok := s.b.(GrammarVocaber)
	if !ok {
		return nil, errNoGrammar
	}
	s.cons.mu.Lock()
	c, ok := s.cons.m[key]
	s.cons.mu.Unlock()
	if !ok {
		g, err := compile()
		if err != nil {
			return nil, err
		}
		c = grammar.New(g, gv.GrammarVocab())
		s.cons.mu.Lock()
		if s.cons.m == nil || len(s.cons.m) >= maxConstraints {
			s.cons.m = map[string]*grammar.Constraint{}
		}
		s.cons.m[key] = c
		s.cons.mu.Unlock()
	}
	return func() sample.Constraint { return c.Matcher() }, nil
}
