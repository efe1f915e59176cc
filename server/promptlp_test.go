package server

import (
	"encoding/json"
	"math"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"pagoda/engine"
	"pagoda/generate"
	"pagoda/kvcache"
	"pagoda/testutil"
	"pagoda/tokenizer"
)

type echoLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []*float64           `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

// TestEchoLogprobs serves stories260K with a chunked prefill and checks
// echo+logprobs: the prompt's logprobs (first null) equal teacher-forced
// scoring, the completion's follow as without echo, and streaming gives
// the same as the one-shot response.
func TestEchoLogprobs(t *testing.T) {
	path := testutil.Shared(t, "models/gguf/stories260K.gguf")
	m, eng := storiesEngine(t, path, func(c *engine.Config) {
		c.KVDType, c.MaxNumBatchedTokens = kvcache.F32, 4
	})
	c := m.Config
	be, err := NewEngineBackend(eng, m.Tokenizer(), "stories260K", c.ContextLen, "")
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(New(be, Options{}).Handler())
	defer ts.Close()

	const text = "Once upon a time there was a little girl"
	ids := m.Tokenizer().Encode(text, tokenizer.Options{AddSpecial: true})
	ref, err := generate.ScoreTokens(m, ids, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	req := `{"prompt":"` + text + `","max_tokens":3,"temperature":0,"ignore_eos":true,"logprobs":2`
	code, b := post(t, ts, "/v1/completions", req+`}`)
	if code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	plain := decode[struct {
		Choices []struct {
			Text     string
			Logprobs echoLogprobs
		}
	}](t, b).Choices[0]
	code, b = post(t, ts, "/v1/completions", req+`,"echo":true}`)
	if code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	echo := decode[struct {
		Choices []struct {
			Text     string
			Logprobs echoLogprobs
		}
	}](t, b).Choices[0]
	if echo.Text != text+plain.Text {
		t.Errorf("text %q, want %q", echo.Text, text+plain.Text)
	}
	lp := echo.Logprobs
	P := len(ids)
	if len(lp.Tokens) != P+3 || len(lp.TokenLogprobs) != P+3 || len(lp.TopLogprobs) != P+3 || len(lp.TextOffset) != P+3 {
		t.Fatalf("logprobs lengths %d %d %d %d, want %d", len(lp.Tokens), len(lp.TokenLogprobs), len(lp.TopLogprobs), len(lp.TextOffset), P+3)
	}
	if lp.TokenLogprobs[0] != nil || lp.TopLogprobs[0] != nil {
		t.Errorf("first prompt token: logprob %v, top %v; want null", lp.TokenLogprobs[0], lp.TopLogprobs[0])
	}
	for i := 1; i < P; i++ {
		if lp.TokenLogprobs[i] == nil || math.Abs(*lp.TokenLogprobs[i]-ref.Logprobs[i-1]) > 1e-4 {
			t.Errorf("prompt token %d: logprob %v, ScoreTokens %v", i, lp.TokenLogprobs[i], ref.Logprobs[i-1])
		}
		if len(lp.TopLogprobs[i]) < 2 {
			t.Errorf("prompt token %d: top %v", i, lp.TopLogprobs[i])
		}
	}
	if !reflect.DeepEqual(lp.Tokens[P:], plain.Logprobs.Tokens) || !reflect.DeepEqual(lp.TokenLogprobs[P:], plain.Logprobs.TokenLogprobs) {
		t.Errorf("completion logprobs %v %v, without echo %v %v", lp.Tokens[P:], lp.TokenLogprobs[P:], plain.Logprobs.Tokens, plain.Logprobs.TokenLogprobs)
	}

	// Streaming: the chunks' logprobs concatenate to the same lists.
	var st echoLogprobs
	var stText strings.Builder
	for _, ev := range postStream(t, ts, "/v1/completions", req+`,"echo":true,"stream":true}`) {
		if ev == "[DONE]" {
			continue
		}
		var ch struct {
			Choices []struct {
				Text     string
				Logprobs *echoLogprobs
			}
		}
		if err := json.Unmarshal([]byte(ev), &ch); err != nil {
			t.Fatal(err)
		}
		for _, c := range ch.Choices {
			stText.WriteString(c.Text)
			if c.Logprobs != nil {
				st.Tokens = append(st.Tokens, c.Logprobs.Tokens...)
				st.TokenLogprobs = append(st.TokenLogprobs, c.Logprobs.TokenLogprobs...)
				st.TopLogprobs = append(st.TopLogprobs, c.Logprobs.TopLogprobs...)
				st.TextOffset = append(st.TextOffset, c.Logprobs.TextOffset...)
			}
		}
	}
	if stText.String() != echo.Text || !reflect.DeepEqual(st, lp) {
		t.Errorf("stream %q %+v\nwant %q %+v", stText.String(), st, echo.Text, lp)
	}
}

// TestEchoScoreOnly: echo with max_tokens 0 returns the prompt and its
// logprobs alone (as evaluation harnesses ask), equal to teacher-forced
// scoring, with no completion tokens, one-shot and streamed, for n > 1;
// max_tokens 0 without echo stays an error.
func TestEchoScoreOnly(t *testing.T) {
	path := testutil.Shared(t, "models/gguf/stories260K.gguf")
	m, eng := storiesEngine(t, path, func(c *engine.Config) { c.KVDType = kvcache.F32 })
	be, err := NewEngineBackend(eng, m.Tokenizer(), "stories260K", m.Config.ContextLen, "")
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(New(be, Options{}).Handler())
	defer ts.Close()

	const text = "The cat sat on the mat"
	ids := m.Tokenizer().Encode(text, tokenizer.Options{AddSpecial: true})
	ref, err := generate.ScoreTokens(m, ids, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	code, b := post(t, ts, "/v1/completions", `{"prompt":"`+text+`","max_tokens":0,"echo":true,"logprobs":1,"n":2}`)
	if code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	got := decode[struct {
		Choices []struct {
			Text         string
			Logprobs     echoLogprobs
			FinishReason string `json:"finish_reason"`
		}
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		}
	}](t, b)
	if len(got.Choices) != 2 || got.Usage.CompletionTokens != 0 || got.Usage.PromptTokens != len(ids) {
		t.Fatalf("response %s", b)
	}
	for _, ch := range got.Choices {
		if ch.Text != text || ch.FinishReason != "length" || len(ch.Logprobs.TokenLogprobs) != len(ids) {
			t.Fatalf("choice %+v", ch)
		}
		for i := 1; i < len(ids); i++ {
			if d := math.Abs(*ch.Logprobs.TokenLogprobs[i] - float64(ref.Logprobs[i-1])); d > 1e-4 {
				t.Errorf("token %d: logprob %v, scoring %v", i, *ch.Logprobs.TokenLogprobs[i], ref.Logprobs[i-1])
			}
		}
	}
	code, b = post(t, ts, "/v1/completions", `{"prompt":"`+text+`","max_tokens":0,"echo":true,"stream":true}`)
	if code != 200 || !strings.Contains(string(b), `"text":"`+text+`"`) || !strings.Contains(string(b), `"finish_reason":"length"`) {
		t.Fatalf("stream %d %s", code, b)
	}
	if code, b = post(t, ts, "/v1/completions", `{"prompt":"x","max_tokens":0}`); code != 400 {
		t.Fatalf("max_tokens 0 without echo: %d %s", code, b)
	}
	// Stats are published after the step that ended the requests.
	deadline := time.Now().Add(5 * time.Second)
	for st := eng.Stats(); st.KV.Used != 0 || st.KV.Seqs != 0; st = eng.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("blocks held after score-only requests: %+v", st.KV)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestEchoTextOffset (issue 24, item 6): with echo and logprobs,
// text_offset indexes the returned text, as OpenAI's does: BOS, which the
// text does not show, and the first word's dropped dummy-prefix space
// take no room ("Once upon" gave [0,3,8], indexing the joined token
// strings; the text puts "upon"'s space at 4). Every token's visible text
// is found at its offset, for a text prompt and an id prompt, one-shot
// and streamed, the completion's offsets continuing after the prompt.
func TestEchoTextOffset(t *testing.T) {
	path := testutil.Shared(t, "models/gguf/stories260K.gguf")
	m, eng := storiesEngine(t, path, func(c *engine.Config) { c.KVDType = kvcache.F32 })
	be, err := NewEngineBackend(eng, m.Tokenizer(), "stories260K", m.Config.ContextLen, "")
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(New(be, Options{}).Handler())
	defer ts.Close()
	type choice struct {
		Text     string
		Logprobs echoLogprobs
	}
	check := func(name, text string, lp echoLogprobs) {
		t.Helper()
		runes := []rune(text)
		prev := 0
		for i, off := range lp.TextOffset {
			if off < prev || off > len(runes) {
				t.Fatalf("%s: text_offset %v not ascending within %q", name, lp.TextOffset, text)
			}
			prev = off
			tok := strings.TrimPrefix(lp.Tokens[i], " ")
			if lp.Tokens[i] == "<s>" {
				tok = ""
			}
			if at := string(runes[off:]); !strings.HasPrefix(at, tok) && !strings.HasPrefix(at, lp.Tokens[i]) {
				t.Errorf("%s: token %d %q at offset %d, but the text there is %q", name, i, lp.Tokens[i], off, at)
			}
		}
	}
	code, b := post(t, ts, "/v1/completions", `{"prompt":"Once upon","max_tokens":0,"echo":true,"logprobs":1}`)
	if code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	got := decode[struct{ Choices []choice }](t, b).Choices[0]
	if got.Text != "Once upon" || !reflect.DeepEqual(got.Logprobs.TextOffset, []int{0, 0, 4}) {
		t.Errorf("\"Once upon\": text %q, tokens %q, text_offset %v; want [0 0 4]", got.Text, got.Logprobs.Tokens, got.Logprobs.TextOffset)
	}
	ids := m.Tokenizer().Encode("Once upon a time, there was a little girl named Lily. She loved to play", tokenizer.Options{AddSpecial: true})
	idJSON, _ := json.Marshal(ids)
	for _, prompt := range []string{`"Once upon a time, there was a little girl named Lily. She loved to play"`, string(idJSON)} {
		req := `{"prompt":` + prompt + `,"max_tokens":6,"temperature":0,"ignore_eos":true,"echo":true,"logprobs":1`
		code, b := post(t, ts, "/v1/completions", req+`}`)
		if code != 200 {
			t.Fatalf("%d %s", code, b)
		}
		one := decode[struct{ Choices []choice }](t, b).Choices[0]
		check(prompt[:10], one.Text, one.Logprobs)
		if n := len(ids); one.Logprobs.TextOffset[n] != len([]rune(one.Text))-len([]rune(strings.Join(one.Logprobs.Tokens[n:], ""))) {
			t.Errorf("%s: completion starts at %d in %q", prompt[:10], one.Logprobs.TextOffset[n], one.Text)
		}
		var st echoLogprobs
		var text strings.Builder
		for _, ev := range postStream(t, ts, "/v1/completions", req+`,"stream":true}`) {
			if ev == "[DONE]" {
				continue
			}
			var ch struct {
				Choices []struct {
					Text     string
					Logprobs *echoLogprobs
				}
			}
			if err := json.Unmarshal([]byte(ev), &ch); err != nil {
				t.Fatal(err)
			}
			for _, c := range ch.Choices {
				text.WriteString(c.Text)
				if c.Logprobs != nil {
					st.Tokens = append(st.Tokens, c.Logprobs.Tokens...)
					st.TextOffset = append(st.TextOffset, c.Logprobs.TextOffset...)
				}
			}
		}
		if text.String() != one.Text || !reflect.DeepEqual(st.TextOffset, one.Logprobs.TextOffset) {
			t.Errorf("%s: stream %q %v, one-shot %q %v", prompt[:10], text.String(), st.TextOffset, one.Text, one.Logprobs.TextOffset)
		}
	}
}
