package server

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

type namedEvent struct {
	name string
	data map[string]any
}

func anthropicStream(t *testing.T, url, body string, hdr ...string) []namedEvent {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var out []namedEvent
	sc := bufio.NewScanner(resp.Body)
	var name string
	for sc.Scan() {
		line := sc.Text()
		if n, ok := strings.CutPrefix(line, "event: "); ok {
			name = n
		} else if d, ok := strings.CutPrefix(line, "data: "); ok {
			var m map[string]any
			if err := json.Unmarshal([]byte(d), &m); err != nil {
				t.Fatal(err)
			}
			if m["type"] != name {
				t.Fatalf("event %s carries type %v", name, m["type"])
			}
			out = append(out, namedEvent{name, m})
		}
	}
	return out
}

func eventNames(evs []namedEvent) string {
	var n []string
	for _, e := range evs {
		n = append(n, e.name)
	}
	return strings.Join(n, ",")
}

func TestAnthropicMessages(t *testing.T) {
	f := newFake()
	f.script = "hello"
	f.ctxLen = 512
	ts := startServer(t, f, Options{APIKey: "k"})
	body := `{"model":"fake-model","max_tokens":9,"system":[{"type":"text","text":"s1"},{"type":"text","text":"s2"}],"stop_sequences":["q"],
		"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"text","text":"yo"}]},{"role":"user","content":"again"}]}`
	code, b := post(t, ts, "/v1/messages", body, "x-api-key", "k", "anthropic-version", "2023-06-01")
	var r anthropicResponse
	if err := json.Unmarshal(b, &r); err != nil || code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	if r.Type != "message" || r.Role != "assistant" || len(r.Content) != 1 || *r.Content[0].Text != "hello" ||
		*r.StopReason != "end_turn" || r.StopSequence != nil || r.Usage.OutputTokens != 5 || !strings.HasPrefix(r.ID, "msg_") {
		t.Fatalf("%s", b)
	}
	req := f.lastReq(t)
	if got := f.Detokenize(req.Prompt); got != "<system>s1\ns2\n<user>hi\n<assistant>yo\n<user>again\n<assistant>" {
		t.Fatalf("prompt %q", got)
	}
	if req.MaxTokens != 9 || len(req.StopStrings) != 1 || req.StopStrings[0] != "q" {
		t.Fatalf("request %+v", req)
	}
	// The key as Bearer works too; none gets Anthropic's 401.
	if code, _ := post(t, ts, "/v1/messages", body, "Authorization", "Bearer k"); code != 200 {
		t.Fatal(code)
	}
	code, b = post(t, ts, "/v1/messages", body)
	if code != 401 || !strings.Contains(string(b), `"type":"authentication_error"`) || !strings.Contains(string(b), `"type":"error"`) {
		t.Fatalf("%d %s", code, b)
	}
	// Streaming, in Anthropic's order.
	evs := anthropicStream(t, ts.URL+"/v1/messages", strings.Replace(body, `"max_tokens":9`, `"max_tokens":9,"stream":true`, 1), "x-api-key", "k")
	want := "message_start,content_block_start,ping" + strings.Repeat(",content_block_delta", 5) + ",content_block_stop,message_delta,message_stop"
	if got := eventNames(evs); got != want {
		t.Fatalf("events %s", got)
	}
	var text strings.Builder
	for _, e := range evs {
		if e.name == "content_block_delta" {
			text.WriteString(e.data["delta"].(map[string]any)["text"].(string))
		}
	}
	md := evs[len(evs)-2].data
	if text.String() != "hello" || md["delta"].(map[string]any)["stop_reason"] != "end_turn" || md["usage"].(map[string]any)["output_tokens"] != 5.0 {
		t.Fatalf("%q %v", text.String(), md)
	}
}

func TestAnthropicStopSequence(t *testing.T) {
	f := newFake()
	f.stopAt = "c" // the fake stops when it reaches "c", as a stop string would
	ts := startServer(t, f, Options{})
	code, b := post(t, ts, "/v1/messages", `{"model":"fake-model","max_tokens":20,"stop_sequences":["c"],"messages":[{"role":"user","content":"x"}]}`)
	if code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	var r anthropicResponse
	_ = json.Unmarshal(b, &r)
	if *r.StopReason != "stop_sequence" || r.StopSequence == nil || *r.StopSequence != "c" {
		t.Fatalf("%s", b)
	}
	code, b = post(t, ts, "/v1/messages", `{"model":"fake-model","max_tokens":2,"messages":[{"role":"user","content":"x"}]}`)
	if _ = json.Unmarshal(b, &r); code != 200 || *r.StopReason != "max_tokens" {
		t.Fatalf("%d %s", code, b)
	}
}

func TestAnthropicTools(t *testing.T) {
	f := newFake()
	f.tmplSrc = "{{ '<tool_call>' }}"
	f.ctxLen = 1024
	f.script = "Sure.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
	ts := startServer(t, f, Options{})
	body := `{"model":"fake-model","max_tokens":100,"tools":[{"name":"get_weather","description":"d","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}],
		"tool_choice":{"type":"auto"},
		"messages":[{"role":"user","content":"weather?"},
		  {"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Oslo"}}]},
		  {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"sunny"},{"type":"text","text":"and Paris?"}]}]}`
	code, b := post(t, ts, "/v1/messages", body)
	var r anthropicResponse
	if err := json.Unmarshal(b, &r); err != nil || code != 200 || len(r.Content) != 2 || r.Content[1].Type != "tool_use" ||
		r.Content[1].Name != "get_weather" || string(r.Content[1].Input) != `{"city": "Paris"}` && string(r.Content[1].Input) != `{"city":"Paris"}` ||
		*r.StopReason != "tool_use" || *r.Content[0].Text != "Sure." {
		t.Fatalf("%d %s", code, b)
	}
	got := f.Detokenize(f.lastReq(t).Prompt)
	if !strings.Contains(got, "<tool>sunny\n<user>and Paris?") || !strings.Contains(got, "[tools:1]") {
		t.Fatalf("prompt %q", got)
	}
	evs := anthropicStream(t, ts.URL+"/v1/messages", strings.Replace(body, `"max_tokens":100`, `"max_tokens":100,"stream":true`, 1))
	names := eventNames(evs)
	if !strings.HasPrefix(names, "message_start,content_block_start,ping,content_block_delta") ||
		!strings.HasSuffix(names, "content_block_stop,content_block_start,content_block_delta,content_block_stop,message_delta,message_stop") {
		t.Fatalf("events %s", names)
	}
	tu := evs[len(evs)-5].data["content_block"].(map[string]any)
	pj := evs[len(evs)-4].data["delta"].(map[string]any)
	if tu["type"] != "tool_use" || tu["name"] != "get_weather" || pj["type"] != "input_json_delta" || !strings.Contains(pj["partial_json"].(string), "Paris") {
		t.Fatalf("%v %v", tu, pj)
	}
	// tool_choice none drops the tools; any/tool force a call (a Hermes template here).
	if code, b := post(t, ts, "/v1/messages", strings.Replace(body, `{"type":"auto"}`, `{"type":"none"}`, 1)); code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	if strings.Contains(f.Detokenize(f.lastReq(t).Prompt), "[tools:") {
		t.Fatal("tool_choice none still rendered the tools")
	}
	if code, b := post(t, ts, "/v1/messages", strings.Replace(body, `{"type":"auto"}`, `{"type":"bogus"}`, 1)); code != 400 || !strings.Contains(string(b), "invalid_request_error") {
		t.Fatalf("%d %s", code, b)
	}
}

func TestAnthropicErrorsAndCount(t *testing.T) {
	f := newFake()
	ts := startServer(t, f, Options{})
	for _, c := range []struct {
		body string
		code int
		typ  string
	}{
		{`{"model":"fake-model","messages":[{"role":"user","content":"x"}]}`, 400, "invalid_request_error"},
		{`{"model":"claude-3","max_tokens":5,"messages":[{"role":"user","content":"x"}]}`, 404, "not_found_error"},
		{`{"model":"fake-model","max_tokens":5,"messages":[]}`, 400, "invalid_request_error"},
		{`{"model":"fake-model","max_tokens":5,"messages":[{"role":"system","content":"x"}]}`, 400, "invalid_request_error"},
		{`{"model":"fake-model","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]}`, 400, "invalid_request_error"},
		{`{"model":"fake-model","max_tokens":5,"messages":[{"role":"user","content":"x"}],"temperature":1.5}`, 400, "invalid_request_error"},
		{`{"model":"fake-model","max_tokens":5,"messages":[{"role":"user","content":"` + strings.Repeat("y", 80) + `"}]}`, 400, "invalid_request_error"},
	} {
		code, b := post(t, ts, "/v1/messages", c.body)
		var e struct {
			Type  string `json:"type"`
			Error struct {
				Type    string `json:"type"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(b, &e); err != nil || code != c.code || e.Type != "error" || e.Error.Type != c.typ || e.Error.Message == "" {
			t.Errorf("%s: %d %s", c.body, code, b)
		}
	}
	code, b := post(t, ts, "/v1/messages/count_tokens", `{"model":"fake-model","system":"ab","messages":[{"role":"user","content":"hi"}]}`)
	// The fake's template: "<system>ab\n<user>hi\n<assistant>", a token a byte (no BOS).
	if code != 200 || string(b) != `{"input_tokens":31}` {
		t.Fatalf("%d %s", code, b)
	}
}
