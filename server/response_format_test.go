package server

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"pagoda/embedded"
	"pagoda/grammar"
)

// storiesServer serves the embedded stories260K with a plain chat template
// (the model has none) so chat requests work too.
func storiesServer(t *testing.T) *httptest.Server {
	t.Helper()
	path, err := embedded.Path(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m, eng := storiesEngine(t, path, nil)
	be, err := NewEngineBackend(eng, m.Tokenizer(), "stories260K", m.Config.ContextLen,
		"{% for m in messages %}{{ m.content }} {% endfor %}")
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(New(be, Options{}).Handler())
	t.Cleanup(ts.Close)
	return ts
}

// TestResponseFormatStories: json_object and json_schema through both
// endpoints on the real model, n > 1 (each completion its own matcher),
// streaming and not; every choice ends on its own and parses.
func TestResponseFormatStories(t *testing.T) {
	ts := storiesServer(t)
	schema := `{"type":"object","properties":{"name":{"type":"string","maxLength":10},"age":{"type":"integer"},` +
		`"pet":{"enum":["cat","dog"]}},"required":["name","age","pet"],"additionalProperties":false}`
	type person struct {
		Name string
		Age  int
		Pet  string
	}
	objDone := 0
	check := func(text, finish string, obj bool) {
		t.Helper()
		if obj && finish == "length" {
			// A story model rarely closes a free string: a cut document
			// must still be a valid start of one.
			m := grammar.New(grammar.JSONObject(), grammar.NewVocabBytes(nil, nil)).Matcher()
			if err := m.AcceptBytes([]byte(text)); err != nil {
				t.Errorf("%q is not the start of a JSON object: %v", text, err)
			}
			return
		}
		if finish != "stop" {
			t.Errorf("finish %q: %q", finish, text)
			return
		}
		if obj {
			objDone++
			var v map[string]any
			if err := json.Unmarshal([]byte(text), &v); err != nil {
				t.Errorf("%q: %v", text, err)
			}
			return
		}
		var p person
		d := json.NewDecoder(strings.NewReader(text))
		d.DisallowUnknownFields()
		if err := d.Decode(&p); err != nil || (p.Pet != "cat" && p.Pet != "dog") || len([]rune(p.Name)) > 10 {
			t.Errorf("%q: %+v %v", text, p, err)
		}
	}
	rfSchema := `"response_format":{"type":"json_schema","json_schema":{"name":"p","strict":true,"schema":` + schema + `}}`
	rfObject := `"response_format":{"type":"json_object"}`
	for _, rf := range []string{rfSchema, rfObject} {
		obj := rf == rfObject
		maxTok := "300"
		if obj {
			maxTok = "100" // it only checks a prefix
		}
		code, b := post(t, ts, "/v1/completions", `{"prompt":"Once upon a time","max_tokens":`+maxTok+`,"n":4,"seed":1,`+rf+`}`)
		if code != 200 {
			t.Fatalf("%d %s", code, b)
		}
		for _, ch := range decode[complResp](t, b).Choices {
			check(ch.Text, *ch.FinishReason, obj)
		}
		code, b = post(t, ts, "/v1/chat/completions", `{"messages":[{"role":"user","content":"Tell me about Lily."}],"max_tokens":`+maxTok+`,"n":2,"seed":2,`+rf+`}`)
		if code != 200 {
			t.Fatalf("%d %s", code, b)
		}
		for _, ch := range decode[complResp](t, b).Choices {
			check(ch.Message.Content, *ch.FinishReason, obj)
		}
	}
	t.Logf("%d json_object completions ended on their own", objDone)
	// Streaming: the deltas join into a valid document.
	events := postStream(t, ts, "/v1/chat/completions", `{"messages":[{"role":"user","content":"Hi"}],"max_tokens":300,"seed":3,"stream":true,`+rfSchema+`}`)
	var text, finish string
	for _, e := range events {
		if e == "[DONE]" {
			continue
		}
		for _, ch := range decode[complResp](t, []byte(e)).Choices {
			if ch.Delta != nil && ch.Delta.Content != nil {
				text += *ch.Delta.Content
			}
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
	}
	check(text, finish, false)
}

// TestResponseFormatErrors: bad formats and unsupported schema keywords
// are 400s naming response_format and the keyword.
func TestResponseFormatErrors(t *testing.T) {
	ts := storiesServer(t)
	cases := []struct{ rf, want string }{
		{`{"type":"xml"}`, `"xml" is not supported`},
		{`{"type":"json_schema"}`, "json_schema"},
		{`{"type":"json_schema","json_schema":{"name":"x"}}`, "schema is required"},
		{`{"type":"json_schema","json_schema":{"schema":{"type":"string","pattern":"a+"}}}`, "pattern"},
		{`{"type":"json_schema","json_schema":{"schema":{"type":"object","properties":{"d":{"type":"string","format":"date"}}}}}`, "format at #/properties/d"},
		{`{"type":"json_schema","json_schema":{"schema":{"type":"number","maximum":3}}}`, "maximum"},
		{`{"type":"json_schema","json_schema":{"schema":{"$ref":"#/$defs/nope"}}}`, "does not resolve"},
	}
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		for _, tc := range cases {
			body := `{"prompt":"x","messages":[{"role":"user","content":"x"}],"response_format":` + tc.rf + `}`
			code, b := post(t, ts, path, body)
			e := decode[errBody](t, b)
			if code != 400 || e.Error.Param == nil || *e.Error.Param != "response_format" || !strings.Contains(e.Error.Message, tc.want) {
				t.Errorf("%s %s: %d %s, want 400 mentioning %q", path, tc.rf, code, b, tc.want)
			}
		}
	}
}
