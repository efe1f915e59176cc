package grammar

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"sort"
	"strconv"
	"strings"
)

// Limits of what a schema may ask for.
const (
	maxIndent     = 20   // white space between two tokens: "", " " or "\n" and this many spaces/tabs
	maxStringLen  = 1000 // largest maxLength/minLength honoured exactly
	maxArrayItems = 1000 // largest minItems/maxItems
	maxSchemaSize = 1 << 20
)

// SchemaError is a schema the compiler rejects: Keyword names the keyword
// (empty when the problem is not one keyword), Path where it is (a JSON
// pointer into the schema).
type SchemaError struct {
	Path    string
	Keyword string
	Msg     string
	// Transient: the compilation ran out of time or its context was done,
	// which another attempt might not (a refusal worth caching is not
	// transient).
	Transient bool
}

func (e *SchemaError) Error() string {
	at := e.Path
	if at == "" {
		at = "#"
	}
	if e.Keyword != "" {
		return fmt.Sprintf("json schema: %s at %s: %s", e.Keyword, at, e.Msg)
	}
	return fmt.Sprintf("json schema: at %s: %s", at, e.Msg)
}

// unsupported are validation keywords the compiler cannot enforce: a
// schema using one is rejected rather than risk an invalid document.
var unsupported = map[string]string{
	"pattern":               "regular expressions are not supported",
	"format":                "string formats are not supported",
	"patternProperties":     "not supported",
	"propertyNames":         "not supported",
	"minProperties":         "not supported",
	"maxProperties":         "not supported",
	"dependentRequired":     "not supported",
	"dependentSchemas":      "not supported",
	"dependencies":          "not supported",
	"if":                    "conditionals are not supported",
	"then":                  "conditionals are not supported",
	"else":                  "conditionals are not supported",
	"not":                   "not supported",
	"contains":              "not supported",
	"minContains":           "not supported",
	"maxContains":           "not supported",
	"prefixItems":           "tuples are not supported",
	"additionalItems":       "tuples are not supported",
	"unevaluatedProperties": "not supported",
	"unevaluatedItems":      "not supported",
	"$dynamicRef":           "not supported",
	"$recursiveRef":         "not supported",
	"multipleOf":            "not supported",
}

// annotations never constrain a document.
var annotations = map[string]bool{
	"title": true, "description": true, "$schema": true, "$id": true, "$comment": true,
	"examples": true, "default": true, "deprecated": true, "readOnly": true, "writeOnly": true,
	"$defs": true, "definitions": true, "$anchor": true, "contentEncoding": true,
	"contentMediaType": true, "strict": true,
}

// obj is a decoded JSON object that keeps its key order (properties are
// generated in the order the schema declares them).
type obj struct {
	keys []string
	vals map[string]any
}

func (o *obj) get(k string) (any, bool) { v, ok := o.vals[k]; return v, ok }
func (o *obj) val(k string) any         { return o.vals[k] }

// decodeOrdered decodes JSON with objects as *obj and numbers as json.Number.
// Valid documents (json.Valid is fast) take a scanner over the bytes that
// allocates only the values; invalid ones go through encoding/json's
// Decoder for its error message.
func decodeOrdered(data []byte) (any, error) {
	if json.Valid(data) {
		p := &jsonScanner{data: data}
		v, err := p.value(0)
		if err != nil {
			return nil, err
		}
		return v, nil
	}
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	v, err := decodeValue(d, 0)
	if err != nil {
		return nil, err
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, errors.New("trailing data after the schema")
	}
	return v, nil
}

// jsonScanner reads a document already known to be valid JSON.
type jsonScanner struct {
	data []byte
	i    int
}

func (p *jsonScanner) skipWS() {
	for p.i < len(p.data) {
		switch p.data[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *jsonScanner) value(depth int) (any, error) {
	if depth > maxNesting {
		return nil, fmt.Errorf("nested deeper than %d", maxNesting)
	}
	p.skipWS()
	switch c := p.data[p.i]; c {
	case '{':
		p.i++
		o := &obj{vals: map[string]any{}}
		for {
			p.skipWS()
			if p.data[p.i] == '}' {
				p.i++
				return o, nil
			}
			if p.data[p.i] == ',' {
				p.i++
				p.skipWS()
			}
			k, err := p.str()
			if err != nil {
				return nil, err
			}
			p.skipWS()
			p.i++ // ':'
			v, err := p.value(depth + 1)
			if err != nil {
				return nil, err
			}
			if _, dup := o.vals[k]; !dup {
				o.keys = append(o.keys, k)
			}
			o.vals[k] = v
		}
	case '[':
		p.i++
		a := []any{}
		for {
			p.skipWS()
			if p.data[p.i] == ']' {
				p.i++
				return a, nil
			}
			if p.data[p.i] == ',' {
				p.i++
			}
			v, err := p.value(depth + 1)
			if err != nil {
				return nil, err
			}
			a = append(a, v)
		}
	case '"':
		return p.str()
	case 't':
		p.i += 4
		return true, nil
	case 'f':
		p.i += 5
		return false, nil
	case 'n':
		p.i += 4
		return nil, nil
	default:
		j := p.i
		for p.i < len(p.data) && strings.IndexByte("+-.0123456789eE", p.data[p.i]) >= 0 {
			p.i++
		}
		return json.Number(p.data[j:p.i]), nil
	}
}

// str reads a string at p.i.
func (p *jsonScanner) str() (string, error) {
	j := p.i + 1
	esc := false
	k := j
	for ; p.data[k] != '"'; k++ {
		if p.data[k] == '\\' {
			esc = true
			k++
		}
	}
	p.i = k + 1
	if !esc {
		return string(p.data[j:k]), nil
	}
	var s string
	err := json.Unmarshal(p.data[j-1:k+1], &s)
	return s, err
}

const maxNesting = 200

func decodeValue(d *json.Decoder, depth int) (any, error) {
	if depth > maxNesting {
		return nil, fmt.Errorf("nested deeper than %d", maxNesting)
	}
	t, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch t {
	case json.Delim('{'):
		o := &obj{vals: map[string]any{}}
		for d.More() {
			kt, err := d.Token()
			if err != nil {
				return nil, err
			}
			k := kt.(string)
			v, err := decodeValue(d, depth+1)
			if err != nil {
				return nil, err
			}
			if _, dup := o.vals[k]; !dup {
				o.keys = append(o.keys, k)
			}
			o.vals[k] = v
		}
		_, err := d.Token()
		return o, err
	case json.Delim('['):
		a := []any{}
		for d.More() {
			v, err := decodeValue(d, depth+1)
			if err != nil {
				return nil, err
			}
			a = append(a, v)
		}
		_, err := d.Token()
		return a, err
	}
	return t, nil
}

// appendJSON writes v compactly, objects in their key order.
func appendJSON(dst []byte, v any) []byte {
	switch x := v.(type) {
	case nil:
		return append(dst, "null"...)
	case bool:
		return strconv.AppendBool(dst, x)
	case json.Number:
		return append(dst, x...)
	case string:
		return appendString(dst, x)
	case []any:
		dst = append(dst, '[')
		for i, e := range x {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendJSON(dst, e)
		}
		return append(dst, ']')
	case *obj:
		dst = append(dst, '{')
		for i, k := range x.keys {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendString(dst, k)
			dst = append(dst, ':')
			dst = appendJSON(dst, x.vals[k])
		}
		return append(dst, '}')
	}
	panic(fmt.Sprintf("grammar: unexpected %T", v))
}

func appendString(dst []byte, s string) []byte {
	plain := true
	for i := 0; i < len(s) && plain; i++ {
		plain = s[i] >= 0x20 && s[i] < 0x7f && s[i] != '"' && s[i] != '\\'
	}
	if plain { // what encoding/json writes, without its encoder's cost
		dst = append(dst, '"')
		dst = append(dst, s...)
		return append(dst, '"')
	}
	var buf bytes.Buffer
	e := json.NewEncoder(&buf)
	e.SetEscapeHTML(false)
	_ = e.Encode(s) // a string always encodes
	return append(dst, bytes.TrimSuffix(buf.Bytes(), []byte("\n"))...)
}

// compiler turns a schema into grammar rules.
type compiler struct {
	b      *builder
	doc    any
	refs   map[string]int32
	ws     elem
	anyVal int32 // -1 until needed
}

func newCompiler(doc any, bud *budget) *compiler {
	c := &compiler{b: newBuilder(bud), doc: doc, refs: map[string]int32{}, anyVal: -1}
	var err error
	c.ws, err = c.b.lex("ws", func() (*dfa, error) { return wsDFA(maxIndent) })
	if err != nil {
		panic(err)
	}
	return c
}

// CompileSchema compiles a JSON schema within the default Limits.
func CompileSchema(schema []byte) (*Grammar, error) {
	return Compile(context.Background(), schema, "", "", Limits{})
}

// CompileSchemaBetween compiles a schema for a document written between
// two literal texts, white space allowed around it: a tool call's wrapper
// such as "<tool_call>" … "</tool_call>". It uses the default Limits.
func CompileSchemaBetween(schema []byte, prefix, suffix string) (*Grammar, error) {
	return Compile(context.Background(), schema, prefix, suffix, Limits{})
}

// Compile compiles a schema for a document between prefix and suffix (both
// may be empty) within lim, stopping early, with an error, once the
// schema needs more than lim allows or ctx is done (the client left).
func Compile(ctx context.Context, schema []byte, prefix, suffix string, lim Limits) (*Grammar, error) {
	if len(schema) > maxSchemaSize {
		return nil, &SchemaError{Msg: fmt.Sprintf("schema of %d bytes is larger than %d", len(schema), maxSchemaSize)}
	}
	doc, err := decodeOrdered(schema)
	if err != nil {
		return nil, &SchemaError{Msg: "not valid JSON: " + err.Error()}
	}
	bud := newBudget(ctx, lim)
	c := newCompiler(doc, bud)
	root := c.b.rule()
	e, err := c.node(doc, "#")
	if err == nil {
		err = bud.checkNow()
	}
	if err != nil {
		se, ok := err.(*SchemaError)
		if !ok {
			se = &SchemaError{Msg: err.Error()}
		}
		se.Transient = bud.transient
		return nil, se
	}
	var seq []elem
	if prefix != "" {
		seq = append(seq, c.b.lit(prefix))
	}
	seq = append(seq, c.ws, e)
	if suffix != "" {
		seq = append(seq, c.ws, c.b.lit(suffix))
	}
	c.b.define(root, seq)
	g, err := c.b.finish(root)
	if err != nil {
		return nil, &SchemaError{Msg: err.Error(), Transient: bud.transient}
	}
	return g, nil
}

// JSONObject is the grammar of any JSON object (response_format
// json_object).
func JSONObject() *Grammar {
	c := newCompiler(nil, newBudget(context.Background(), Limits{}))
	c.anyValue()
	root := c.b.rule()
	c.b.define(root, []elem{c.ws, c.object(nil, true, elem{kRef, c.anyVal})})
	g, err := c.b.finish(root)
	if err != nil {
		panic(err) // the fixed grammar is well formed
	}
	return g
}

func (c *compiler) errf(path, kw, format string, args ...any) error {
	return &SchemaError{Path: path, Keyword: kw, Msg: fmt.Sprintf(format, args...)}
}

// anyValue defines the rule of any JSON value once.
func (c *compiler) anyValue() elem {
	if c.anyVal >= 0 {
		return elem{kRef, c.anyVal}
	}
	b := c.b
	c.anyVal = b.rule()
	v := elem{kRef, c.anyVal}
	str, _ := b.lex("str", func() (*dfa, error) { return stringDFA(stringSpec{maxLen: -1}) })
	num, _ := b.lex("num", func() (*dfa, error) { return numberDFA(false, false) })
	lits, _ := b.lex("true|false|null", func() (*dfa, error) { return literalsDFA([]string{"true", "false", "null"}, nil) })
	arr := c.array(v, 0, -1)
	o := c.object(nil, true, v)
	b.define(c.anyVal, []elem{o}, []elem{arr}, []elem{str}, []elem{num}, []elem{lits})
	return v
}

type prop struct {
	name     string
	val      elem
	required bool
}

// object is "{" members "}" with props in order; extra: other members may
// follow, with values addl, when there are no declared properties.
func (c *compiler) object(props []prop, extra bool, addl elem) elem {
	b, ws := c.b, c.ws
	open, close, comma, colon := b.lit("{"), b.lit("}"), b.lit(","), b.lit(":")
	if len(props) == 0 {
		if !extra {
			return b.ruleOf([]elem{open, ws, close})
		}
		key, _ := b.lex("str", func() (*dfa, error) { return stringDFA(stringSpec{maxLen: -1}) })
		member := []elem{key, ws, colon, ws, addl}
		more := elem{kRef, b.rule()}
		b.define(more.arg, append(append([]elem{ws, comma, ws}, member...), more), nil)
		return b.ruleOf(
			[]elem{open, ws, close},
			append(append([]elem{open, ws}, member...), more, ws, close),
		)
	}
	kv := func(p prop) []elem { return []elem{b.lit(string(appendString(nil, p.name))), ws, colon, ws, p.val} }
	n := len(props)
	after := make([]elem, n+1) // after[i]: props i.. may follow, one already written
	first := make([]elem, n+1) // first[i]: props i.., none written yet
	after[n] = b.ruleOf(nil)
	first[n] = after[n]
	for i := n - 1; i >= 0; i-- {
		withComma := append(append([]elem{ws, comma, ws}, kv(props[i])...), after[i+1])
		withFirst := append(kv(props[i]), after[i+1])
		if props[i].required {
			after[i] = b.ruleOf(withComma)
			first[i] = b.ruleOf(withFirst)
		} else {
			after[i] = b.ruleOf(withComma, []elem{after[i+1]})
			first[i] = b.ruleOf(withFirst, []elem{first[i+1]})
		}
	}
	return b.ruleOf([]elem{open, ws, first[0], ws, close})
}

// array is "[" items "]" with between lo and hi items (hi < 0: unbounded).
func (c *compiler) array(item elem, lo, hi int) elem {
	b, ws := c.b, c.ws
	open, close, comma := b.lit("["), b.lit("]"), b.lit(",")
	empty := []elem{open, ws, close}
	if hi == 0 {
		return b.ruleOf(empty)
	}
	rep := []elem{ws, comma, ws, item}
	var tail elem
	need := max(lo, 1)
	if hi < 0 {
		r := b.rule()
		b.define(r, append(append([]elem{}, rep...), elem{kRef, r}), nil)
		tail = elem{kRef, r}
	} else {
		tail = b.ruleOf(nil)
		for k := 0; k < hi-need; k++ {
			tail = b.ruleOf(append(append([]elem{}, rep...), tail), nil)
		}
	}
	body := []elem{open, ws, item}
	for k := 1; k < need; k++ {
		body = append(body, rep...)
	}
	body = append(body, tail, ws, close)
	if lo == 0 {
		return b.ruleOf(body, empty)
	}
	return b.ruleOf(body)
}

// node compiles schema s at path.
func (c *compiler) node(s any, path string) (elem, error) {
	if err := c.b.bud.check(); err != nil {
		return elem{}, c.errf(path, "", "%v", err)
	}
	switch x := s.(type) {
	case bool:
		if x {
			return c.anyValue(), nil
		}
		return c.b.ruleOf(), nil // admits nothing
	case *obj:
		return c.schema(x, path)
	}
	return elem{}, c.errf(path, "", "a schema must be an object or a boolean, got %s", appendJSON(nil, s))
}

func (c *compiler) schema(s *obj, path string) (elem, error) {
	for _, k := range s.keys {
		if why, bad := unsupported[k]; bad {
			if k == "format" || k == "pattern" {
				if ty, _ := s.get("type"); ty != nil && ty != "string" && !isTypeList(ty) {
					continue // applies to strings only, and this is not one
				}
			}
			return elem{}, c.errf(path, k, "%s", why)
		}
	}
	constraints := func(except ...string) []string {
		var out []string
		for _, k := range s.keys {
			if !annotations[k] && !strings.HasPrefix(k, "x-") && !contains(except, k) {
				out = append(out, k)
			}
		}
		return out
	}
	if ref, ok := s.get("$ref"); ok {
		if other := constraints("$ref"); len(other) > 0 {
			return elem{}, c.errf(path, other[0], "keywords beside $ref are not supported")
		}
		r, ok := ref.(string)
		if !ok {
			return elem{}, c.errf(path, "$ref", "must be a string")
		}
		return c.ref(r, path)
	}
	if v, ok := s.get("allOf"); ok {
		a, ok := v.([]any)
		if !ok || len(a) != 1 {
			return elem{}, c.errf(path, "allOf", "only a single-schema allOf is supported")
		}
		if other := constraints("allOf"); len(other) > 0 {
			return elem{}, c.errf(path, other[0], "keywords beside allOf are not supported")
		}
		return c.node(a[0], path+"/allOf/0")
	}
	for _, kw := range []string{"anyOf", "oneOf"} {
		v, ok := s.get(kw)
		if !ok {
			continue
		}
		if other := constraints(kw); len(other) > 0 {
			return elem{}, c.errf(path, other[0], "keywords beside %s are not supported", kw)
		}
		a, ok := v.([]any)
		if !ok || len(a) == 0 {
			return elem{}, c.errf(path, kw, "must be a non-empty array of schemas")
		}
		if kw == "oneOf" {
			if err := c.checkOneOf(a, path); err != nil {
				return elem{}, err
			}
		}
		var alts [][]elem
		for i, sub := range a {
			e, err := c.node(sub, fmt.Sprintf("%s/%s/%d", path, kw, i))
			if err != nil {
				return elem{}, err
			}
			alts = append(alts, []elem{e})
		}
		return c.b.ruleOf(alts...), nil
	}
	types, err := c.types(s, path)
	if err != nil {
		return elem{}, err
	}
	if v, ok := s.get("const"); ok {
		return c.enum(s, []any{v}, types, path, "const", constraints("const", "type"))
	}
	if v, ok := s.get("enum"); ok {
		a, ok := v.([]any)
		if !ok {
			return elem{}, c.errf(path, "enum", "must be an array")
		}
		return c.enum(s, a, types, path, "enum", constraints("enum", "type"))
	}
	if types == nil {
		types = inferTypes(s)
	}
	if types == nil {
		return c.anyValue(), nil
	}
	var alts [][]elem
	for _, t := range types {
		e, err := c.typed(s, t, path)
		if err != nil {
			return elem{}, err
		}
		alts = append(alts, []elem{e})
	}
	if len(alts) == 1 {
		return alts[0][0], nil
	}
	return c.b.ruleOf(alts...), nil
}

func contains(a []string, s string) bool {
	for _, x := range a {
		if x == s {
			return true
		}
	}
	return false
}

func isTypeList(v any) bool { _, ok := v.([]any); return ok }

var typeNames = []string{"object", "array", "string", "integer", "number", "boolean", "null"}

// types reads "type" (a name or a list); nil when absent.
func (c *compiler) types(s *obj, path string) ([]string, error) {
	v, ok := s.get("type")
	if !ok {
		return nil, nil
	}
	var names []string
	switch x := v.(type) {
	case string:
		names = []string{x}
	case []any:
		for _, e := range x {
			n, ok := e.(string)
			if !ok {
				return nil, c.errf(path, "type", "must be a string or an array of strings")
			}
			names = append(names, n)
		}
	default:
		return nil, c.errf(path, "type", "must be a string or an array of strings")
	}
	if len(names) == 0 {
		return nil, c.errf(path, "type", "is an empty list")
	}
	for _, n := range names {
		if !contains(typeNames, n) {
			return nil, c.errf(path, "type", "unknown type %q", n)
		}
	}
	return names, nil
}

// inferTypes guesses the type of a schema without "type" from its keywords.
func inferTypes(s *obj) []string {
	for _, k := range s.keys {
		switch k {
		case "properties", "required", "additionalProperties":
			return []string{"object"}
		case "items", "minItems", "maxItems":
			return []string{"array"}
		case "minLength", "maxLength":
			return []string{"string"}
		case "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum":
			return []string{"number"}
		}
	}
	return nil
}

// enum is one literal per value (values of the wrong type dropped).
func (c *compiler) enum(s *obj, vals []any, types []string, path, kw string, other []string) (elem, error) {
	if len(other) > 0 {
		return elem{}, c.errf(path, other[0], "keywords beside %s are not supported", kw)
	}
	// Every distinct value ends in its own automaton state: refuse a
	// huge enum before writing out its values.
	if len(vals) > maxStates {
		return elem{}, c.errf(path, kw, "%d values are more than the supported %d", len(vals), maxStates)
	}
	var lits []string
	for _, v := range vals {
		if types != nil && !hasType(v, types) {
			continue
		}
		lits = append(lits, string(appendJSON(nil, v)))
	}
	if len(lits) == 0 {
		return elem{}, c.errf(path, kw, "no value matches the schema's type")
	}
	sort.Strings(lits)
	return c.b.lex("lits:"+strings.Join(lits, "\x00"), func() (*dfa, error) { return literalsDFA(lits, c.b.bud) })
}

// hasType reports whether JSON value v is one of types.
func hasType(v any, types []string) bool {
	for _, t := range types {
		switch x := v.(type) {
		case nil:
			if t == "null" {
				return true
			}
		case bool:
			if t == "boolean" {
				return true
			}
		case string:
			if t == "string" {
				return true
			}
		case json.Number:
			if t == "number" {
				return true
			}
			if t == "integer" {
				if f, ok := new(big.Float).SetString(string(x)); ok && f.IsInt() {
					return true
				}
			}
		case []any:
			if t == "array" {
				return true
			}
		case *obj:
			if t == "object" {
				return true
			}
		}
	}
	return false
}

func (c *compiler) typed(s *obj, t, path string) (elem, error) {
	b := c.b
	switch t {
	case "null":
		return b.lit("null"), nil
	case "boolean":
		return b.lex("true|false", func() (*dfa, error) { return literalsDFA([]string{"true", "false"}, nil) })
	case "integer":
		lo, hi, bounded, err := c.intBounds(s, path)
		if err != nil {
			return elem{}, err
		}
		if !bounded {
			return b.lex("num:int", func() (*dfa, error) { return numberDFA(true, false) })
		}
		return b.lex(fmt.Sprintf("int:%d:%d", lo, hi), func() (*dfa, error) { return intRangeDFA(lo, hi) })
	case "number":
		for _, kw := range []string{"maximum", "exclusiveMaximum", "exclusiveMinimum"} {
			if _, ok := s.get(kw); ok {
				return elem{}, c.errf(path, kw, "bounds on non-integer numbers are not supported (use type integer)")
			}
		}
		nonNeg := false
		if v, ok := s.get("minimum"); ok {
			n, ok := v.(json.Number)
			f, err := n.Float64()
			if !ok || err != nil || f > 0 {
				return elem{}, c.errf(path, "minimum", "a minimum above 0 on non-integer numbers is not supported (use type integer), got %s", appendJSON(nil, v))
			}
			nonNeg = true
		}
		return b.lex(fmt.Sprintf("num:%v", nonNeg), func() (*dfa, error) { return numberDFA(false, nonNeg) })
	case "string":
		lo, err := c.count(s, "minLength", 0, maxStringLen, path)
		if err != nil {
			return elem{}, err
		}
		hi, err := c.count(s, "maxLength", -1, maxStringLen, path)
		if err != nil {
			return elem{}, err
		}
		if hi >= 0 && hi < lo {
			return elem{}, c.errf(path, "maxLength", "is less than minLength")
		}
		sp := stringSpec{minLen: lo, maxLen: hi}
		e, err := b.lex(fmt.Sprintf("str:%d:%d", lo, hi), func() (*dfa, error) { return stringDFA(sp) })
		if err != nil {
			return elem{}, c.errf(path, "maxLength", "%v", err)
		}
		return e, nil
	case "array":
		lo, err := c.count(s, "minItems", 0, maxArrayItems, path)
		if err != nil {
			return elem{}, err
		}
		hi, err := c.count(s, "maxItems", -1, maxArrayItems, path)
		if err != nil {
			return elem{}, err
		}
		if hi >= 0 && hi < lo {
			return elem{}, c.errf(path, "maxItems", "is less than minItems")
		}
		if v, ok := s.get("uniqueItems"); ok && v != false {
			return elem{}, c.errf(path, "uniqueItems", "not supported")
		}
		item := c.anyValue()
		if v, ok := s.get("items"); ok {
			if _, tuple := v.([]any); tuple {
				return elem{}, c.errf(path, "items", "tuples (an array of schemas) are not supported")
			}
			if item, err = c.node(v, path+"/items"); err != nil {
				return elem{}, err
			}
		}
		return c.array(item, lo, hi), nil
	case "object":
		return c.objectSchema(s, path)
	}
	return elem{}, c.errf(path, "type", "unknown type %q", t)
}

// count reads a non-negative integer keyword (def when absent).
func (c *compiler) count(s *obj, kw string, def, limit int, path string) (int, error) {
	v, ok := s.get(kw)
	if !ok {
		return def, nil
	}
	n, ok := v.(json.Number)
	if !ok {
		return 0, c.errf(path, kw, "must be a non-negative integer")
	}
	i, err := strconv.ParseInt(string(n), 10, 64)
	if err != nil || i < 0 {
		return 0, c.errf(path, kw, "must be a non-negative integer, got %s", n)
	}
	if i > int64(limit) {
		return 0, c.errf(path, kw, "%d is larger than the supported %d", i, limit)
	}
	return int(i), nil
}

func (c *compiler) objectSchema(s *obj, path string) (elem, error) {
	var props []prop
	index := map[string]int{}
	if v, ok := s.get("properties"); ok {
		po, ok := v.(*obj)
		if !ok {
			return elem{}, c.errf(path, "properties", "must be an object")
		}
		for _, k := range po.keys {
			e, err := c.node(po.vals[k], path+"/properties/"+escapePointer(k))
			if err != nil {
				return elem{}, err
			}
			index[k] = len(props)
			props = append(props, prop{name: k, val: e})
		}
	}
	addlAllowed := true
	addl := c.anyValue
	if v, ok := s.get("additionalProperties"); ok {
		switch x := v.(type) {
		case bool:
			addlAllowed = x
		case *obj:
			e, err := c.node(x, path+"/additionalProperties")
			if err != nil {
				return elem{}, err
			}
			addl = func() elem { return e }
		default:
			return elem{}, c.errf(path, "additionalProperties", "must be a boolean or a schema")
		}
	}
	if v, ok := s.get("required"); ok {
		a, ok := v.([]any)
		if !ok {
			return elem{}, c.errf(path, "required", "must be an array of strings")
		}
		for _, r := range a {
			name, ok := r.(string)
			if !ok {
				return elem{}, c.errf(path, "required", "must be an array of strings")
			}
			i, ok := index[name]
			if !ok {
				if !addlAllowed {
					return elem{}, c.errf(path, "required", "%q is required but not allowed (not in properties and additionalProperties is false)", name)
				}
				index[name] = len(props)
				props = append(props, prop{name: name, val: addl()})
				i = index[name]
			}
			props[i].required = true
		}
	}
	// Declared properties exclude any others (a subset of what the schema
	// allows, so the document stays valid); with none declared, any
	// members with values of additionalProperties.
	if len(props) > 0 || !addlAllowed {
		return c.object(props, false, elem{}), nil
	}
	return c.object(nil, true, addl()), nil
}

func escapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// ref resolves a local JSON pointer ("#", "#/$defs/x") to a rule, compiled
// once, so recursive schemas become recursive rules.
func (c *compiler) ref(r, path string) (elem, error) {
	if rule, ok := c.refs[r]; ok {
		return elem{kRef, rule}, nil
	}
	if r != "#" && !strings.HasPrefix(r, "#/") {
		return elem{}, c.errf(path, "$ref", "only local references (#/$defs/...) are supported, got %q", r)
	}
	target, ok := c.resolve(r)
	if !ok {
		return elem{}, c.errf(path, "$ref", "%q does not resolve", r)
	}
	rule := c.b.rule()
	c.refs[r] = rule
	e, err := c.node(target, r)
	if err != nil {
		return elem{}, err
	}
	c.b.define(rule, []elem{e})
	return elem{kRef, rule}, nil
}

// JSON kinds, as bits: what a document's first byte tells apart.
const (
	kindNull = 1 << iota
	kindBool
	kindNumber
	kindString
	kindArray
	kindObject
	kindAll = 1<<iota - 1
)

var kindOfType = map[string]int{"null": kindNull, "boolean": kindBool, "integer": kindNumber,
	"number": kindNumber, "string": kindString, "array": kindArray, "object": kindObject}

func kindOfValue(v any) int {
	switch v.(type) {
	case nil:
		return kindNull
	case bool:
		return kindBool
	case json.Number:
		return kindNumber
	case string:
		return kindString
	case []any:
		return kindArray
	}
	return kindObject
}

// kinds is the set of JSON kinds schema s may accept (semantically, not
// just what its grammar generates); kindAll when unsure.
func (c *compiler) kinds(s any, depth int) int {
	o, ok := s.(*obj)
	if !ok {
		if s == false {
			return 0
		}
		return kindAll
	}
	if depth > 32 {
		return kindAll
	}
	if r, ok := o.get("$ref"); ok {
		if rs, ok := r.(string); ok {
			if t, ok := c.resolve(rs); ok {
				return c.kinds(t, depth+1)
			}
		}
		return kindAll
	}
	k := kindAll
	if v, ok := o.get("type"); ok {
		k = 0
		switch x := v.(type) {
		case string:
			k = kindOfType[x]
		case []any:
			for _, e := range x {
				if n, ok := e.(string); ok {
					k |= kindOfType[n]
				}
			}
		}
	}
	if v, ok := o.get("const"); ok {
		k &= kindOfValue(v)
	}
	if v, ok := o.val("enum").([]any); ok {
		e := 0
		for _, x := range v {
			e |= kindOfValue(x)
		}
		k &= e
	}
	for _, kw := range []string{"anyOf", "oneOf"} {
		if a, ok := o.get(kw); ok {
			if list, ok := a.([]any); ok {
				u := 0
				for _, sub := range list {
					u |= c.kinds(sub, depth+1)
				}
				k &= u
			}
		}
	}
	return k
}

// literals is the set of values s allows (const or enum, as canonical
// JSON, numbers excluded as 1 and 1.0 are one value), ok false when s
// allows others.
func literals(s any) (map[string]bool, bool) {
	o, ok := s.(*obj)
	if !ok {
		return nil, false
	}
	var vals []any
	if v, ok := o.get("const"); ok {
		vals = []any{v}
	} else if v, ok := o.val("enum").([]any); ok {
		vals = v
	} else {
		return nil, false
	}
	set := map[string]bool{}
	for _, v := range vals {
		if _, num := v.(json.Number); num {
			return nil, false
		}
		set[string(appendJSON(nil, v))] = true
	}
	return set, true
}

// discriminated reports whether objects valid against a and b differ in a
// property both require whose allowed values (const/enum) are disjoint.
func discriminated(a, b any) bool {
	ao, ok1 := a.(*obj)
	bo, ok2 := b.(*obj)
	if !ok1 || !ok2 {
		return false
	}
	req := func(o *obj) map[string]bool {
		m := map[string]bool{}
		if r, ok := o.val("required").([]any); ok {
			for _, x := range r {
				if n, ok := x.(string); ok {
					m[n] = true
				}
			}
		}
		return m
	}
	props := func(o *obj) *obj { p, _ := o.val("properties").(*obj); return p }
	ra, rb, pa, pb := req(ao), req(bo), props(ao), props(bo)
	if pa == nil || pb == nil {
		return false
	}
	for name := range ra {
		if !rb[name] {
			continue
		}
		la, ok1 := literals(pa.vals[name])
		lb, ok2 := literals(pb.vals[name])
		if !ok1 || !ok2 {
			continue
		}
		disjoint := true
		for v := range la {
			if lb[v] {
				disjoint = false
			}
		}
		if disjoint {
			return true
		}
	}
	return false
}

// checkOneOf accepts a oneOf only when no document can match two of its
// branches: their JSON kinds differ, or they are objects told apart by a
// required discriminator property. Otherwise a document generated from
// one branch might also match another, which oneOf forbids.
func (c *compiler) checkOneOf(branches []any, path string) error {
	for i := range branches {
		for j := i + 1; j < len(branches); j++ {
			a, b := branches[i], branches[j]
			if c.kinds(a, 0)&c.kinds(b, 0) == 0 {
				continue
			}
			if discriminated(c.deref(a), c.deref(b)) {
				continue
			}
			return c.errf(path, "oneOf", "branches %d and %d may both match one document (only oneOf branches of different types, or objects with a required const/enum discriminator, are supported; anyOf has no such limit)", i, j)
		}
	}
	return nil
}

// deref follows a $ref-only schema to its target.
func (c *compiler) deref(s any) any {
	for range 32 {
		o, ok := s.(*obj)
		if !ok {
			return s
		}
		r, ok := o.val("$ref").(string)
		if !ok {
			return s
		}
		t, ok := c.resolve(r)
		if !ok {
			return s
		}
		s = t
	}
	return s
}

// resolve finds the target of a local reference.
func (c *compiler) resolve(r string) (any, bool) {
	if r == "#" {
		return c.doc, true
	}
	if !strings.HasPrefix(r, "#/") {
		return nil, false
	}
	target := c.doc
	for _, part := range strings.Split(r[2:], "/") {
		part = strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")
		switch x := target.(type) {
		case *obj:
			v, ok := x.get(part)
			if !ok {
				return nil, false
			}
			target = v
		case []any:
			i, err := strconv.Atoi(part)
			if err != nil || i < 0 || i >= len(x) {
				return nil, false
			}
			target = x[i]
		default:
			return nil, false
		}
	}
	return target, true
}
