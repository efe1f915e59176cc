package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"pagoda/engine"
	"pagoda/sample"
)

type complResp struct {
	ID                string `json:"id"`
	Object            string `json:"object"`
	Created           int64  `json:"created"`
	Model             string `json:"model"`
	SystemFingerprint string `json:"system_fingerprint"`
	Choices           []struct {
		Index        int             `json:"index"`
		Text         string          `json:"text"`
		Logprobs     json.RawMessage `json:"logprobs"`
		FinishReason *string         `json:"finish_reason"`
		Delta        *struct {
			Role    *string `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		Message *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		TotalTokens         int `json:"total_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

func TestCompletionNonStreaming(t *testing.T) {
	f := newFake()
	ts := startServer(t, f, Options{})
	code, b := post(t, ts, "/v1/completions", `{"model":"fake-model","prompt":"hi","max_tokens":3}`)
	if code != 200 {
		t.Fatalf("status %d: %s", code, b)
	}
	r := decode[complResp](t, b)
	if !strings.HasPrefix(r.ID, "cmpl-") || r.Object != "text_completion" || r.Model != "fake-model" ||
		r.SystemFingerprint == "" || r.Created < time.Now().Add(-time.Minute).Unix() {
		t.Fatalf("envelope: %+v", r)
	}
	if len(r.Choices) != 1 || r.Choices[0].Text != "abc" || *r.Choices[0].FinishReason != "length" ||
		string(r.Choices[0].Logprobs) != "null" {
		t.Fatalf("choices: %s", b)
	}
	u := r.Usage
	if u.PromptTokens != 3 || u.CompletionTokens != 3 || u.TotalTokens != 6 || u.PromptTokensDetails.CachedTokens != 2 {
		t.Fatalf("usage: %+v", u)
	}
	got := f.lastReq(t)
	if !reflect.DeepEqual(got.Prompt, []int32{1, 'h' + 3, 'i' + 3}) || got.MaxTokens != 3 || got.N != 1 {
		t.Fatalf("engine request: %+v", got)
	}
	// OpenAI's default: temperature 1, max_tokens 16 for completions.
	if got.Sampling.Temperature != 1 {
		t.Fatalf("default temperature %v", got.Sampling.Temperature)
	}
	code, b = post(t, ts, "/v1/completions", `{"prompt":"hi"}`)
	if code != 200 || f.lastReq(t).MaxTokens != 16 {
		t.Fatalf("default max_tokens: %d %s %d", code, b, f.lastReq(t).MaxTokens)
	}
}

func TestCompletionPromptForms(t *testing.T) {
	f := newFake()
	ts := startServer(t, f, Options{})
	cases := []struct {
		prompt  string
		prompts [][]int32
	}{
		{`["hi","yo"]`, [][]int32{{1, 'h' + 3, 'i' + 3}, {1, 'y' + 3, 'o' + 3}}},
		{`[5,6,7]`, [][]int32{{5, 6, 7}}},
		{`[[5,6],[7]]`, [][]int32{{5, 6}, {7}}},
		{`["hi",[9]]`, [][]int32{{1, 'h' + 3, 'i' + 3}, {9}}},
	}
	for _, c := range cases {
		f.mu.Lock()
		f.reqs = nil
		f.mu.Unlock()
		code, b := post(t, ts, "/v1/completions", `{"prompt":`+c.prompt+`,"max_tokens":2,"n":2,"temperature":0.7}`)
		if code != 200 {
			t.Fatalf("%s: %d %s", c.prompt, code, b)
		}
		r := decode[complResp](t, b)
		if len(r.Choices) != 2*len(c.prompts) {
			t.Fatalf("%s: %d choices", c.prompt, len(r.Choices))
		}
		for i, ch := range r.Choices {
			// completion i%n of each prompt starts at letter 'a'+i%n.
			want := string([]byte{byte('a' + i%2), byte('b' + i%2)})
			if ch.Index != i || ch.Text != want {
				t.Fatalf("%s: choice %d = %+v, want text %q", c.prompt, i, ch, want)
			}
		}
		f.mu.Lock()
		var got [][]int32
		for _, q := range f.reqs {
			got = append(got, q.Prompt)
			if q.N != 2 {
				t.Errorf("n = %d", q.N)
			}
		}
		f.mu.Unlock()
		if !reflect.DeepEqual(got, c.prompts) {
			t.Fatalf("%s: prompts %v, want %v", c.prompt, got, c.prompts)
		}
		ntok := 0
		for _, p := range c.prompts {
			ntok += len(p)
		}
		if r.Usage.PromptTokens != ntok || r.Usage.CompletionTokens != 4*len(c.prompts) {
			t.Fatalf("%s: usage %+v", c.prompt, r.Usage)
		}
	}
}

func TestCompletionEcho(t *testing.T) {
	f := newFake()
	ts := startServer(t, f, Options{})
	code, b := post(t, ts, "/v1/completions", `{"prompt":"hi ","max_tokens":2,"echo":true}`)
	if code != 200 {
		t.Fatal(code, string(b))
	}
	if r := decode[complResp](t, b); r.Choices[0].Text != "hi ab" {
		t.Fatalf("echo text %q", r.Choices[0].Text)
	}
	code, b = post(t, ts, "/v1/completions", `{"prompt":[110,111],"max_tokens":1,"echo":true}`)
	if r := decode[complResp](t, b); code != 200 || r.Choices[0].Text != "kla" {
		t.Fatalf("echo of token prompt: %d %s", code, b)
	}
	ev := postStream(t, ts, "/v1/completions", `{"prompt":"hi","max_tokens":1,"echo":true,"stream":true}`)
	if r := decode[complResp](t, []byte(ev[0])); r.Choices[0].Text != "hi" {
		t.Fatalf("first streamed chunk should echo the prompt: %s", ev[0])
	}
}

// checkStream verifies the OpenAI stream framing and returns the text per
// choice and the usage chunk.
func checkStream(t *testing.T, ev []string, chat bool, n int, includeUsage bool) ([]string, *complResp) {
	t.Helper()
	if len(ev) < 2 || ev[len(ev)-1] != "[DONE]" {
		t.Fatalf("stream must end with [DONE]: %q", ev)
	}
	texts := make([]string, n)
	finished := make([]bool, n)
	roleSeen := make([]bool, n)
	var usage *complResp
	id := ""
	for k, e := range ev[:len(ev)-1] {
		r := decode[complResp](t, []byte(e))
		if id == "" {
			id = r.ID
		}
		if r.ID != id {
			t.Fatalf("chunk ids differ: %s vs %s", r.ID, id)
		}
		wantObj := "text_completion"
		if chat {
			wantObj = "chat.completion.chunk"
		}
		if r.Object != wantObj || r.SystemFingerprint == "" {
			t.Fatalf("chunk %d envelope: %s", k, e)
		}
		if includeUsage != strings.Contains(e, `"usage":`) {
			t.Fatalf("chunk %d: usage field present=%v, include_usage=%v: %s", k, !includeUsage, includeUsage, e)
		}
		if r.Usage != nil {
			if len(r.Choices) != 0 || k != len(ev)-2 || !strings.Contains(e, `"choices":[]`) {
				t.Fatalf("usage chunk must be last, with empty choices: %s", e)
			}
			usage = &r
			continue
		}
		if len(r.Choices) != 1 {
			t.Fatalf("chunk %d: %d choices", k, len(r.Choices))
		}
		c := r.Choices[0]
		if finished[c.Index] {
			t.Fatalf("chunk for choice %d after its finish_reason: %s", c.Index, e)
		}
		if chat {
			if c.Delta == nil {
				t.Fatalf("chat chunk without delta: %s", e)
			}
			if !roleSeen[c.Index] {
				if c.Delta.Role == nil || *c.Delta.Role != "assistant" {
					t.Fatalf("first chunk of choice %d must carry the role: %s", c.Index, e)
				}
				roleSeen[c.Index] = true
			} else if c.Delta.Role != nil {
				t.Fatalf("role repeated: %s", e)
			}
			if c.Delta.Content != nil {
				texts[c.Index] += *c.Delta.Content
			}
		} else {
			texts[c.Index] += c.Text
		}
		if c.FinishReason != nil {
			finished[c.Index] = true
		}
	}
	for i, f := range finished {
		if !f {
			t.Fatalf("choice %d never got finish_reason", i)
		}
	}
	if includeUsage && usage == nil {
		t.Fatal("no usage chunk")
	}
	return texts, usage
}

func TestStreaming(t *testing.T) {
	f := newFake()
	ts := startServer(t, f, Options{})
	for _, chat := range []bool{false, true} {
		for _, inc := range []bool{false, true} {
			for _, n := range []int{1, 3} {
				path, body := "/v1/completions", `"prompt":"hi"`
				if chat {
					path, body = "/v1/chat/completions", `"messages":[{"role":"user","content":"hi"}]`
				}
				body = fmt.Sprintf(`{%s,"max_tokens":4,"n":%d,"stream":true`, body, n)
				if inc {
					body += `,"stream_options":{"include_usage":true}`
				}
				body += "}"
				ev := postStream(t, ts, path, body)
				texts, usage := checkStream(t, ev, chat, n, inc)
				for i, txt := range texts {
					want := ""
					for k := range 4 {
						want += string(rune('a' + k + i))
					}
					if txt != want {
						t.Fatalf("chat=%v n=%d choice %d: %q, want %q", chat, n, i, txt, want)
					}
				}
				if inc && (usage.Usage.CompletionTokens != 4*n || usage.Usage.TotalTokens != usage.Usage.PromptTokens+4*n) {
					t.Fatalf("usage %+v", usage.Usage)
				}
			}
		}
	}
}

func TestChatNonStreaming(t *testing.T) {
	f := newFake()
	ts := startServer(t, f, Options{})
	body := `{"model":"fake-model","messages":[{"role":"system","content":"be brief"},
		{"role":"user","content":[{"type":"text","text":"hi"},{"type":"text","text":"there"}]}],
		"max_completion_tokens":2,"n":2,"tools":[{"type":"function","function":{"name":"f"}}],"user":"bob"}`
	code, b := post(t, ts, "/v1/chat/completions", body)
	if code != 200 {
		t.Fatal(code, string(b))
	}
	r := decode[complResp](t, b)
	if !strings.HasPrefix(r.ID, "chatcmpl-") || r.Object != "chat.completion" || len(r.Choices) != 2 {
		t.Fatalf("%s", b)
	}
	for i, c := range r.Choices {
		want := string([]byte{byte('a' + i), byte('b' + i)})
		if c.Index != i || c.Message.Role != "assistant" || c.Message.Content != want || *c.FinishReason != "length" {
			t.Fatalf("choice %d: %s", i, b)
		}
	}
	prompt := f.Detokenize(f.lastReq(t).Prompt)
	if want := "<system>be brief\n<user>hi\nthere\n[tools:1]<assistant>"; prompt != want {
		t.Fatalf("templated prompt %q, want %q", prompt, want)
	}
	if f.lastReq(t).Prompt[0] == 1 {
		t.Fatal("chat prompts must not get an extra BOS (the template writes special tokens)")
	}
	// No max_tokens in chat: whatever the context leaves.
	post(t, ts, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`)
	if got := f.lastReq(t); got.MaxTokens != 0 {
		t.Fatalf("default chat max tokens %d with prompt %d", got.MaxTokens, len(got.Prompt))
	}
}

func TestParameterPassthrough(t *testing.T) {
	f := newFake()
	ts := startServer(t, f, Options{})
	code, b := post(t, ts, "/v1/completions", `{"prompt":"hi","max_tokens":5,"temperature":0.5,"top_p":0.9,
		"top_k":40,"min_p":0.05,"repetition_penalty":1.1,"frequency_penalty":0.5,"presence_penalty":-0.5,
		"seed":42,"stop":["x","yz"],"stop_token_ids":[7,8],"ignore_eos":true,"logit_bias":{"5":-100,"6":2.5},"n":1}`)
	if code != 200 {
		t.Fatal(code, string(b))
	}
	got := f.lastReq(t)
	want := sample.Params{Temperature: 0.5, TopP: 0.9, TopK: 40, MinP: 0.05, RepetitionPenalty: 1.1,
		FrequencyPenalty: 0.5, PresencePenalty: -0.5, Seed: 42, HasSeed: true,
		LogitBias: map[int32]float32{5: -100, 6: 2.5}}
	if !reflect.DeepEqual(got.Sampling, want) {
		t.Fatalf("sampling %+v\nwant     %+v", got.Sampling, want)
	}
	if !reflect.DeepEqual(got.StopStrings, []string{"x", "yz"}) || !reflect.DeepEqual(got.StopTokens, []int32{7, 8}) ||
		!got.IgnoreEOS || got.MaxTokens != 5 {
		t.Fatalf("request %+v", got)
	}
	post(t, ts, "/v1/chat/completions", `{"messages":[{"role":"user","content":"q"}],"stop":"END","top_k":-1}`)
	if got := f.lastReq(t); !reflect.DeepEqual(got.StopStrings, []string{"END"}) || got.Sampling.TopK != 0 {
		t.Fatalf("stop string: %+v", got)
	}
	// A stop reported by the engine surfaces as finish_reason "stop".
	f.stopAt = "b"
	code, b = post(t, ts, "/v1/completions", `{"prompt":"hi","max_tokens":5,"stop":"b"}`)
	if r := decode[complResp](t, b); code != 200 || r.Choices[0].Text != "a" || *r.Choices[0].FinishReason != "stop" {
		t.Fatalf("stop: %s", b)
	}
}

func TestLogprobs(t *testing.T) {
	f := newFake()
	ts := startServer(t, f, Options{})
	code, b := post(t, ts, "/v1/completions", `{"prompt":"hi","max_tokens":2,"logprobs":2}`)
	if code != 200 {
		t.Fatal(code, string(b))
	}
	var cr struct {
		Choices []struct {
			Logprobs struct {
				Tokens        []string                   `json:"tokens"`
				TokenLogprobs []float64                  `json:"token_logprobs"`
				TopLogprobs   []map[string]float64       `json:"top_logprobs"`
				TextOffset    []int                      `json:"text_offset"`
				Raw           map[string]json.RawMessage `json:"-"`
			} `json:"logprobs"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(b, &cr); err != nil {
		t.Fatal(err)
	}
	lp := cr.Choices[0].Logprobs
	if !reflect.DeepEqual(lp.Tokens, []string{"a", "b"}) || !reflect.DeepEqual(lp.TokenLogprobs, []float64{-0.5, -1}) ||
		!reflect.DeepEqual(lp.TextOffset, []int{0, 1}) {
		t.Fatalf("completion logprobs: %s", b)
	}
	wantTop := []map[string]float64{{"X": -0.1, "Y": -0.2, "a": -0.5}, {"X": -0.1, "Y": -0.2, "b": -1}}
	for i := range wantTop {
		for k, v := range wantTop[i] {
			if got, ok := lp.TopLogprobs[i][k]; !ok || float32(got) != float32(v) {
				t.Fatalf("top_logprobs[%d]: %v, want %v", i, lp.TopLogprobs[i], wantTop[i])
			}
		}
		if len(lp.TopLogprobs[i]) != 3 {
			t.Fatalf("top_logprobs[%d]: %v", i, lp.TopLogprobs[i])
		}
	}
	if got := f.lastReq(t); !got.Logprobs || got.TopLogprobs != 2 {
		t.Fatalf("engine request logprobs=%v top=%d", got.Logprobs, got.TopLogprobs)
	}

	code, b = post(t, ts, "/v1/chat/completions", `{"messages":[{"role":"user","content":"q"}],"max_tokens":2,"logprobs":true,"top_logprobs":1}`)
	if code != 200 {
		t.Fatal(code, string(b))
	}
	var chr struct {
		Choices []struct {
			Logprobs struct {
				Content []struct {
					Token       string  `json:"token"`
					Logprob     float64 `json:"logprob"`
					Bytes       []int   `json:"bytes"`
					TopLogprobs []struct {
						Token   string  `json:"token"`
						Logprob float64 `json:"logprob"`
						Bytes   []int   `json:"bytes"`
					} `json:"top_logprobs"`
				} `json:"content"`
			} `json:"logprobs"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(b, &chr); err != nil {
		t.Fatal(err)
	}
	c := chr.Choices[0].Logprobs.Content
	if len(c) != 2 || c[0].Token != "a" || c[0].Logprob != -0.5 || !reflect.DeepEqual(c[0].Bytes, []int{'a'}) ||
		len(c[0].TopLogprobs) != 1 || c[0].TopLogprobs[0].Token != "X" || !reflect.DeepEqual(c[1].TopLogprobs[0].Bytes, []int{'X'}) {
		t.Fatalf("chat logprobs: %s", b)
	}
	// Streaming carries logprobs per chunk, offsets continuing.
	ev := postStream(t, ts, "/v1/completions", `{"prompt":"hi","max_tokens":2,"logprobs":0,"stream":true}`)
	var offs []int
	for _, e := range ev[:len(ev)-1] {
		var ch struct {
			Choices []struct {
				Logprobs struct {
					TextOffset  []int                `json:"text_offset"`
					TopLogprobs []map[string]float64 `json:"top_logprobs"`
				} `json:"logprobs"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(e), &ch); err != nil {
			t.Fatal(err)
		}
		offs = append(offs, ch.Choices[0].Logprobs.TextOffset...)
		if tl := ch.Choices[0].Logprobs.TopLogprobs; len(tl) != 1 || len(tl[0]) != 1 {
			t.Fatalf("logprobs=0 keeps only the sampled token: %s", e)
		}
	}
	if !reflect.DeepEqual(offs, []int{0, 1}) {
		t.Fatalf("streamed text offsets %v", offs)
	}
}

func TestTokenBytes(t *testing.T) {
	if got := tokenBytes(`bytes:\xe2\x80`); !reflect.DeepEqual(got, []int{0xe2, 0x80}) {
		t.Fatalf("%v", got)
	}
	if got := tokenBytes("é"); !reflect.DeepEqual(got, []int{0xc3, 0xa9}) {
		t.Fatalf("%v", got)
	}
	if clampLP(float32(-1e30)) != -9999 {
		t.Fatal("clamp")
	}
}

func TestErrors(t *testing.T) {
	f := newFake()
	ts := startServer(t, f, Options{MaxBodyBytes: 4096})
	chat := func(extra string) string {
		return `{"messages":[{"role":"user","content":"hi"}]` + extra + `}`
	}
	long := strings.Repeat("z", 70)
	cases := []struct {
		name, path, body string
		code             int
		param, msg       string
	}{
		{"malformed", "/v1/completions", `{"prompt":`, 400, "", "malformed JSON"},
		{"not object", "/v1/completions", `[1,2]`, 400, "", ""},
		{"empty body", "/v1/chat/completions", ``, 400, "", "empty request body"},
		{"wrong type", "/v1/completions", `{"prompt":"hi","temperature":"hot"}`, 400, "temperature", ""},
		{"temperature", "/v1/completions", `{"prompt":"hi","temperature":2.5}`, 400, "temperature", "[0, 2]"},
		{"top_p", "/v1/completions", `{"prompt":"hi","top_p":0}`, 400, "top_p", ""},
		{"top_k", "/v1/completions", `{"prompt":"hi","top_k":-2}`, 400, "top_k", ""},
		{"min_p", "/v1/completions", `{"prompt":"hi","min_p":1.5}`, 400, "min_p", ""},
		{"rep pen", "/v1/completions", `{"prompt":"hi","repetition_penalty":0}`, 400, "repetition_penalty", ""},
		{"freq pen", "/v1/completions", `{"prompt":"hi","frequency_penalty":3}`, 400, "frequency_penalty", ""},
		{"pres pen", "/v1/chat/completions", chat(`,"presence_penalty":-2.5`), 400, "presence_penalty", ""},
		{"n", "/v1/completions", `{"prompt":"hi","n":0}`, 400, "n", ""},
		{"n big", "/v1/completions", `{"prompt":"hi","n":17}`, 400, "n", ""},
		{"max_tokens", "/v1/completions", `{"prompt":"hi","max_tokens":0}`, 400, "max_tokens", ""},
		{"max_completion_tokens", "/v1/chat/completions", chat(`,"max_completion_tokens":-1`), 400, "max_completion_tokens", ""},
		{"logprobs", "/v1/completions", `{"prompt":"hi","logprobs":21}`, 400, "logprobs", ""},
		{"top_logprobs alone", "/v1/chat/completions", chat(`,"top_logprobs":2`), 400, "top_logprobs", ""},
		{"top_logprobs big", "/v1/chat/completions", chat(`,"logprobs":true,"top_logprobs":30`), 400, "top_logprobs", ""},
		{"logit_bias key", "/v1/completions", `{"prompt":"hi","logit_bias":{"abc":1}}`, 400, "logit_bias", ""},
		{"logit_bias id", "/v1/completions", `{"prompt":"hi","logit_bias":{"300":1}}`, 400, "logit_bias", "[0, 259)"},
		{"logit_bias value", "/v1/completions", `{"prompt":"hi","logit_bias":{"5":101}}`, 400, "logit_bias", ""},
		{"stop type", "/v1/completions", `{"prompt":"hi","stop":5}`, 400, "stop", ""},
		{"stop_token_ids", "/v1/completions", `{"prompt":"hi","stop_token_ids":[-1]}`, 400, "stop_token_ids", ""},
		{"stream_options", "/v1/completions", `{"prompt":"hi","stream_options":{"include_usage":true}}`, 400, "stream_options", ""},
		{"best_of", "/v1/completions", `{"prompt":"hi","best_of":3}`, 400, "best_of", ""},
		{"suffix", "/v1/completions", `{"prompt":"hi","suffix":"end"}`, 400, "suffix", "not supported"},
		{"no prompt", "/v1/completions", `{"max_tokens":3}`, 400, "prompt", ""},
		{"empty prompt list", "/v1/completions", `{"prompt":[]}`, 400, "prompt", ""},
		{"bad prompt ids", "/v1/completions", `{"prompt":[1,-4]}`, 400, "prompt", ""},
		{"prompt id range", "/v1/completions", `{"prompt":[[1],[400]]}`, 400, "prompt", ""},
		{"too many prompts", "/v1/completions", `{"prompt":[` + strings.Repeat(`[5],`, 100) + `[5]],"n":3}`, 400, "prompt", "more than 256"},
		{"mixed prompt", "/v1/completions", `{"prompt":[[1],{"a":1}]}`, 400, "prompt", ""},
		{"empty prompt", "/v1/completions", `{"prompt":"","add_special_tokens":false}`, 400, "prompt", "empty"},
		{"too long", "/v1/completions", `{"prompt":"` + long + `"}`, 400, "prompt", "maximum context length is 64 tokens. However, your prompt has 71 tokens"},
		{"too long total", "/v1/completions", `{"prompt":"hi","max_tokens":62}`, 400, "max_tokens", "you requested 65 tokens (3 in the prompt, 62 in the completion)"},
		{"total overflows", "/v1/completions", `{"prompt":"hi","max_tokens":9223372036854775807}`, 400, "max_tokens", "you requested 9223372036854775810 tokens (3 in the prompt, 9223372036854775807 in the completion)"},
		{"chat too long", "/v1/chat/completions", `{"messages":[{"role":"user","content":"` + long + `"}]}`, 400, "messages", "maximum context length is 64"},
		{"no messages", "/v1/chat/completions", `{"messages":[]}`, 400, "messages", ""},
		{"bad role", "/v1/chat/completions", `{"messages":[{"role":"wizard","content":"x"}]}`, 400, "messages", "wizard"},
		{"image part", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, 400, "messages", "image_url"},
		{"template error", "/v1/chat/completions", `{"messages":[{"role":"user","content":"BOOM"}]}`, 400, "messages", "boom"},
		{"response_format", "/v1/chat/completions", chat(`,"response_format":{"type":"json_object"}`), 400, "response_format", "json_object"},
		{"tool_choice", "/v1/chat/completions", chat(`,"tool_choice":"required"`), 400, "tool_choice", ""},
		{"too large", "/v1/completions", `{"prompt":"` + strings.Repeat("a", 5000) + `"}`, 413, "", "exceeds 4096 bytes"},
		{"unknown route", "/v1/audio/speech", `{}`, 404, "", ""},
	}
	for _, c := range cases {
		code, b := post(t, ts, c.path, c.body)
		if code != c.code {
			t.Errorf("%s: status %d, want %d: %s", c.name, code, c.code, b)
			continue
		}
		e := decode[errBody](t, b)
		if e.Error.Message == "" || e.Error.Type == "" {
			t.Errorf("%s: not an OpenAI error: %s", c.name, b)
		}
		if c.param != "" && (e.Error.Param == nil || *e.Error.Param != c.param) {
			t.Errorf("%s: param %v, want %q: %s", c.name, e.Error.Param, c.param, b)
		}
		if !strings.Contains(e.Error.Message, c.msg) {
			t.Errorf("%s: message %q lacks %q", c.name, e.Error.Message, c.msg)
		}
	}
	f.mu.Lock()
	n := len(f.reqs)
	f.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d invalid requests reached the backend", n)
	}
}

func TestBackendErrors(t *testing.T) {
	f := newFake()
	ts := startServer(t, f, Options{})
	f.submitErr = fmt.Errorf("engine: 10 waiting: %w", ErrQueueFull)
	code, b := post(t, ts, "/v1/completions", `{"prompt":"hi"}`)
	if e := decode[errBody](t, b); code != 429 || e.Error.Type != "rate_limit_error" {
		t.Fatalf("queue full: %d %s", code, b)
	}
	f.submitErr = fmt.Errorf("engine: prompt 60 + 10 > 64: %w", ErrTooLong)
	if code, b := post(t, ts, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`); code != 400 {
		t.Fatalf("too long: %d %s", code, b)
	}
	// The engine's own errors: Submit only validates and queues, so an
	// unnamed error is the request's fault.
	for _, c := range []struct {
		err  error
		code int
	}{
		{engine.ErrQueueFull, 429},
		{&engine.TooLongError{Prompt: 60, MaxTokens: 10, Limit: 64, What: "KV cache"}, 400},
		{engine.ErrStopped, 503},
		{fmt.Errorf("engine: request: n = 99 must be in [1, 64]"), 400},
	} {
		f.submitErr = c.err
		code, b := post(t, ts, "/v1/completions", `{"prompt":"hi"}`)
		if e := decode[errBody](t, b); code != c.code || e.Error.Message != c.err.Error() {
			t.Fatalf("%v: %d %s", c.err, code, b)
		}
	}
	f.submitErr = nil
	f.midErr = fmt.Errorf("forward failed")
	if code, b := post(t, ts, "/v1/completions", `{"prompt":"hi","max_tokens":4}`); code != 500 || !strings.Contains(string(b), "forward failed") {
		t.Fatalf("mid-generation error: %d %s", code, b)
	}
	ev := postStream(t, ts, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"stream":true}`)
	if len(ev) < 2 || !strings.Contains(ev[len(ev)-2], `"error"`) || ev[len(ev)-1] != "[DONE]" {
		t.Fatalf("stream error: %q", ev)
	}
}

func TestMaxQueue(t *testing.T) {
	f := newFake()
	f.hold = make(chan struct{})
	ts := startServer(t, f, Options{MaxQueue: 1})
	done := make(chan int)
	go func() {
		code, _ := post(t, ts, "/v1/completions", `{"prompt":"hi","max_tokens":1}`)
		done <- code
	}()
	<-f.started
	code, b := post(t, ts, "/v1/completions", `{"prompt":"hi","max_tokens":1}`)
	if code != 429 {
		t.Fatalf("second request: %d %s", code, b)
	}
	close(f.hold)
	if c := <-done; c != 200 {
		t.Fatalf("first request: %d", c)
	}
}

func TestAuth(t *testing.T) {
	f := newFake()
	ts := startServer(t, f, Options{APIKey: "sekret"})
	body := `{"prompt":"hi","max_tokens":1}`
	for _, h := range [][]string{nil, {"Authorization", "Bearer nope"}, {"Authorization", "sekret"}} {
		code, b := post(t, ts, "/v1/completions", body, h...)
		if e := decode[errBody](t, b); code != 401 || *e.Error.Code != "invalid_api_key" {
			t.Fatalf("%v: %d %s", h, code, b)
		}
	}
	if code, _ := post(t, ts, "/tokenize", `{"prompt":"x"}`); code != 401 {
		t.Fatalf("tokenize without key: %d", code)
	}
	if code, b := post(t, ts, "/v1/completions", body, "Authorization", "Bearer sekret"); code != 200 {
		t.Fatalf("with key: %d %s", code, b)
	}
	resp, err := ts.Client().Get(ts.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("models without key: %d", resp.StatusCode)
	}
	resp, err = ts.Client().Get(ts.URL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("health must stay open: %d", resp.StatusCode)
	}
}

func TestStrictModel(t *testing.T) {
	f := newFake()
	ts := startServer(t, f, Options{ServedNames: []string{"alias"}})
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		body := `,"prompt":"hi","max_tokens":1}`
		if path == "/v1/chat/completions" {
			body = `,"messages":[{"role":"user","content":"hi"}],"max_tokens":1}`
		}
		if code, b := post(t, ts, path, `{"model":"gpt-4"`+body); code != 404 || !strings.Contains(string(b), "model_not_found") {
			t.Fatalf("%s: %d %s", path, code, b)
		}
		// The served name, an alias and no name at all are the model.
		for _, m := range []string{`"model":"fake-model"`, `"model":"alias"`, `"model":""`, `"user":"u"`} {
			if code, b := post(t, ts, path, `{`+m+body); code != 200 {
				t.Fatalf("%s %s: %d %s", path, m, code, b)
			}
		}
	}
	if resp, b := get(t, ts, "/v1/models/alias"); resp.StatusCode != 200 || !strings.Contains(string(b), `"id":"alias"`) {
		t.Fatalf("alias model: %d %s", resp.StatusCode, b)
	}
	ts2 := startServer(t, f, Options{AnyModel: true})
	if code, _ := post(t, ts2, "/v1/completions", `{"model":"gpt-4","prompt":"hi","max_tokens":1}`); code != 200 {
		t.Fatal(code)
	}
}

func TestSmallEndpoints(t *testing.T) {
	f := newFake()
	reg := prometheus.NewRegistry()
	ts := startServer(t, f, Options{Registry: reg, Version: "1.2.3"})
	get := func(path string) (int, string) {
		resp, err := ts.Client().Get(ts.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, b := get("/v1/models")
	var models struct {
		Object string `json:"object"`
		Data   []struct {
			ID          string `json:"id"`
			Object      string `json:"object"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	if json.Unmarshal([]byte(b), &models); code != 200 || models.Object != "list" || len(models.Data) != 1 ||
		models.Data[0].ID != "fake-model" || models.Data[0].Object != "model" || models.Data[0].MaxModelLen != 64 {
		t.Fatalf("models: %d %s", code, b)
	}
	if code, b := get("/v1/models/fake-model"); code != 200 || !strings.Contains(b, `"id":"fake-model"`) {
		t.Fatalf("model: %d %s", code, b)
	}
	if code, b := get("/version"); code != 200 || b != `{"version":"1.2.3"}` {
		t.Fatalf("version: %d %s", code, b)
	}
	if code, b := get("/health"); code != 200 || b != "" {
		t.Fatalf("health: %d %q", code, b)
	}
	code, tb := post(t, ts, "/tokenize", `{"model":"fake-model","prompt":"hi","return_token_strs":true}`)
	if code != 200 || string(tb) != `{"count":3,"max_model_len":64,"tokens":[1,107,108],"token_strs":["<s1>","h","i"]}` {
		t.Fatalf("tokenize: %d %s", code, tb)
	}
	code, tb = post(t, ts, "/tokenize", `{"prompt":"hi","add_special_tokens":false}`)
	if code != 200 || string(tb) != `{"count":2,"max_model_len":64,"tokens":[107,108],"token_strs":null}` {
		t.Fatalf("tokenize: %d %s", code, tb)
	}
	code, tb = post(t, ts, "/tokenize", `{"messages":[{"role":"user","content":"a"}]}`)
	if want := f.Tokenize("<user>a\n<assistant>", false); code != 200 || !strings.Contains(string(tb), fmt.Sprintf(`"count":%d`, len(want))) {
		t.Fatalf("tokenize chat: %d %s", code, tb)
	}
	code, tb = post(t, ts, "/detokenize", `{"tokens":[1,107,108]}`)
	if code != 200 || string(tb) != `{"prompt":"hi"}` {
		t.Fatalf("detokenize: %d %s", code, tb)
	}
	if code, _ := post(t, ts, "/detokenize", `{"tokens":"hi"}`); code != 400 {
		t.Fatalf("detokenize bad: %d", code)
	}
	code, b = get("/metrics")
	if code != 200 || !strings.Contains(b, `pagoda:http_requests_total{code="200",path="/tokenize"} 3`) {
		t.Fatalf("metrics: %d %s", code, b)
	}
	// A second server on the same registry reuses the collectors.
	if s2 := New(f, Options{Registry: reg}); s2.httpReqs == nil {
		t.Fatal("second server lost its metrics")
	}
}

// TestDisconnectCancels checks that a client going away reaches the
// backend's context, streaming or not.
func TestDisconnectCancels(t *testing.T) {
	for _, stream := range []bool{true, false} {
		f := newFake()
		f.delay = 20 * time.Millisecond
		ts := startServer(t, f, Options{})
		ctx, cancel := context.WithCancel(context.Background())
		body := fmt.Sprintf(`{"prompt":"hi","max_tokens":50,"stream":%v}`, stream)
		req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/v1/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		errc := make(chan error, 1)
		go func() {
			resp, err := ts.Client().Do(req)
			if err == nil {
				buf := make([]byte, 64)
				_, err = resp.Body.Read(buf)
				for err == nil {
					_, err = resp.Body.Read(buf)
				}
				resp.Body.Close()
			}
			errc <- err
		}()
		<-f.started
		time.Sleep(50 * time.Millisecond)
		cancel()
		<-errc
		deadline := time.Now().Add(5 * time.Second)
		for {
			if c, fin := f.counts(); c == 1 && fin == 0 {
				break
			}
			if time.Now().After(deadline) {
				c, fin := f.counts()
				t.Fatalf("stream=%v: cancelled=%d finished=%d after client disconnect", stream, c, fin)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// TestDrain checks graceful shutdown: in-flight requests finish, new
// connections are refused, Serve returns nil; and a request that outlives
// the grace period is cancelled.
func TestDrain(t *testing.T) {
	f := newFake()
	f.delay = 10 * time.Millisecond
	s := New(f, Options{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ln, 5*time.Second) }()

	type result struct {
		code int
		body string
		err  error
	}
	inflight := make(chan result, 1)
	go func() {
		resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"hi","max_tokens":20,"stream":true}`))
		if err != nil {
			inflight <- result{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		inflight <- result{resp.StatusCode, string(b), err}
	}()
	<-f.started
	stop()
	time.Sleep(50 * time.Millisecond)
	if _, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"hi"}`)); err == nil {
		t.Fatal("a new connection was accepted while draining")
	}
	r := <-inflight
	if r.err != nil || r.code != 200 || !strings.HasSuffix(r.body, "data: [DONE]\n\n") {
		t.Fatalf("in-flight request during drain: %+v", r)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if c, fin := f.counts(); c != 0 || fin != 1 {
		t.Fatalf("cancelled=%d finished=%d", c, fin)
	}

	// Grace expiry: the stuck request is cancelled and Serve still returns.
	f2 := newFake()
	f2.hold = make(chan struct{})
	s2 := New(f2, Options{})
	ln2, _ := net.Listen("tcp", "127.0.0.1:0")
	ctx2, stop2 := context.WithCancel(context.Background())
	served2 := make(chan error, 1)
	go func() { served2 <- s2.Serve(ctx2, ln2, 100*time.Millisecond) }()
	go func() {
		resp, err := http.Post("http://"+ln2.Addr().String()+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"hi"}`))
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	<-f2.started
	start := time.Now()
	stop2()
	select {
	case err := <-served2:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after the grace period")
	}
	if el := time.Since(start); el < 100*time.Millisecond {
		t.Fatalf("returned before the grace period: %v", el)
	}
	deadline := time.Now().Add(2 * time.Second)
	for c, _ := f2.counts(); c != 1; c, _ = f2.counts() {
		if time.Now().After(deadline) {
			t.Fatal("stuck request not cancelled after grace")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestNoGoroutineLeak(t *testing.T) {
	base := runtime.NumGoroutine()
	f := newFake()
	f.delay = time.Millisecond
	ts := httptest.NewUnstartedServer(New(f, Options{}).Handler())
	ts.Start()
	for range 3 {
		postStream(t, ts, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":5,"n":2,"stream":true}`)
		post(t, ts, "/v1/completions", `{"prompt":["a","b"],"max_tokens":3}`)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
		req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/v1/completions", strings.NewReader(`{"prompt":"hi","max_tokens":60,"stream":true}`))
		req.Header.Set("Content-Type", "application/json")
		if resp, err := ts.Client().Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		cancel()
	}
	ts.Close()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			n := runtime.Stack(buf, true)
			t.Fatalf("goroutines: %d > %d at start\n%s", runtime.NumGoroutine(), base, buf[:n])
		}
		time.Sleep(10 * time.Millisecond)
	}
}
