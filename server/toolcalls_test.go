package server

import (
	"encoding/json"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"pagoda/engine"
)

func TestDetectToolFormat(t *testing.T) {
	for src, want := range map[string]toolFormat{
		`{{- '<tool_call>\n{"name": "' }}`:                                          toolHermes,
		`{{ '[TOOL_CALLS]' + tool_calls|tojson }}`:                                  toolMistral,
		`{{- '<|python_tag|>' + tool_call.name }}`:                                  toolLlama,
		`<|start_header_id|>{{ '{"name": "' }}..."parameters": {{ args | tojson }}`: toolLlama,
		`<|im_start|>{{ message.content }}`:                                         toolNone,
	} {
		if got := detectToolFormat(src); got != want {
			t.Errorf("%q: got %d, want %d", src, got, want)
		}
	}
}

func TestSplitToolCalls(t *testing.T) {
	type tc = toolCall
	cases := []struct {
		name    string
		f       toolFormat
		text    string
		content string
		calls   []toolCall
	}{
		{"hermes one", toolHermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>",
			"", []tc{{"get_weather", `{"city":"Paris","unit":"c"}`}}},
		{"hermes two with text", toolHermes, "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>",
			"Let me check.", []tc{{"a", `{"x":1}`}, {"b", `{}`}}},
		{"hermes unclosed at EOS", toolHermes, "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": [1, 2]}}",
			"", []tc{{"a", `{"x":[1,2]}`}}},
		{"hermes malformed", toolHermes, "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": }\n</tool_call>",
			"<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": }\n</tool_call>", nil},
		{"hermes no call", toolHermes, "Just prose.", "Just prose.", nil},
		{"llama bare", toolLlama, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}",
			"", []tc{{"get_weather", `{"city":"Oslo"}`}}},
		{"llama python tag", toolLlama, "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}",
			"", []tc{{"f", `{}`}}},
		{"llama two", toolLlama, "{\"name\": \"f\", \"parameters\": {\"a\": 1}}; {\"name\": \"g\", \"parameters\": {\"b\": 2}}",
			"", []tc{{"f", `{"a":1}`}, {"g", `{"b":2}`}}},
		{"llama prose with braces", toolLlama, "Use {x} here.", "Use {x} here.", nil},
		{"llama malformed", toolLlama, "{\"name\": \"f\", \"parameters\": {", "{\"name\": \"f\", \"parameters\": {", nil},
		{"mistral list", toolMistral, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": \"b\"}}, {\"name\": \"g\", \"arguments\": {}}]",
			"", []tc{{"f", `{"a":"b"}`}, {"g", `{}`}}},
		{"mistral text before", toolMistral, "Sure. [TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}]", "Sure.", []tc{{"f", `{}`}}},
		{"mistral args form", toolMistral, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Rome\"}[TOOL_CALLS]now[ARGS]{}",
			"", []tc{{"get_weather", `{"city":"Rome"}`}, {"now", `{}`}}},
		{"mistral malformed", toolMistral, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {]", "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {]", nil},
		{"none format", toolNone, "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>", "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>", nil},
	}
	for _, c := range cases {
		content, calls := splitToolCalls(c.f, c.text)
		if content != c.content || !reflect.DeepEqual(calls, c.calls) {
			t.Errorf("%s: got %q %+v, want %q %+v", c.name, content, calls, c.content, c.calls)
		}
	}
}

// TestToolTextStreaming feeds replies a byte at a time and checks what
// goes out as content before the finish and what is parsed at it.
func TestToolTextStreaming(t *testing.T) {
	cases := []struct {
		f           toolFormat
		text        string
		early, late string // content before the finish event, and with it
		calls       int
	}{
		{toolHermes, "Hi <tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>", "Hi ", "", 1},
		{toolHermes, "a <tool_cal", "a ", "<tool_cal", 0},
		{toolHermes, "x <tool_call>{bad}</tool_call>", "x ", "<tool_call>{bad}</tool_call>", 0},
		{toolLlama, "  {\"name\": \"f\", \"parameters\": {}}", "", "", 1},
		{toolLlama, "  Hello {x}", "  Hello {x", "}", 0},
		{toolMistral, "ok [TOOL_CALLS]f[ARGS]{}", "ok ", "", 1},
	}
	for _, c := range cases {
		run := &chatRun{tools: c.f}
		var held strings.Builder
		sent := 0
		var early, late string
		var calls []toolCall
		for k := 0; k < len(c.text); k++ {
			fin := engine.FinishNone
			if k == len(c.text)-1 {
				fin = engine.FinishStop
			}
			out, cs := run.toolText(&held, &sent, c.text[k:k+1], fin)
			if fin == engine.FinishNone {
				early += out
			} else {
				late, calls = out, cs
			}
		}
		if early != c.early || late != c.late || len(calls) != c.calls {
			t.Errorf("%q: early %q late %q calls %d; want %q %q %d", c.text, early, late, len(calls), c.early, c.late, c.calls)
		}
	}
}

const qwenToolReply = "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n" +
	"<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n</tool_call>"

const toolRequest = `{"model":"fake-model","messages":[{"role":"user","content":"weather?"},
	{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}]},
	{"role":"tool","tool_call_id":"call_1","content":"42"}],
	"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]`

var callIDRe = regexp.MustCompile(`"call_[0-9a-f]{24}"`)

func TestChatToolCalls(t *testing.T) {
	f := newFake()
	f.ctxLen = 1024
	f.script = qwenToolReply
	f.tmplSrc = `{%- for tool_call in message.tool_calls %}{{- '<tool_call>\n' }}{%- endfor %}`
	ts := startServer(t, f, Options{})

	code, b := post(t, ts, "/v1/chat/completions", toolRequest+`}`)
	if code != 200 {
		t.Fatalf("status %d: %s", code, b)
	}
	resp := decode[struct{ Choices []json.RawMessage }](t, b)
	got := callIDRe.ReplaceAllString(string(resp.Choices[0]), `"ID"`)
	want := `{"index":0,"message":{"role":"assistant","content":"Checking.","refusal":null,"tool_calls":[` +
		`{"id":"ID","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},` +
		`{"id":"ID","type":"function","function":{"name":"get_time","arguments":"{\"tz\":\"CET\"}"}}]},"logprobs":null,"finish_reason":"tool_calls"}`
	if got != want {
		t.Errorf("message\n got %s\nwant %s", got, want)
	}

	// tool_choice "none": the reply stays text.
	code, b = post(t, ts, "/v1/chat/completions", toolRequest+`,"tool_choice":"none"}`)
	if code != 200 || !strings.Contains(string(b), `"content":`+mustJSON(qwenToolReply)) || strings.Contains(string(b), "tool_calls") {
		t.Errorf("tool_choice none: %d %s", code, b)
	}

	evs := postStream(t, ts, "/v1/chat/completions", toolRequest+`,"stream":true}`)
	var content strings.Builder
	var tail []string
	for _, e := range evs[:len(evs)-1] {
		var ch struct{ Choices []json.RawMessage }
		if err := json.Unmarshal([]byte(e), &ch); err != nil {
			t.Fatal(err)
		}
		c := callIDRe.ReplaceAllString(string(ch.Choices[0]), `"ID"`)
		var d struct {
			Delta struct{ Content *string }
		}
		_ = json.Unmarshal([]byte(c), &d)
		if d.Delta.Content != nil && !strings.Contains(c, "tool_calls") && !strings.Contains(c, `"finish_reason":"`) {
			content.WriteString(*d.Delta.Content)
			continue
		}
		tail = append(tail, c)
	}
	if content.String() != "Checking.\n" {
		t.Errorf("streamed content %q", content.String())
	}
	wantTail := []string{
		`{"index":0,"delta":{"tool_calls":[{"index":0,"id":"ID","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},"logprobs":null,"finish_reason":null}`,
		`{"index":0,"delta":{"tool_calls":[{"index":1,"id":"ID","type":"function","function":{"name":"get_time","arguments":"{\"tz\":\"CET\"}"}}]},"logprobs":null,"finish_reason":null}`,
		`{"index":0,"delta":{},"logprobs":null,"finish_reason":"tool_calls"}`,
	}
	if !reflect.DeepEqual(tail, wantTail) {
		t.Errorf("stream tail\n got %s\nwant %s", strings.Join(tail, "\n"), strings.Join(wantTail, "\n"))
	}
	if evs[len(evs)-1] != "[DONE]" {
		t.Errorf("last event %q", evs[len(evs)-1])
	}
}

// TestChatToolCallsMalformed checks that a call that does not parse comes
// back whole as content, streamed and not.
func TestChatToolCallsMalformed(t *testing.T) {
	f := newFake()
	f.ctxLen = 1024
	f.script = "Hi <tool_call>{\"name\": }</tool_call>"
	f.tmplSrc = "<tool_call>"
	ts := startServer(t, f, Options{})
	code, b := post(t, ts, "/v1/chat/completions", toolRequest+`}`)
	if code != 200 || !strings.Contains(string(b), `"content":`+mustJSON(f.script)+`,"refusal":null},"logprobs":null,"finish_reason":"stop"`) {
		t.Errorf("%d %s", code, b)
	}
	evs := postStream(t, ts, "/v1/chat/completions", toolRequest+`,"stream":true}`)
	var text strings.Builder
	for _, e := range evs[1 : len(evs)-1] {
		var ch chatChunk
		if err := json.Unmarshal([]byte(e), &ch); err != nil {
			t.Fatal(err)
		}
		if d := ch.Choices[0].Delta; d.Content != nil {
			text.WriteString(*d.Content)
		}
		if len(ch.Choices[0].Delta.ToolCalls) > 0 {
			t.Errorf("tool call in %s", e)
		}
	}
	if text.String() != f.script {
		t.Errorf("streamed %q", text.String())
	}
}

// mustJSON quotes s as the server does, without HTML escapes.
func mustJSON(s string) string {
	var b strings.Builder
	e := json.NewEncoder(&b)
	e.SetEscapeHTML(false)
	_ = e.Encode(s)
	return strings.TrimSuffix(b.String(), "\n")
}
