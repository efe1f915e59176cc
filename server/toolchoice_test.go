package server

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"pagoda/embedded"
)

// toolServer serves the embedded stories260K with a chat template that
// teaches tool syntax tmpl (a story model knows no tools: only constrained
// decoding can make it call one).
func toolServer(t *testing.T, tmpl string) *httptest.Server {
	t.Helper()
	path, err := embedded.Path(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m, eng := storiesEngine(t, path, nil)
	be, err := NewEngineBackend(eng, m.Tokenizer(), "stories260K", m.Config.ContextLen, tmpl)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(New(be, Options{}).Handler())
	t.Cleanup(ts.Close)
	return ts
}

const toolsJSON = `"tools":[
	{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string","maxLength":10}},"required":["city"]}}},
	{"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{"tz":{"enum":["CET","UTC"]}},"required":["tz"]}}}]`

// TestToolChoiceForced: tool_choice "required" and a named function make
// the reply a valid call (Hermes and Llama 3 syntax), streamed and not.
func TestToolChoiceForced(t *testing.T) {
	for name, tmpl := range map[string]string{
		"hermes": "{% for m in messages %}{{ m.content }}{% endfor %}{# <tool_call> #}",
		"llama":  `{# <|start_header_id|> "parameters" #}{% for m in messages %}{{ m.content }}{% endfor %}`,
	} {
		t.Run(name, func(t *testing.T) {
			ts := toolServer(t, tmpl)
			checkCall := func(fn, args, want string) {
				t.Helper()
				var a map[string]any
				if err := json.Unmarshal([]byte(args), &a); err != nil {
					t.Fatalf("arguments %q: %v", args, err)
				}
				switch fn {
				case "get_weather":
					c, ok := a["city"].(string)
					if len(a) != 1 || !ok || len([]rune(c)) > 10 {
						t.Errorf("get_weather arguments %q", args)
					}
				case "get_time":
					if len(a) != 1 || (a["tz"] != "CET" && a["tz"] != "UTC") {
						t.Errorf("get_time arguments %q", args)
					}
				default:
					t.Errorf("called %q", fn)
				}
				if want != "" && fn != want {
					t.Errorf("called %q, want %q", fn, want)
				}
			}
			for _, tc := range []struct{ choice, want string }{
				{`"required"`, ""},
				{`{"type":"function","function":{"name":"get_time"}}`, "get_time"},
			} {
				body := `{"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":200,"n":3,"seed":1,"tool_choice":` + tc.choice + `,` + toolsJSON + `}`
				code, b := post(t, ts, "/v1/chat/completions", body)
				if code != 200 {
					t.Fatalf("%d %s", code, b)
				}
				r := decode[toolReply](t, b)
				for _, ch := range r.Choices {
					if ch.FinishReason != "tool_calls" || len(ch.Message.ToolCalls) != 1 {
						t.Fatalf("%s: not one call: %s", tc.choice, b)
					}
					checkCall(ch.Message.ToolCalls[0].Function.Name, ch.Message.ToolCalls[0].Function.Arguments, tc.want)
				}
			}
			events := postStream(t, ts, "/v1/chat/completions", `{"messages":[{"role":"user","content":"Hi"}],"max_tokens":200,"seed":3,"stream":true,`+
				`"tool_choice":{"type":"function","function":{"name":"get_weather"}},`+toolsJSON+`}`)
			var fn, args, finish string
			for _, e := range events {
				if e == "[DONE]" {
					continue
				}
				for _, ch := range decode[toolChunk](t, []byte(e)).Choices {
					for _, d := range ch.Delta.ToolCalls {
						fn += d.Function.Name
						args += d.Function.Arguments
					}
					if ch.FinishReason != nil {
						finish = *ch.FinishReason
					}
				}
			}
			if finish != "tool_calls" {
				t.Errorf("stream finish %q", finish)
			}
			checkCall(fn, args, "get_weather")
		})
	}
}

func TestToolChoiceErrors(t *testing.T) {
	ts := toolServer(t, "{% for m in messages %}{{ m.content }}{% endfor %}{# <tool_call> #}")
	msgs := `"messages":[{"role":"user","content":"x"}]`
	cases := []struct{ body, param, want string }{
		{`"tool_choice":"required"`, "tool_choice", "needs tools"},
		{`"tool_choice":{"type":"function","function":{"name":"nope"}},` + toolsJSON, "tool_choice", "not among the tools"},
		{`"tool_choice":"sometimes",` + toolsJSON, "tool_choice", "not supported"},
		{`"tool_choice":"required","response_format":{"type":"json_object"},` + toolsJSON, "tool_choice", "response_format"},
		{`"tool_choice":"required","tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"s":{"type":"string","pattern":"a"}}}}}]`, "tools", "pattern"},
	}
	for _, tc := range cases {
		code, b := post(t, ts, "/v1/chat/completions", `{`+msgs+`,`+tc.body+`}`)
		e := decode[errBody](t, b)
		if code != 400 || e.Error.Param == nil || *e.Error.Param != tc.param || !strings.Contains(e.Error.Message, tc.want) {
			t.Errorf("%s: %d %s, want 400 %s mentioning %q", tc.body, code, b, tc.param, tc.want)
		}
	}
	// A template with another tool syntax cannot be forced.
	ts2 := toolServer(t, "{% for m in messages %}{{ m.content }}{% endfor %}{# [TOOL_CALLS] #}")
	code, b := post(t, ts2, "/v1/chat/completions", `{`+msgs+`,"tool_choice":"required",`+toolsJSON+`}`)
	if code != 400 || !strings.Contains(string(b), "Hermes") {
		t.Errorf("mistral template: %d %s", code, b)
	}
}
