package server

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"pagoda/grammar"
)

// openaiNode finds node and the openai package, or skips the test. It
// needs an installed "openai" package: set PAGODA_OPENAI_NODE_MODULES to
// its node_modules folder (default /tmp/oaiclient/node_modules, made by
// `npm install openai` there).
func openaiNode(t *testing.T) (node, mods string) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not installed")
	}
	mods = os.Getenv("PAGODA_OPENAI_NODE_MODULES")
	if mods == "" {
		mods = "/tmp/oaiclient/node_modules"
	}
	if _, err := os.Stat(filepath.Join(mods, "openai", "package.json")); err != nil {
		t.Skipf("openai-node not found in %s (npm install openai there, or set PAGODA_OPENAI_NODE_MODULES)", mods)
	}
	return node, mods
}

// runNodeScript runs a testdata script against ts and returns its stdout.
func runNodeScript(t *testing.T, ts, name string) []byte {
	t.Helper()
	node, mods := openaiNode(t)
	script, err := filepath.Abs("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script, ts+"/v1", "test-key")
	cmd.Env = append(os.Environ(), "NODE_PATH="+mods)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node client: %v\n%s", err, out)
	}
	return out
}

// TestOpenAINodeClient runs the official openai-node client against the
// server (see openaiNode).
func TestOpenAINodeClient(t *testing.T) {
	openaiNode(t)
	f := newFake()
	ts := startServer(t, f, Options{APIKey: "test-key"})
	out := runNodeScript(t, ts.URL, "openai_client.js")
	var got struct {
		Version string
		Models  []string
		Chat    struct {
			ID, Content, Role, Finish string
			Usage                     struct{ Prompt_tokens, Completion_tokens, Total_tokens int }
			Lp                        [][2]any
		}
		ChatStream struct {
			Texts  []string
			Finish []string
			Usage  struct{ Completion_tokens int }
			Chunks int
		}
		Completion struct {
			Texts  []string
			Object string
			Usage  struct{ Prompt_tokens, Completion_tokens int }
		}
		CompletionStream struct{ Text, Finish string }
		BadRequest       struct {
			Status      int
			Param, Type string
		}
		BadKey struct {
			Status int
			Code   string
		}
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	t.Logf("openai-node %s", got.Version)
	if !reflect.DeepEqual(got.Models, []string{"fake-model"}) {
		t.Errorf("models %v", got.Models)
	}
	c := got.Chat
	if c.Content != "abc" || c.Role != "assistant" || c.Finish != "length" || c.Usage.Completion_tokens != 3 ||
		c.Usage.Total_tokens != c.Usage.Prompt_tokens+3 || len(c.Lp) != 3 || c.Lp[0][0] != "a" || c.Lp[0][1] != -0.5 {
		t.Errorf("chat: %+v", c)
	}
	cs := got.ChatStream
	if !reflect.DeepEqual(cs.Texts, []string{"abcd", "bcde"}) || !reflect.DeepEqual(cs.Finish, []string{"length", "length"}) ||
		cs.Usage.Completion_tokens != 8 {
		t.Errorf("chat stream: %+v", cs)
	}
	if !reflect.DeepEqual(got.Completion.Texts, []string{"abab", "cdab"}) || got.Completion.Object != "text_completion" ||
		got.Completion.Usage.Prompt_tokens != 6 || got.Completion.Usage.Completion_tokens != 4 {
		t.Errorf("completion: %+v", got.Completion)
	}
	if got.CompletionStream.Text != "abc" || got.CompletionStream.Finish != "length" {
		t.Errorf("completion stream: %+v", got.CompletionStream)
	}
	if got.BadRequest.Status != 400 || got.BadRequest.Param != "temperature" || got.BadRequest.Type != "invalid_request_error" {
		t.Errorf("bad request: %+v", got.BadRequest)
	}
	if got.BadKey.Status != 401 || got.BadKey.Code != "invalid_api_key" {
		t.Errorf("bad key: %+v", got.BadKey)
	}
}

// TestOpenAINodeToolCalls checks that openai-node reads parsed tool calls,
// streamed and not, and can send them back with their results.
func TestOpenAINodeToolCalls(t *testing.T) {
	openaiNode(t)
	f := newFake()
	f.ctxLen = 4096
	f.script = qwenToolReply
	f.tmplSrc = "<tool_call>"
	ts := startServer(t, f, Options{APIKey: "test-key"})
	var got struct {
		Finish, Content string
		Calls           [][]any
		Stream          struct {
			Content, Finish string
			Calls           [][]any
		}
		RoundTrip string
	}
	out := runNodeScript(t, ts.URL, "openai_tools.js")
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	wantCalls := [][]any{{"function", "get_weather", map[string]any{"city": "Paris"}, true},
		{"function", "get_time", map[string]any{"tz": "CET"}, true}}
	if got.Finish != "tool_calls" || got.Content != "Checking." || !reflect.DeepEqual(got.Calls, wantCalls) {
		t.Errorf("non-streaming: %+v", got)
	}
	wantStream := [][]any{{"get_weather", map[string]any{"city": "Paris"}}, {"get_time", map[string]any{"tz": "CET"}}}
	if got.Stream.Finish != "tool_calls" || got.Stream.Content != "Checking.\n" || !reflect.DeepEqual(got.Stream.Calls, wantStream) {
		t.Errorf("streaming: %+v", got.Stream)
	}
	if got.RoundTrip != "tool_calls" {
		t.Errorf("round trip finish %q", got.RoundTrip)
	}
}

// TestOpenAINodeJSON runs openai-node's JSON mode, structured outputs
// (chat.completions.parse, streaming) and a forced tool call against the
// real stories260K model.
func TestOpenAINodeJSON(t *testing.T) {
	openaiNode(t)
	ts := toolServer(t, "{% for m in messages %}{{ m.content }}{% endfor %}{# <tool_call> #}")
	type owner struct {
		Name    string
		Age     int
		Pet     string
		Friends []string
	}
	type reply struct {
		Parsed json.RawMessage
		Finish string
	}
	var got struct {
		Object struct{ Content, Finish string }
		Schema []reply
		Stream reply
		Tool   struct {
			Finish string
			Calls  [][]any
		}
		Bad struct {
			Status         int
			Param, Message string
		}
	}
	out := runNodeScript(t, ts.URL, "openai_json.js")
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	o := got.Object
	m := grammar.New(grammar.JSONObject(), grammar.NewVocabBytes(nil, nil)).Matcher()
	if err := m.AcceptBytes([]byte(o.Content)); err != nil || (o.Finish == "stop") != m.Complete() || (o.Finish != "stop" && o.Finish != "length") {
		t.Errorf("json_object: %+v: %v", o, err)
	}
	replies := append(got.Schema, got.Stream)
	if len(replies) != 3 {
		t.Fatalf("%d replies, want 3: %s", len(replies), out)
	}
	for _, r := range replies {
		var p owner
		d := json.NewDecoder(bytes.NewReader(r.Parsed))
		d.DisallowUnknownFields()
		if err := d.Decode(&p); err != nil || r.Finish != "stop" || (p.Pet != "cat" && p.Pet != "dog") ||
			p.Friends == nil || len(p.Friends) > 2 || utf8.RuneCountInString(p.Name) > 10 {
			t.Errorf("json_schema: %s finish %q: %+v %v", r.Parsed, r.Finish, p, err)
		}
	}
	if tc := got.Tool; tc.Finish != "tool_calls" || len(tc.Calls) != 1 || tc.Calls[0][0] != "get_time" ||
		!reflect.DeepEqual(tc.Calls[0][1], map[string]any{"tz": "CET"}) && !reflect.DeepEqual(tc.Calls[0][1], map[string]any{"tz": "UTC"}) {
		t.Errorf("forced tool call: %+v", tc)
	}
	if got.Bad.Status != 400 || got.Bad.Param != "response_format" || !strings.Contains(got.Bad.Message, "pattern") {
		t.Errorf("bad schema: %+v", got.Bad)
	}
}
