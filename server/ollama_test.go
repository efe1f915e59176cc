package server

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

func ndjsonLines(t *testing.T, ts interface{ Client() *http.Client }, url, body string) (int, string, []map[string]any) {
	t.Helper()
	resp, err := ts.Client().Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []map[string]any
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		out = append(out, m)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), out
}

func TestOllamaChat(t *testing.T) {
	f := newFake()
	f.script = "hello"
	ts := startServer(t, f, Options{})
	// Streaming by default: one NDJSON line per piece, then the stats.
	code, ct, lines := ndjsonLines(t, ts, ts.URL+"/api/chat",
		`{"model":"fake-model:latest","messages":[{"role":"system","content":"s"},{"role":"user","content":"hi"}],
		  "options":{"num_predict":7,"temperature":0.5,"top_k":3,"top_p":0.9,"seed":4,"stop":["zz"],"num_ctx":64},"keep_alive":"5m"}`)
	if code != 200 || ct != "application/x-ndjson" || len(lines) != 6 {
		t.Fatalf("%d %s %v", code, ct, lines)
	}
	var text strings.Builder
	for _, l := range lines[:5] {
		if l["done"] != false || l["model"] != "fake-model" || l["created_at"] == nil {
			t.Fatalf("chunk %v", l)
		}
		text.WriteString(l["message"].(map[string]any)["content"].(string))
	}
	last := lines[5]
	if text.String() != "hello" || last["done"] != true || last["done_reason"] != "stop" || last["eval_count"] != 5.0 {
		t.Fatalf("%q %v", text.String(), last)
	}
	for _, k := range []string{"total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_duration"} {
		if _, ok := last[k]; !ok {
			t.Errorf("final line lacks %s", k)
		}
	}
	r := f.lastReq(t)
	if r.MaxTokens != 7 || r.Sampling.Temperature != 0.5 || r.Sampling.TopK != 3 || !r.Sampling.HasSeed || r.Sampling.Seed != 4 ||
		len(r.StopStrings) != 1 || r.StopStrings[0] != "zz" {
		t.Fatalf("options not mapped: %+v", r)
	}
	if got := f.Detokenize(r.Prompt); got != "<system>s\n<user>hi\n<assistant>" {
		t.Fatalf("prompt %q", got)
	}
	// stream:false: one object.
	code, b := post(t, ts, "/api/chat", `{"model":"fake-model","stream":false,"messages":[{"role":"user","content":"hi"}]}`)
	m := decode[map[string]any](t, b)
	if code != 200 || m["message"].(map[string]any)["content"] != "hello" || m["done"] != true {
		t.Fatalf("%d %s", code, b)
	}
	// format: json or a schema constrains; a bad one is refused.
	if code, b := post(t, ts, "/api/chat", `{"model":"fake-model","format":42,"messages":[{"role":"user","content":"hi"}]}`); code != 400 ||
		!strings.Contains(string(b), `"error":"format must be`) {
		t.Fatalf("%d %s", code, b)
	}
}

func TestOllamaErrors(t *testing.T) {
	f := newFake()
	ts := startServer(t, f, Options{})
	for _, c := range []struct {
		path, body string
		code       int
		msg        string
	}{
		{"/api/chat", `{"model":"llama3","messages":[{"role":"user","content":"x"}]}`, 404, "model 'llama3' not found"},
		{"/api/chat", `{"messages":[{"role":"user","content":"x"}]}`, 400, "model is required"},
		{"/api/chat", `{"model":"fake-model","messages":[{"role":"wizard","content":"x"}]}`, 400, "role"},
		{"/api/chat", `{"model":"fake-model","options":{"num_predict":0},"messages":[{"role":"user","content":"x"}]}`, 400, "num_predict"},
		{"/api/generate", `{"model":"fake-model","prompt":"x","images":["AAAA"]}`, 400, "text only"},
		{"/api/show", `{"model":"nope"}`, 404, "not found"},
		{"/api/chat", `{"model":`, 400, "malformed"},
	} {
		code, b := post(t, ts, c.path, c.body)
		var e struct {
			Error string `json:"error"`
		}
		if err := json.Unmarshal(b, &e); err != nil || code != c.code || !strings.Contains(e.Error, c.msg) {
			t.Errorf("%s %s: %d %s", c.path, c.body, code, b)
		}
	}
}

func TestOllamaGenerateAndInfo(t *testing.T) {
	f := newFake()
	f.script = "abc"
	ts := startServer(t, f, Options{Version: "9.9"})
	code, b := post(t, ts, "/api/generate", `{"model":"fake-model","prompt":"hi","raw":true,"stream":false}`)
	m := decode[map[string]any](t, b)
	if code != 200 || m["response"] != "abc" || m["done_reason"] != "stop" || len(m["context"].([]any)) != 1+2+3 {
		t.Fatalf("%d %s", code, b)
	}
	if got := f.Detokenize(f.lastReq(t).Prompt); got != "hi" {
		t.Fatalf("raw prompt %q", got)
	}
	// Not raw: the template applies, with the system prompt.
	code, _, lines := ndjsonLines(t, ts, ts.URL+"/api/generate", `{"model":"fake-model","prompt":"hi","system":"be brief"}`)
	if code != 200 || len(lines) != 4 || lines[0]["response"] != "a" || lines[3]["done"] != true {
		t.Fatalf("%d %v", code, lines)
	}
	if got := f.Detokenize(f.lastReq(t).Prompt); got != "<system>be brief\n<user>hi\n<assistant>" {
		t.Fatalf("templated prompt %q", got)
	}
	// An empty prompt loads the model.
	if _, b := post(t, ts, "/api/generate", `{"model":"fake-model"}`); !strings.Contains(string(b), `"done_reason":"load"`) {
		t.Fatalf("load: %s", b)
	}
	for _, p := range []string{"/api/tags", "/api/ps", "/api/version"} {
		resp, b := get(t, ts, p)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d", p, resp.StatusCode)
		}
		if p == "/api/version" && string(b) != `{"version":"9.9"}` {
			t.Fatalf("version %s", b)
		}
		if p != "/api/version" && !strings.Contains(string(b), `"name":"fake-model"`) {
			t.Fatalf("%s: %s", p, b)
		}
	}
	if code, b := post(t, ts, "/api/show", `{"model":"fake-model"}`); code != 200 || !strings.Contains(string(b), `"capabilities":["completion"]`) {
		t.Fatalf("show %d %s", code, b)
	}
}

func TestOllamaTools(t *testing.T) {
	f := newFake()
	f.tmplSrc = "{{ '<tool_call>' }}"
	f.script = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
	ts := startServer(t, f, Options{})
	tools := `[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]`
	for _, stream := range []string{"false", "true"} {
		_, _, lines := ndjsonLines(t, ts, ts.URL+"/api/chat", `{"model":"fake-model","stream":`+stream+`,"tools":`+tools+`,
			"messages":[{"role":"user","content":"weather?"},{"role":"assistant","content":"","tool_calls":[{"function":{"name":"get_weather","arguments":{"city":"Oslo"}}}]},
			{"role":"tool","content":"sunny","tool_name":"get_weather"}]}`)
		last := lines[len(lines)-1]
		msg := last["message"].(map[string]any)
		calls, _ := msg["tool_calls"].([]any)
		if len(calls) != 1 || msg["content"] != "" {
			t.Fatalf("stream %s: %v", stream, lines)
		}
		fn := calls[0].(map[string]any)["function"].(map[string]any)
		if fn["name"] != "get_weather" || fn["arguments"].(map[string]any)["city"] != "Paris" {
			t.Fatalf("call %v", fn)
		}
	}
}
