package server

import (
	"context"
	"fmt"
	"net/http/httptest"
	"testing"

	"pagoda/engine"
	"pagoda/model"
	"pagoda/tokenizer"
)

type toolReply struct {
	Choices []struct {
		Message struct {
			Content   *string
			ToolCalls []toolCallOut `json:"tool_calls"`
		}
		FinishReason string `json:"finish_reason"`
	}
}

type toolChunk struct {
	Choices []struct {
		Delta struct {
			Content   *string
			ToolCalls []toolCallDelta `json:"tool_calls"`
		}
		FinishReason *string `json:"finish_reason"`
	}
}

// scriptModel is a stand-in forward pass that makes each sequence
// generate script, token after token, whatever its prompt.
type scriptModel struct {
	vocab  int
	script []int32
	base   map[int32]int32 // per sequence: the position of its last prompt token
}

func (m *scriptModel) Forward(b *model.Batch, _ model.KVCache) ([]float32, error) {
	var out []float32
	for i := range b.Tokens {
		if !b.Logits[i] {
			continue
		}
		base, ok := m.base[b.Seq[i]]
		if !ok {
			base = b.Pos[i]
			m.base[b.Seq[i]] = base
		}
		k := int(b.Pos[i] - base)
		row := make([]float32, m.vocab)
		row[m.script[min(k, len(m.script)-1)]] = 10
		out = append(out, row...)
	}
	return out, nil
}

// specialVocab is a byte-fallback SentencePiece vocabulary whose tool-call
// markers are control tokens, as in Mistral's and Llama 3.1's GGUFs.
func specialVocab(t *testing.T, markers ...string) (tokenizer.Tokenizer, map[string]int32) {
	v := &tokenizer.Vocab{Model: "llama", BOS: 1, EOS: 2, UNK: 0, PAD: -1, EOT: -1, AddBOS: true}
	add := func(s string, ty int32) int32 {
		v.Tokens = append(v.Tokens, s)
		v.Scores = append(v.Scores, 0)
		v.Types = append(v.Types, ty)
		return int32(len(v.Tokens) - 1)
	}
	add("<unk>", tokenizer.TypeUnknown)
	add("<s>", tokenizer.TypeControl)
	add("</s>", tokenizer.TypeControl)
	for b := range 256 {
		add(fmt.Sprintf("<0x%02X>", b), tokenizer.TypeByte)
	}
	ids := map[string]int32{}
	for _, m := range markers {
		ids[m] = add(m, tokenizer.TypeControl)
	}
	tok, err := tokenizer.NewSPM(v)
	if err != nil {
		t.Fatal(err)
	}
	return tok, ids
}

// TestToolCallsSpecialTokens: tool-call markers that are control tokens
// (which detokenization normally drops) still reach the tool-call parser,
// for Mistral's [TOOL_CALLS] and Llama 3.1's <|python_tag|>, streamed and
// not; without tools they stay hidden.
func TestToolCallsSpecialTokens(t *testing.T) {
	cases := []struct {
		name, tmpl, marker, body string
	}{
		{"mistral", "{% for m in messages %}{{ m.content }}{% endfor %}[TOOL_CALLS]", "[TOOL_CALLS]",
			`[{"name":"get_weather","arguments":{"city":"Paris"}}]`},
		{"llama3.1", `<|start_header_id|>{% for m in messages %}{{ m.content }}{% endfor %}"parameters"<|python_tag|>`, "<|python_tag|>",
			`{"name":"get_weather","parameters":{"city":"Paris"}}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tok, ids := specialVocab(t, tc.marker)
			script := append([]int32{ids[tc.marker]}, tok.Encode(tc.body, tokenizer.Options{})...)
			script = append(script, 2) // EOS
			vocab := tok.Vocab().Size()
			eng, err := engine.New(&scriptModel{vocab: vocab, script: script, base: map[int32]int32{}}, tok,
				engine.Config{NLayer: 1, NKVHead: 1, HeadDim: 4, VocabSize: vocab, ContextLen: 256})
			if err != nil {
				t.Fatal(err)
			}
			eng.Start()
			defer eng.Stop(context.Background())
			be, err := NewEngineBackend(eng, tok, "m", 256, tc.tmpl)
			if err != nil {
				t.Fatal(err)
			}
			ts := httptest.NewServer(New(be, Options{}).Handler())
			defer ts.Close()
			tools := `"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]`
			code, b := post(t, ts, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"temperature":0,`+tools+`}`)
			if code != 200 {
				t.Fatal(code, string(b))
			}
			r := decode[toolReply](t, b)
			ch := r.Choices[0]
			if ch.FinishReason != "tool_calls" || len(ch.Message.ToolCalls) != 1 || ch.Message.ToolCalls[0].Function.Name != "get_weather" ||
				ch.Message.ToolCalls[0].Function.Arguments != `{"city":"Paris"}` {
				t.Errorf("non-streaming: %s", b)
			}
			events := postStream(t, ts, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"temperature":0,"stream":true,`+tools+`}`)
			var name, args, finish, content string
			for _, e := range events {
				if e == "[DONE]" {
					continue
				}
				c := decode[toolChunk](t, []byte(e))
				for _, ch := range c.Choices {
					if ch.Delta.Content != nil {
						content += *ch.Delta.Content
					}
					for _, d := range ch.Delta.ToolCalls {
						name += d.Function.Name
						args += d.Function.Arguments
					}
					if ch.FinishReason != nil {
						finish = *ch.FinishReason
					}
				}
			}
			if finish != "tool_calls" || name != "get_weather" || args != `{"city":"Paris"}` || content != "" {
				t.Errorf("streaming: finish %q name %q args %q content %q", finish, name, args, content)
			}
			// Without tools the control token renders as nothing.
			code, b = post(t, ts, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"temperature":0}`)
			if r := decode[struct {
				Choices []struct{ Message struct{ Content string } }
			}](t, b); code != 200 || r.Choices[0].Message.Content != tc.body {
				t.Errorf("without tools: %d %s", code, b)
			}
		})
	}
}
