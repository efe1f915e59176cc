package jinja

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Message is one chat turn as the OpenAI API carries it.
type Message struct {
	Role       string
	Content    string
	ToolCalls  []ToolCall `json:",omitempty"`
	Name       string
	ToolCallID string
}

// ToolCall is an assistant's function call. Arguments is the JSON text the
// API carries.
type ToolCall struct {
	ID       string
	Type     string
	Function struct {
		Name      string
		Arguments string
	}
}

// ChatOptions are the extra variables apply_chat_template passes.
type ChatOptions struct {
	AddGenerationPrompt bool
	BOSToken, EOSToken  string
	// Tools are the tool schemas (usually {"type":"function","function":…}).
	// Elements may be json.RawMessage to keep the client's key order in
	// tojson output; maps are rendered with sorted keys.
	Tools []any
	// Extra variables, e.g. "enable_thinking": false. They override the
	// built-in ones.
	Extra map[string]any
}

// messageValue converts a Message into the dict a template sees. As vLLM
// does, tool-call arguments that are a JSON object are passed as a mapping
// (templates such as Llama 3.1's apply tojson to them); anything else stays
// a string.
func messageValue(m Message) (*Dict, error) {
	d := NewDict()
	d.Set("role", m.Role)
	d.Set("content", m.Content)
	if m.Name != "" {
		d.Set("name", m.Name)
	}
	if m.ToolCallID != "" {
		d.Set("tool_call_id", m.ToolCallID)
	}
	if len(m.ToolCalls) > 0 {
		calls := &List{}
		for _, tc := range m.ToolCalls {
			c := NewDict()
			if tc.ID != "" {
				c.Set("id", tc.ID)
			}
			typ := tc.Type
			if typ == "" {
				typ = "function"
			}
			c.Set("type", typ)
			fn := NewDict()
			fn.Set("name", tc.Function.Name)
			var args any = tc.Function.Arguments
			if a := strings.TrimSpace(tc.Function.Arguments); strings.HasPrefix(a, "{") {
				v, err := FromJSON([]byte(a))
				if err != nil {
					return nil, fmt.Errorf("tool call %q: arguments are not valid JSON: %w", tc.Function.Name, err)
				}
				args = v
			}
			fn.Set("arguments", args)
			c.Set("function", fn)
			calls.Items = append(calls.Items, c)
		}
		d.Set("tool_calls", calls)
	}
	return d, nil
}

// RenderChat renders a model's chat template the way HF transformers'
// apply_chat_template does: variables messages, tools and documents (None
// when absent), add_generation_prompt, bos_token and eos_token, plus
// o.Extra.
func RenderChat(template string, msgs []Message, o ChatOptions) (string, error) {
	t, err := Parse(template)
	if err != nil {
		return "", err
	}
	return t.RenderChat(msgs, o)
}

// RenderChat is RenderChat with an already parsed template.
func (t *Template) RenderChat(msgs []Message, o ChatOptions) (string, error) {
	list := &List{}
	for i, m := range msgs {
		d, err := messageValue(m)
		if err != nil {
			return "", fmt.Errorf("jinja: message %d: %w", i, err)
		}
		list.Items = append(list.Items, d)
	}
	vars := map[string]any{
		"messages":              list,
		"add_generation_prompt": o.AddGenerationPrompt,
		"bos_token":             o.BOSToken,
		"eos_token":             o.EOSToken,
		"tools":                 nil,
		"documents":             nil,
	}
	if len(o.Tools) > 0 {
		tools := &List{}
		for i, tl := range o.Tools {
			var v any
			var err error
			switch x := tl.(type) {
			case json.RawMessage:
				v, err = FromJSON(x)
			case []byte:
				v, err = FromJSON(x)
			default:
				v, err = FromGo(x)
			}
			if err != nil {
				return "", fmt.Errorf("jinja: tool %d: %w", i, err)
			}
			tools.Items = append(tools.Items, v)
		}
		vars["tools"] = tools
	}
	for k, v := range o.Extra {
		vars[k] = v
	}
	return t.Execute(vars)
}

// TemplateFromConfig extracts the chat template from a tokenizer_config.json
// "chat_template" value: a string, or a list of {"name","template"} entries
// from which name ("default" when empty) is chosen.
func TemplateFromConfig(configJSON []byte, name string) (string, error) {
	var cfg struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
	}
	if err := json.Unmarshal(configJSON, &cfg); err != nil {
		return "", fmt.Errorf("jinja: tokenizer config: %w", err)
	}
	if len(cfg.ChatTemplate) == 0 || string(cfg.ChatTemplate) == "null" {
		return "", fmt.Errorf("jinja: tokenizer config has no chat_template")
	}
	var s string
	if err := json.Unmarshal(cfg.ChatTemplate, &s); err == nil {
		return s, nil
	}
	var named []struct{ Name, Template string }
	if err := json.Unmarshal(cfg.ChatTemplate, &named); err != nil {
		return "", fmt.Errorf("jinja: chat_template is neither a string nor a list of named templates")
	}
	if name == "" {
		name = "default"
	}
	for _, n := range named {
		if n.Name == name {
			return n.Template, nil
		}
	}
	return "", fmt.Errorf("jinja: chat_template has no template named %q", name)
}
