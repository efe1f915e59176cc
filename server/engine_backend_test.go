package server

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"pagoda/engine"
	"pagoda/model"
	"pagoda/testutil"
	"pagoda/tokenizer"
)

// chainModel is a stand-in forward pass: the next token is a fixed
// function of the current one, with logit 10 against 0 for the rest.
type chainModel struct{ vocab int }

func chainNext(id int32, vocab int) int32 { return 3 + (id*31+7)%int32(vocab-3) }

func (m chainModel) Forward(b *model.Batch, _ model.KVCache) ([]float32, error) {
	var out []float32
	for i, tok := range b.Tokens {
		if (b.Logits == nil && i == len(b.Tokens)-1) || (b.Logits != nil && b.Logits[i]) {
			row := make([]float32, m.vocab)
			row[chainNext(tok, m.vocab)] = 10
			out = append(out, row...)
		}
	}
	return out, nil
}

const testTemplate = "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}" +
	"{% if tools %}({{ tools | length }} tools){% endif %}{% if add_generation_prompt %}[assistant]{% endif %}"

// TestEngineBackend runs the server over the real engine and the real
// stories260K tokenizer (with a stand-in forward pass).
func TestEngineBackend(t *testing.T) {
	tok, err := tokenizer.Load(testutil.Shared(t, "models/gguf/stories260K.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	vocab := tok.Vocab().Size()
	eng, err := engine.New(chainModel{vocab}, tok, engine.Config{NLayer: 1, NKVHead: 1, HeadDim: 4,
		VocabSize: vocab, ContextLen: 128})
	if err != nil {
		t.Fatal(err)
	}
	eng.Start()
	defer eng.Stop(context.Background())
	be, err := NewEngineBackend(eng, tok, "stories260K", 128, testTemplate)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(New(be, Options{}).Handler())
	defer ts.Close()

	expect := func(prompt []int32, n int) []int32 {
		var out []int32
		last := prompt[len(prompt)-1]
		for range n {
			last = chainNext(last, vocab)
			out = append(out, last)
		}
		return out
	}
	prompt := tok.Encode("Once upon a time", tokenizer.Options{AddSpecial: true, ParseSpecial: true})
	want := expect(prompt, 8)
	code, b := post(t, ts, "/v1/completions", `{"prompt":"Once upon a time","max_tokens":8,"temperature":0,"logprobs":1}`)
	if code != 200 {
		t.Fatal(code, string(b))
	}
	var cr struct {
		Choices []struct {
			Text         string `json:"text"`
			FinishReason string `json:"finish_reason"`
			Logprobs     struct {
				Tokens        []string             `json:"tokens"`
				TokenLogprobs []float64            `json:"token_logprobs"`
				TopLogprobs   []map[string]float64 `json:"top_logprobs"`
			} `json:"logprobs"`
		} `json:"choices"`
		Usage usageJSON `json:"usage"`
	}
	if err := json.Unmarshal(b, &cr); err != nil {
		t.Fatal(err)
	}
	c := cr.Choices[0]
	if wantText := tok.Decode(want); c.Text != wantText || c.FinishReason != "length" {
		t.Fatalf("text %q (%s), want %q", c.Text, c.FinishReason, wantText)
	}
	if cr.Usage.PromptTokens != len(prompt) || cr.Usage.CompletionTokens != 8 {
		t.Fatalf("usage %+v, prompt %d tokens", cr.Usage, len(prompt))
	}
	wantLP := 10 - math.Log(math.Exp(10)+float64(vocab-1))
	for i, lp := range c.Logprobs.TokenLogprobs {
		if math.Abs(lp-wantLP) > 1e-3 || c.Logprobs.Tokens[i] != be.TokenText(want[i]) || len(c.Logprobs.TopLogprobs[i]) != 1 {
			t.Fatalf("logprobs[%d]: %v %q %v, want %.5f %q", i, lp, c.Logprobs.Tokens[i], c.Logprobs.TopLogprobs[i], wantLP, be.TokenText(want[i]))
		}
	}

	// Chat through the template, streamed, n = 2, with a stop string cut
	// from the expected text.
	body := `{"messages":[{"role":"user","content":"hi"}],"max_tokens":12,"n":2,"temperature":0,"stream":true,
		"stream_options":{"include_usage":true},"tools":[{"type":"function","function":{"name":"f","parameters":{}}}]}`
	ev := postStream(t, ts, "/v1/chat/completions", body)
	texts, usage := checkStream(t, ev, true, 2, true)
	rendered, err := be.ApplyChat([]ChatMessage{{Role: "user", Content: "hi"}}, true, map[string]any{"tools": []any{json.RawMessage(`{}`)}})
	if err != nil {
		t.Fatal(err)
	}
	chatPrompt := be.Tokenize(rendered, false)
	wantChat := tok.Decode(expect(chatPrompt, 12))
	if texts[0] != wantChat || texts[1] != wantChat {
		t.Fatalf("chat texts %q, want %q (rendered %q)", texts, wantChat, rendered)
	}
	if usage.Usage.PromptTokens != len(chatPrompt) || usage.Usage.CompletionTokens != 24 {
		t.Fatalf("chat usage %+v, prompt %d", usage.Usage, len(chatPrompt))
	}
	if !strings.HasPrefix(rendered, "<s>[user] hi\n(1 tools)") {
		t.Fatalf("rendered %q", rendered)
	}

	// Errors from the engine side of the path.
	long := strings.Repeat("a b c d ", 80)
	if code, b := post(t, ts, "/v1/completions", `{"prompt":"`+long+`"}`); code != 400 || !strings.Contains(string(b), "maximum context length is 128") {
		t.Fatalf("too long: %d %s", code, b)
	}

	// A client that goes away mid-stream frees its sequence in the engine.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/v1/completions", strings.NewReader(`{"prompt":"hi","max_tokens":100,"stream":true}`))
	req.Header.Set("Content-Type", "application/json")
	if resp, err := ts.Client().Do(req); err == nil {
		for buf := make([]byte, 16); err == nil; _, err = resp.Body.Read(buf) {
		}
		resp.Body.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := eng.Stats()
		if st.Running == 0 && st.Waiting == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("engine still busy after the client left: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestEngineBackendKVLimit: with no max_tokens the engine decides how far
// a request may run, so a KV cache smaller than the context is no error.
func TestEngineBackendKVLimit(t *testing.T) {
	tok, err := tokenizer.Load(testutil.Shared(t, "models/gguf/stories260K.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	vocab := tok.Vocab().Size()
	eng, err := engine.New(chainModel{vocab}, tok, engine.Config{NLayer: 1, NKVHead: 1, HeadDim: 4,
		VocabSize: vocab, ContextLen: 256, BlockSize: 16, KVBlocks: 4})
	if err != nil {
		t.Fatal(err)
	}
	eng.Start()
	defer eng.Stop(context.Background())
	be, err := NewEngineBackend(eng, tok, "m", 256, testTemplate)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(New(be, Options{}).Handler())
	defer ts.Close()
	code, b := post(t, ts, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`)
	if code != 200 {
		t.Fatal(code, string(b))
	}
	r := decode[complResp](t, b)
	if *r.Choices[0].FinishReason != "length" || r.Usage.PromptTokens+r.Usage.CompletionTokens != 64 {
		t.Fatalf("finish %s, usage %+v: want the 64-token KV cache filled", *r.Choices[0].FinishReason, r.Usage)
	}
	// An explicit max_tokens beyond the KV cache is the client's error.
	if code, b := post(t, ts, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":100}`); code != 400 ||
		!strings.Contains(string(b), "KV cache") {
		t.Fatalf("%d %s", code, b)
	}
}

func TestEngineBackendTokenText(t *testing.T) {
	tok, err := tokenizer.Load(testutil.Shared(t, "models/gguf/stories260K.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	be, err := NewEngineBackend(chainSubmitter{}, tok, "m", 64, "")
	if err != nil {
		t.Fatal(err)
	}
	v := tok.Vocab()
	if got := be.TokenText(v.EOS); got != v.Tokens[v.EOS] {
		t.Fatalf("EOS text %q", got)
	}
	// Byte tokens <0x80>.. are partial UTF-8 on their own.
	found := false
	for id := int32(0); int(id) < v.Size(); id++ {
		if v.Tokens[id] == "<0xE2>" {
			found = true
			if got := be.TokenText(id); got != `bytes:\xe2` {
				t.Fatalf("byte token text %q", got)
			}
		}
	}
	if !found {
		t.Fatal("stories260K has no <0xE2> byte token?")
	}
	// No template in the model: ChatML after BOS (the vocabulary adds one), announced as the fallback.
	if got, err := be.ApplyChat([]ChatMessage{{Role: "system", Content: "s"}, {Role: "user", Content: "x"}}, true, nil); err != nil ||
		got != "<s><|im_start|>system\ns<|im_end|>\n<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n" {
		t.Fatalf("fallback: %q %v", got, err)
	}
	if ct := be.ChatTemplateInfo(); ct.Kind != TemplateFallback || len(ct.Stops) != 1 || detectToolFormat(ct.Source) != toolHermes {
		t.Fatalf("fallback info %+v", ct.Kind)
	}
	if _, err := NewEngineBackend(chainSubmitter{}, tok, "m", 64, "{% if %}"); err == nil {
		t.Fatal("a broken template must fail at start-up")
	}
	be2, _ := NewEngineBackend(chainSubmitter{}, tok, "m", 64, testTemplate)
	s, err := be2.ApplyChat([]ChatMessage{{Role: "assistant", ToolCalls: []any{map[string]any{"id": "c1", "type": "function",
		"function": map[string]any{"name": "f", "arguments": `{"a":1}`}}}}}, false, nil)
	if err != nil || s != "<s>[assistant] \n" {
		t.Fatalf("tool calls: %q %v", s, err)
	}
}

type chainSubmitter struct{}

func (chainSubmitter) Submit(context.Context, *engine.Request) (<-chan engine.Event, error) {
	return nil, engine.ErrStopped
}
