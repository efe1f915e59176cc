package grammar

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// testSchemas cover every supported keyword.
var testSchemas = map[string]string{
	"person": `{"type":"object","properties":{
		"name":{"type":"string","maxLength":8},
		"age":{"type":"integer","minimum":0,"maximum":150},
		"rank":{"type":"integer","exclusiveMinimum":-20,"exclusiveMaximum":-3},
		"tags":{"type":"array","items":{"type":"string","enum":["a","b\"c","ü"]},"minItems":1,"maxItems":3},
		"ok":{"type":"boolean"},
		"none":{"type":"null"},
		"score":{"type":"number"}},
		"required":["name","age"],"additionalProperties":false}`,
	"nested": `{"type":"object","properties":{
		"a":{"type":"object","properties":{"b":{"type":"object","properties":{"c":{"const":[1,{"x":"y"}]}},"required":["c"]}},"required":["b"]},
		"d":{"type":["string","null"],"minLength":2,"maxLength":4}},"required":["a","d"]}`,
	"refs": `{"$defs":{"pt":{"type":"object","properties":{"x":{"type":"number"},"y":{"type":"number"}},"required":["x","y"]}},
		"type":"object","properties":{"from":{"$ref":"#/$defs/pt"},"to":{"allOf":[{"$ref":"#/$defs/pt"}]},
		"kind":{"anyOf":[{"type":"integer"},{"enum":["line","arc"]}]},
		"pick":{"oneOf":[{"type":"boolean"},{"type":"string","maxLength":3}]}},
		"required":["from","to","kind","pick"]}`,
	"tree": `{"definitions":{"node":{"type":"object","properties":{"v":{"type":"integer"},
		"kids":{"type":"array","items":{"$ref":"#/definitions/node"},"maxItems":2}},"required":["v"]}},
		"$ref":"#/definitions/node"}`,
	"free": `{"type":"object","additionalProperties":{"type":"integer"}}`,
	"union": `{"$defs":{"cat":{"type":"object","properties":{"kind":{"const":"cat"},"lives":{"type":"integer"}},"required":["kind","lives"]},
		"dog":{"type":"object","properties":{"kind":{"enum":["dog","puppy"]},"good":{"type":"boolean"}},"required":["kind"]}},
		"oneOf":[{"$ref":"#/$defs/cat"},{"$ref":"#/$defs/dog"},{"type":"array","items":{"type":"null"}}]}`,
	"any": `{}`,
	"arr": `{"type":"array","items":{"type":"number"},"minItems":2,"maxItems":4}`,
}

// byteVocab is every single byte plus multi-byte pieces a real vocabulary
// has (with JSON punctuation inside them), and an EOG token.
func byteVocab() *Vocab {
	var pieces [][]byte
	for b := 0; b < 256; b++ {
		pieces = append(pieces, []byte{byte(b)})
	}
	for _, s := range []string{`{"`, `":`, `", "`, `"}`, `]}`, `true`, `false`, `null`, `  `, "\n  ", `12`, `.5`, `e+`,
		`name`, `age`, `"a"`, `[]`, `{}`, `ab`, `ü`, `\u00`, `\"`, `"x`, `:"`, `,"`, ` {`, `0`, `-1`, `line`, `arc`} {
		pieces = append(pieces, []byte(s))
	}
	pieces = append(pieces, nil) // EOG
	return NewVocabBytes(pieces, []int32{int32(len(pieces) - 1)})
}

// generate samples one document from m, choosing uniformly among the
// allowed tokens (and checking the mask against Accept on every token
// when check is set).
func generate(t *testing.T, m *Matcher, v *Vocab, r *rand.Rand, check bool) string {
	t.Helper()
	var out []byte
	logits := make([]float32, v.Size())
	for step := 0; step < 2000; step++ {
		for i := range logits {
			logits[i] = 0
		}
		if err := m.Mask(logits); err != nil {
			t.Fatalf("after %q: %v", out, err)
		}
		var ok []int32
		for i, l := range logits {
			allowed := !math.IsInf(float64(l), -1)
			if allowed {
				ok = append(ok, int32(i))
			}
			if check {
				var err error
				if v.isEOG[i] {
					err = m.Clone().Accept(int32(i))
				} else if len(v.pieces[i]) > 0 {
					err = m.Clone().AcceptBytes(v.pieces[i])
				} else {
					continue
				}
				if allowed != (err == nil) {
					t.Fatalf("after %q: token %d %q: mask says %v, Accept says %v", out, i, v.pieces[i], allowed, err)
				}
			}
		}
		// Prefer ending and closing so documents stay short.
		tok := ok[r.IntN(len(ok))]
		for _, id := range ok {
			if v.isEOG[id] || (r.IntN(4) == 0 && strings.ContainsAny(string(v.pieces[id]), `"]}`)) {
				tok = id
				break
			}
		}
		if err := m.Accept(tok); err != nil {
			t.Fatalf("after %q: %v", out, err)
		}
		if v.isEOG[tok] {
			if !m.Done() {
				t.Fatal("EOG accepted but not done")
			}
			return string(out)
		}
		out = append(out, v.pieces[tok]...)
	}
	t.Fatalf("no end after 2000 tokens: %q", out)
	return ""
}

func TestRandomDocumentsValidate(t *testing.T) {
	v := byteVocab()
	for name, s := range testSchemas {
		t.Run(name, func(t *testing.T) {
			g, err := CompileSchema([]byte(s))
			if err != nil {
				t.Fatal(err)
			}
			c := New(g, v)
			r := rand.New(rand.NewPCG(1, uint64(len(name))))
			for i := range 40 {
				doc := generate(t, c.Matcher(), v, r, i < 5)
				if err := parseAndValidate(doc, []byte(s)); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
	t.Run("json_object", func(t *testing.T) {
		c := New(JSONObject(), v)
		r := rand.New(rand.NewPCG(2, 3))
		for i := range 40 {
			doc := generate(t, c.Matcher(), v, r, i < 5)
			if err := parseAndValidate(doc, nil); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// TestAcceptsAndRejects feeds fixed texts: valid documents must be
// accepted whole (and be complete), invalid ones must fail somewhere.
func TestAcceptsAndRejects(t *testing.T) {
	cases := []struct {
		schema, text string
		ok           bool
	}{
		{testSchemas["person"], `{"name":"Bo","age":3}`, true},
		{testSchemas["person"], ` { "name" : "\u00e9\n" , "age" : 0, "tags":["b\"c","ü"], "ok":true, "none":null, "score":-1.5e+3 }`, true},
		{testSchemas["person"], "{\n  \"name\": \"x\",\n\t\"age\": 1\n}", true},
		{testSchemas["person"], `{"age":3,"name":"Bo"}`, false},           // order is the schema's
		{testSchemas["person"], `{"name":"Bo"}`, false},                   // missing required
		{testSchemas["person"], `{"name":"Bo","age":-3}`, false},          // minimum 0
		{testSchemas["person"], `{"name":"Bo","age":3.5}`, false},         // integer
		{testSchemas["person"], `{"name":"123456789","age":3}`, false},    // maxLength
		{testSchemas["person"], `{"name":"Bo","age":3,"tags":[]}`, false}, // minItems
		{testSchemas["person"], `{"name":"Bo","age":3,"x":1}`, false},     // additionalProperties
		{testSchemas["person"], `{"name":"Bo","age":03}`, false},          // leading zero
		{testSchemas["person"], "{\"name\":\"a\tb\",\"age\":3}", false},   // raw control character
		{testSchemas["person"], "{\"name\":\"\xff\",\"age\":3}", false},   // invalid UTF-8
		{testSchemas["person"], "{\n" + strings.Repeat(" ", maxIndent) + `"name":"","age":1}`, true},
		{testSchemas["person"], "{\n" + strings.Repeat(" ", maxIndent+1) + `"name":"","age":1}`, false},
		{testSchemas["person"], "{  \"name\":\"\",\"age\":1}", false},
		{testSchemas["person"], "{\n\n\"name\":\"\",\"age\":1}", false},
		{testSchemas["nested"], `{"a":{"b":{"c":[1,{"x":"y"}]}},"d":null}`, true},
		{testSchemas["nested"], `{"a":{"b":{"c":[1,{"x":"y"}]}},"d":"x"}`, false},
		{testSchemas["tree"], `{"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]}`, true},
		{testSchemas["tree"], `{"v":1,"kids":[{"v":2},{"v":3},{"v":4}]}`, false},
		{testSchemas["refs"], `{"from":{"x":1,"y":2},"to":{"x":0.5,"y":-1},"kind":"arc","pick":"abc"}`, true},
		{testSchemas["refs"], `{"from":{"x":1,"y":2},"to":{"x":0.5,"y":-1},"kind":"circle","pick":true}`, false},
		{testSchemas["free"], `{"a":1,"a":2,"\u0062":3}`, true},
		{testSchemas["free"], `{"a":"1"}`, false},
		{testSchemas["arr"], `[1,2.5,3]`, true},
		{testSchemas["arr"], `[1]`, false},
		{testSchemas["any"], `[{"a":[true,false,null,"s",1e5]}]`, true},
		{`{"type":"string","enum":["x","y"]}`, `"y"`, true},
		{`{"enum":["x",1,null]}`, `1`, true},
		{`{"type":"string","enum":["x",1]}`, `1`, false}, // 1 is not a string
	}
	v := byteVocab()
	for i, tc := range cases {
		g, err := CompileSchema([]byte(tc.schema))
		if err != nil {
			t.Fatal(err)
		}
		m := New(g, v).Matcher()
		err = m.AcceptBytes([]byte(tc.text))
		ok := err == nil && m.Complete()
		if ok != tc.ok {
			t.Errorf("case %d: %q: accepted %v (err %v, complete %v), want %v", i, tc.text, ok, err, m.Complete(), tc.ok)
		}
	}
}

func TestSchemaErrors(t *testing.T) {
	cases := []struct{ schema, want string }{
		{`{"type":"string","pattern":"^a$"}`, "pattern"},
		{`{"type":"string","format":"date"}`, "format"},
		{`{"type":"number","maximum":3}`, "maximum"},
		{`{"type":"number","minimum":3}`, "minimum"},
		{`{"minimum":3}`, "minimum"},
		{`{"type":"integer","minimum":3,"maximum":2}`, "no integer"},
		{`{"type":"integer","exclusiveMinimum":2,"exclusiveMaximum":3}`, "no integer"},
		{`{"type":"integer","maximum":"x"}`, "maximum"},
		{`{"type":"object","properties":{"a":{"not":{}}}}`, "not at #/properties/a"},
		{`{"allOf":[{},{}]}`, "allOf"},
		{`{"$ref":"http://x/y"}`, "$ref"},
		{`{"$ref":"#/$defs/missing"}`, "does not resolve"},
		{`{"$ref":"#"}`, "no finite"},
		{`{"anyOf":[{"$ref":"#"},{"type":"null"}]}`, "recurses without consuming"},
		{`{"type":"object","properties":{"a":{"$ref":"#"}},"required":["a"]}`, "no finite"},
		{`{"type":"object","properties":{"a":false},"required":["a"]}`, "no finite"},
		{`{"type":"object","required":["b"],"properties":{"a":{}},"additionalProperties":false}`, "required"},
		{`{"type":"strin"}`, "type"},
		{`{"type":"string","maxLength":100000}`, "maxLength"},
		{`{"type":"array","uniqueItems":true}`, "uniqueItems"},
		{`{"type":"array","items":[{}]}`, "items"},
		{`{"enum":[]}`, "enum"},
		{`{"type":"string","enum":[1]}`, "enum"},
		{`{"type":"string","minLength":3,"maxLength":2}`, "maxLength"},
		{`{"anyOf":[]}`, "anyOf"},
		{`{"type":"integer","const":1,"minLength":1}`, "minLength"},
		{`{"oneOf":[{},{"type":"string"}]}`, "oneOf"},
		{`{"oneOf":[{"type":"integer"},{"type":"number"}]}`, "oneOf"},
		{`{"oneOf":[{"properties":{"a":{}}},{"type":"string"}]}`, "oneOf"}, // the first also accepts strings
		{`{"oneOf":[{"type":"object","properties":{"k":{"const":"a"}}},{"type":"object","properties":{"k":{"const":"b"}}}]}`, "oneOf"}, // k not required
		{`[1]`, "schema must be"},
		{`{"a":`, "not valid JSON"},
	}
	for _, tc := range cases {
		_, err := CompileSchema([]byte(tc.schema))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want one mentioning %q", tc.schema, err, tc.want)
		}
	}
}

// TestEOGForced: once a document is complete only EOG remains.
func TestEOGForced(t *testing.T) {
	v := byteVocab()
	g, err := CompileSchema([]byte(`{"type":"object","properties":{"a":{"type":"boolean"}},"required":["a"]}`))
	if err != nil {
		t.Fatal(err)
	}
	m := New(g, v).Matcher()
	eog := int32(v.Size() - 1)
	if m.Accept(eog) == nil {
		t.Fatal("EOG accepted at the start")
	}
	if err := m.AcceptBytes([]byte(`{"a":true}`)); err != nil {
		t.Fatal(err)
	}
	logits := make([]float32, v.Size())
	if err := m.Mask(logits); err != nil {
		t.Fatal(err)
	}
	for i, l := range logits {
		if !math.IsInf(float64(l), -1) != (int32(i) == eog) {
			t.Fatalf("token %d %q allowed=%v after a complete document", i, v.pieces[i], !math.IsInf(float64(l), -1))
		}
	}
	if err := m.Accept(eog); err != nil || !m.Done() {
		t.Fatal(err)
	}
	if m.Accept(5) == nil {
		t.Fatal("a token after EOG was accepted")
	}
}

// TestLimitsCompileFast: the largest limits compile in well under a
// second, and a schema asking for too many automaton states is refused.
func TestLimitsCompileFast(t *testing.T) {
	for _, s := range []string{
		fmt.Sprintf(`{"type":"string","minLength":%d,"maxLength":%d}`, maxStringLen-1, maxStringLen),
		fmt.Sprintf(`{"type":"array","minItems":%d,"maxItems":%d}`, maxArrayItems, maxArrayItems),
	} {
		t0 := time.Now()
		g, err := CompileSchema([]byte(s))
		if err != nil {
			t.Fatal(err)
		}
		if err := New(g, byteVocab()).Matcher().Mask(make([]float32, 300)); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(t0); d > time.Second {
			t.Errorf("%s: %v", s, d)
		}
	}
	var props []string
	for i := range 30 {
		props = append(props, fmt.Sprintf(`"p%d":{"type":"string","maxLength":%d}`, i, maxStringLen-i))
	}
	_, err := CompileSchema([]byte(`{"type":"object","properties":{` + strings.Join(props, ",") + `}}`))
	if err == nil || !strings.Contains(err.Error(), "automaton states") && !strings.Contains(err.Error(), "MiB") {
		t.Fatalf("err %v, want too many automaton states or too much memory", err)
	}
}

// TestIntegerRanges checks integer bounds exhaustively around them.
func TestIntegerRanges(t *testing.T) {
	v := byteVocab()
	for _, r := range [][2]int64{{-13, 7}, {0, 150}, {5, 5}, {-1000, -999}, {99, 1001}, {1, maxIntMag}, {-maxIntMag, -10}, {0, 0}} {
		g, err := CompileSchema([]byte(fmt.Sprintf(`{"type":"integer","minimum":%d,"maximum":%d}`, r[0], r[1])))
		if err != nil {
			t.Fatal(err)
		}
		c := New(g, v)
		ok := func(s string) bool {
			m := c.Matcher()
			return m.AcceptBytes([]byte(s)) == nil && m.Complete()
		}
		for x := int64(-2100); x <= 2100; x++ {
			if got, want := ok(fmt.Sprint(x)), r[0] <= x && x <= r[1]; got != want {
				t.Errorf("[%d, %d]: %d accepted %v", r[0], r[1], x, got)
			}
		}
		for _, x := range []int64{r[0], r[1], r[0] - 1, r[1] + 1} {
			if got, want := ok(fmt.Sprint(x)), r[0] <= x && x <= r[1]; got != want {
				t.Errorf("[%d, %d]: %d accepted %v", r[0], r[1], x, got)
			}
		}
		for _, bad := range []string{"-0", "00", "07", "", "-", "1.0", "1e2", "+1"} {
			if ok(bad) {
				t.Errorf("[%d, %d]: %q accepted", r[0], r[1], bad)
			}
		}
	}
}

func TestCompileSchemaBetween(t *testing.T) {
	g, err := CompileSchemaBetween([]byte(`{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}`), "<tool_call>", "</tool_call>")
	if err != nil {
		t.Fatal(err)
	}
	for text, want := range map[string]bool{
		"<tool_call>\n{\"a\": 1}\n</tool_call>": true,
		"<tool_call>{\"a\":1}</tool_call>":      true,
		"{\"a\":1}</tool_call>":                 false,
		"<tool_call>{\"a\":1}":                  false, // incomplete
		"<tool_call>{\"a\":1}</tool_call> ":     false,
	} {
		m := New(g, byteVocab()).Matcher()
		if got := m.AcceptBytes([]byte(text)) == nil && m.Complete(); got != want {
			t.Errorf("%q: %v, want %v", text, got, want)
		}
	}
}
