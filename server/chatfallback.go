package server

import (
	"net/http"
	"strings"

	"pagoda/jinja"
	"pagoda/tokenizer"
)

// ChatMLTemplate is the template used for a model that ships none, as
// llama-server does: ChatML, with Hermes-style tool calls (as Qwen 2.5
// writes them) so that tools and forced tool calls work through the same
// parser and grammar as on a model that has the format.
const ChatMLTemplate = `{%- if tools %}{{- '<|im_start|>system\n' }}{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}` +
	`{{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}` +
	`{%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}` +
	`{{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}` +
	`{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}{%- endif %}` +
	`{%- for message in messages %}` +
	`{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}` +
	`{%- elif message.role == 'system' and not loop.first %}{{- '<|im_start|>system\n' + message.content + '<|im_end|>\n' }}` +
	`{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant' }}{%- if message.content %}{{- '\n' + message.content }}{%- endif %}` +
	`{%- for tc in message.tool_calls %}{%- if tc.function is defined %}{%- set tc = tc.function %}{%- endif %}` +
	`{{- '\n<tool_call>\n{"name": "' + tc.name + '", "arguments": ' }}{%- if tc.arguments is string %}{{- tc.arguments }}{%- else %}{{- tc.arguments | tojson }}{%- endif %}{{- '}\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\n' }}` +
	`{%- elif message.role == 'tool' %}{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}` +
	`{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}` +
	`{%- endif %}{%- endfor %}` +
	`{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}`

// Chat template kinds, as the X-Pagoda-Chat-Template header and the log
// name them.
const (
	TemplateModel    = "model"           // the model's own template
	TemplateCustom   = "custom"          // --chat-template
	TemplateBuiltin  = "built-in"        // the template shipped with the built-in model
	TemplateFallback = "chatml-fallback" // the model has none: ChatML
)

// ChatTemplate is the template a model chats with, how it was chosen,
// and the text that ends an assistant turn when the vocabulary has no
// token for it (ChatML's <|im_end|> on a model without that token).
type ChatTemplate struct {
	Source string
	Kind   string
	Stops  []string
}

// ResolveChatTemplate picks the template as the server and `run --chat`
// both do: override (a --chat-template file), else the vocabulary's,
// else ChatML.
func ResolveChatTemplate(override string, v *tokenizer.Vocab) ChatTemplate {
	switch {
	case override != "":
		return ChatTemplate{Source: override, Kind: TemplateCustom}
	case v != nil && v.ChatTemplate != "":
		return ChatTemplate{Source: v.ChatTemplate, Kind: TemplateModel}
	}
	return ChatTemplate{Source: ChatMLTemplate, Kind: TemplateFallback, Stops: []string{"<|im_end|>"}}
}

// FallbackNote is the one-line notice for a template that is not the
// model's own; "" for the model's own or a custom one.
func (t ChatTemplate) FallbackNote() string {
	switch t.Kind {
	case TemplateFallback:
		return "the model has no chat template: using ChatML, as llama-server does (pass --chat-template FILE to choose one)"
	case TemplateBuiltin:
		return "the built-in story model was not trained to chat: its shipped template frames the chat as a dialogue in a story"
	}
	return ""
}

// ChatTemplateInfoer is optionally implemented by a Backend to say which
// chat template it renders with and what ends a turn.
type ChatTemplateInfoer interface {
	ChatTemplateInfo() ChatTemplate
}

// withBOS puts the BOS token's text before a prompt rendered by a
// template that is not the model's own, when the vocabulary adds BOS:
// ChatML and the built-in template do not write it, and a model that
// expects it goes astray without.
func (t ChatTemplate) withBOS(text, bos string, addBOS bool) string {
	if t.Kind == TemplateModel || t.Kind == TemplateCustom || !addBOS || bos == "" || strings.HasPrefix(text, bos) {
		return text
	}
	return bos + text
}

// RenderPrompt renders msgs for `run --chat` exactly as the server does.
func (t ChatTemplate) RenderPrompt(msgs []jinja.Message, v *tokenizer.Vocab) (string, error) {
	o := jinja.ChatOptions{AddGenerationPrompt: true}
	if v.BOS >= 0 && int(v.BOS) < v.Size() {
		o.BOSToken = v.Tokens[v.BOS]
	}
	if v.EOS >= 0 && int(v.EOS) < v.Size() {
		o.EOSToken = v.Tokens[v.EOS]
	}
	text, err := jinja.RenderChat(t.Source, msgs, o)
	if err != nil {
		return "", err
	}
	return t.withBOS(text, o.BOSToken, v.AddBOS), nil
}

// templateInfo is the Backend's chat template, when it says.
func (s *Server) templateInfo() (ChatTemplate, bool) {
	ti, ok := s.b.(ChatTemplateInfoer)
	if !ok {
		return ChatTemplate{}, false
	}
	return ti.ChatTemplateInfo(), true
}

// templateHeader names the chat template on a chat response when it is
// not the model's own, so a client can tell a fallback from the real thing.
func (s *Server) templateHeader(w http.ResponseWriter) {
	if ct, ok := s.templateInfo(); ok && ct.Kind != "" {
		w.Header().Set("X-Pagoda-Chat-Template", ct.Kind)
	}
}
