package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"

	"pagoda/engine"
	"pagoda/grammar"
	"pagoda/jinja"
	"pagoda/tokenizer"
)

// Submitter is the part of *engine.Engine that EngineBackend uses.
type Submitter interface {
	Submit(ctx context.Context, r *engine.Request) (<-chan engine.Event, error)
}

// EngineBackend is the Backend over Pagoda's engine, a tokenizer and a
// Jinja chat template.
type EngineBackend struct {
	eng    Submitter
	tok    tokenizer.Tokenizer
	name   string
	ctxLen int
	tmpl   *jinja.Template
	ct     ChatTemplate // tmpl's source and how it was chosen
	info   ModelInfo

	gvOnce sync.Once
	gv     *grammar.Vocab
}

// GrammarVocab indexes the vocabulary for constrained sampling, once, on
// the first request that needs it.
func (b *EngineBackend) GrammarVocab() *grammar.Vocab {
	b.gvOnce.Do(func() { b.gv = grammar.NewVocab(b.tok) })
	return b.gv
}

// Grammars is the engine's constraint cache, when the engine has one
// (engine.Engine.Grammars): the server checks schemas in it, so the
// engine finds them compiled at Submit.
func (b *EngineBackend) Grammars() *grammar.Cache {
	if g, ok := b.eng.(GrammarCacher); ok {
		return g.Grammars()
	}
	return nil
}

// NewEngineBackend builds the Backend. chatTemplate overrides the
// template in the tokenizer's vocabulary; with neither, chat uses ChatML
// (ResolveChatTemplate).
func NewEngineBackend(eng Submitter, tok tokenizer.Tokenizer, name string, contextLen int, chatTemplate string) (*EngineBackend, error) {
	if eng == nil || tok == nil {
		return nil, errors.New("server: engine backend needs an engine and a tokenizer")
	}
	b := &EngineBackend{eng: eng, tok: tok, name: name, ctxLen: contextLen}
	if err := b.SetChatTemplate(ResolveChatTemplate(chatTemplate, tok.Vocab())); err != nil {
		return nil, err
	}
	return b, nil
}

// SetChatTemplate replaces the chat template (the built-in model's, say).
func (b *EngineBackend) SetChatTemplate(ct ChatTemplate) error {
	t, err := jinja.Parse(ct.Source)
	if err != nil {
		return fmt.Errorf("server: parsing the chat template: %w", err)
	}
	b.tmpl, b.ct = t, ct
	return nil
}

// ChatTemplateSource is the template's text, so the server can choose a
// tool-call parser.
func (b *EngineBackend) ChatTemplateSource() string { return b.ct.Source }

// ChatTemplateInfo says which template chat renders with.
func (b *EngineBackend) ChatTemplateInfo() ChatTemplate { return b.ct }

func (b *EngineBackend) ModelName() string { return b.name }
func (b *EngineBackend) ContextLen() int   { return b.ctxLen }
func (b *EngineBackend) VocabSize() int    { return b.tok.Vocab().Size() }

// Tokenize parses special-token text ("<|im_start|>") as the special
// token, as HF tokenizers do by default; chat templates rely on it.
func (b *EngineBackend) Tokenize(text string, addSpecial bool) []int32 {
	return b.tok.Encode(text, tokenizer.Options{AddSpecial: addSpecial, ParseSpecial: true})
}

func (b *EngineBackend) Detokenize(ids []int32) string { return b.tok.Decode(ids) }

// TokenText is the token's own text; control tokens (no output bytes) are
// shown by their vocabulary string, and bytes that are not valid UTF-8 on
// their own as "bytes:\xNN…".
func (b *EngineBackend) TokenText(id int32) string {
	v := b.tok.Vocab()
	if id < 0 || int(id) >= v.Size() {
		return ""
	}
	raw := b.tok.TokenBytes(id)
	if len(raw) == 0 {
		return v.Tokens[id]
	}
	if utf8.Valid(raw) {
		return string(raw)
	}
	var sb strings.Builder
	sb.WriteString("bytes:")
	for _, c := range raw {
		fmt.Fprintf(&sb, "\\x%02x", c)
	}
	return sb.String()
}

func (b *EngineBackend) Submit(ctx context.Context, r *engine.Request) (<-chan engine.Event, error) {
	return b.eng.Submit(ctx, r)
}

// ApplyChat renders msgs with the template. extra["tools"] becomes the
// template's tools; every other key is passed as a template variable.
func (b *EngineBackend) ApplyChat(msgs []ChatMessage, addGenerationPrompt bool, extra map[string]any) (string, error) {
	v := b.tok.Vocab()
	o := jinja.ChatOptions{AddGenerationPrompt: addGenerationPrompt, Extra: map[string]any{}}
	if v.BOS >= 0 && int(v.BOS) < v.Size() {
		o.BOSToken = v.Tokens[v.BOS]
	}
	if v.EOS >= 0 && int(v.EOS) < v.Size() {
		o.EOSToken = v.Tokens[v.EOS]
	}
	for k, x := range extra {
		if k == "tools" {
			if tools, ok := x.([]any); ok {
				o.Tools = tools
				continue
			}
		}
		o.Extra[k] = x
	}
	jm := make([]jinja.Message, len(msgs))
	for i, m := range msgs {
		jm[i] = jinja.Message{Role: m.Role, Content: m.Content, Name: m.Name, ToolCallID: m.ToolCallID}
		if len(m.ToolCalls) > 0 {
			// Re-decode the client's tool calls into jinja's typed form.
			raw, err := json.Marshal(m.ToolCalls)
			if err != nil {
				return "", fmt.Errorf("message %d: tool_calls: %w", i, err)
			}
			var calls []struct {
				ID       string `json:"id"`
				Type     string `json:"type"`
				Function struct {
					Name      string          `json:"name"`
					Arguments json.RawMessage `json:"arguments"`
				} `json:"function"`
			}
			if err := json.Unmarshal(raw, &calls); err != nil {
				return "", fmt.Errorf("message %d: tool_calls: %w", i, err)
			}
			for _, c := range calls {
				tc := jinja.ToolCall{ID: c.ID, Type: c.Type}
				tc.Function.Name = c.Function.Name
				// OpenAI sends arguments as a JSON string; accept an object too.
				var s string
				if json.Unmarshal(c.Function.Arguments, &s) == nil {
					tc.Function.Arguments = s
				} else {
					tc.Function.Arguments = string(c.Function.Arguments)
				}
				jm[i].ToolCalls = append(jm[i].ToolCalls, tc)
			}
		}
	}
	text, err := b.tmpl.RenderChat(jm, o)
	if err != nil {
		return "", err
	}
	return b.ct.withBOS(text, o.BOSToken, v.AddBOS), nil
}
