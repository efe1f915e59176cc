package server

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// TestToolDefinitionsRefused: each of these was accepted before (issue
// 24, finding 3): forced calls whose arguments came back as a string, a
// number as content, a name that broke the call's markup, a retrieval
// tool forced as a function, and tools:["x"] accepted under auto.
func TestToolDefinitionsRefused(t *testing.T) {
	ts := toolServer(t, "{% for m in messages %}{{ m.content }}{% endfor %}{# <tool_call> #}")
	fn := func(name, params string) string {
		return fmt.Sprintf(`{"type":"function","function":{"name":%q,"parameters":%s}}`, name, params)
	}
	for _, c := range []struct{ tools, choice, want string }{
		{fn("f", `{"type":"string"}`), `"required"`, `type must be \"object\"`},
		{fn("f", `true`), `"required"`, "must be a JSON schema object"},
		{fn("f", `{"type":"integer"}`), `"required"`, `type must be \"object\"`},
		{fn("f", `{"type":["object","null"]}`), `"required"`, `type must be \"object\"`},
		{fn("f", `{"anyOf":[{"type":"string"},{"type":"object"}]}`), `"required"`, "needs \\\"type\\\":\\\"object\\\""},
		{fn("f</tool_call>", `{"type":"object"}`), `"required"`, "must match ^[a-zA-Z0-9_-]{1,64}$"},
		{fn(strings.Repeat("a", 65), `{"type":"object"}`), `"auto"`, "must match"},
		{fn("get weather", `{"type":"object"}`), ``, "must match"},
		{`{"type":"retrieval"}`, `"required"`, `type \"retrieval\" is not supported`},
		{`{"type":"retrieval","function":{"name":"f"}}`, `"auto"`, `type \"retrieval\" is not supported`},
		{`"x"`, `"auto"`, "must be {"},
		{`"x"`, `"required"`, "must be {"},
		{`"x"`, ``, "must be {"},
		{fn("f", `{}`) + "," + fn("f", `{}`), ``, "defined twice"},
		{fn("f", `[1]`), ``, "must be a JSON schema object"},
	} {
		body := `{"messages":[{"role":"user","content":"Hi"}],"max_tokens":8,"tools":[` + c.tools + `]`
		if c.choice != "" {
			body += `,"tool_choice":` + c.choice
		}
		code, b := post(t, ts, "/v1/chat/completions", body+`}`)
		if code != 400 || !strings.Contains(string(b), c.want) || !strings.Contains(string(b), `"param":"tools"`) {
			t.Errorf("tools %s, tool_choice %s: %d %s, want 400 with %q", c.tools, c.choice, code, b, c.want)
		}
	}
	// A forced call with parameters without a type: always an object.
	for _, params := range []string{`{"properties":{"a":{"type":"integer"}},"required":["a"]}`, `{}`, `null`} {
		code, b := post(t, ts, "/v1/chat/completions", `{"messages":[{"role":"user","content":"Hi"}],"max_tokens":60,"seed":1,"tool_choice":"required","tools":[`+fn("f", params)+`]}`)
		if code != 200 {
			t.Fatalf("%s: %d %s", params, code, b)
		}
		var r struct {
			Choices []struct {
				FinishReason string `json:"finish_reason"`
				Message      struct {
					ToolCalls []toolCallOut `json:"tool_calls"`
				} `json:"message"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatal(err)
		}
		ch := r.Choices[0]
		if ch.FinishReason == "length" {
			continue // a story model may ramble in a free object until cut
		}
		if ch.FinishReason != "tool_calls" || len(ch.Message.ToolCalls) != 1 {
			t.Fatalf("%s: %s", params, b)
		}
		var args map[string]any
		if err := json.Unmarshal([]byte(ch.Message.ToolCalls[0].Function.Arguments), &args); err != nil {
			t.Errorf("%s: arguments %q are not an object: %v", params, ch.Message.ToolCalls[0].Function.Arguments, err)
		}
	}
}

// FuzzToolDefs: tool definitions never panic the checks; what they accept
// has a valid name and, when forced, arguments of type object.
func FuzzToolDefs(f *testing.F) {
	for _, s := range []string{
		`{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}`,
		`{"type":"function","function":{"name":"f","parameters":{"type":"string"}}}`,
		`{"type":"function","function":{"name":"a-b_9","parameters":{"properties":{"x":{}}}}}`,
		`{"type":"function","function":{"name":"f","parameters":true}}`,
		`{"type":"retrieval"}`, `"x"`, `{"type":"function","function":{"name":"</tool_call>"}}`,
		`{"type":"function","function":{"name":"f","parameters":{"type":["object"]}}}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		defs, ae := checkTools([]json.RawMessage{json.RawMessage(raw)})
		if ae != nil {
			return
		}
		d := defs[0]
		if !validToolName(d.Function.Name) || d.Type != "function" {
			t.Fatalf("accepted %q", raw)
		}
		s, ae := argumentsSchema(d.Function.Name, d.Function.Parameters)
		if ae != nil {
			return
		}
		var top map[string]json.RawMessage
		if err := json.Unmarshal([]byte(s), &top); err != nil {
			t.Fatalf("arguments schema %q of %q: %v", s, raw, err)
		}
		var typ any
		if json.Unmarshal(top["type"], &typ) != nil || fmt.Sprint(typ) != "object" && fmt.Sprint(typ) != "[object]" {
			t.Fatalf("arguments schema %q of %q has type %s", s, raw, top["type"])
		}
	})
}
