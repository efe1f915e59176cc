package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"pagoda/engine"
)

// Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens), as
// llama-server and vLLM serve it: system prompts, multi-turn, tools as
// tool_use / tool_result blocks over the same tool-call parsing and
// constrained decoding as /v1/chat/completions, streaming in Anthropic's
// event order, and its error shape. The key may come as x-api-key.

func (s anthropicAPI) registerAnthropic(m *http.ServeMux) {
	m.HandleFunc("POST /v1/messages", s.anthropicAuth(s.handleMessages))
	m.HandleFunc("POST /v1/messages/count_tokens", s.anthropicAuth(s.handleCountTokens))
}

func (s anthropicAPI) anthropicAuth(h http.HandlerFunc) http.HandlerFunc {
	if s.o.APIKey == "" {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.keyOK(r) {
			anthropicError(w, &apiError{Status: http.StatusUnauthorized, Type: "authentication_error",
				Message: "missing or incorrect API key (x-api-key: <key>, or Authorization: Bearer <key>)"})
			return
		}
		h(w, r)
	}
}

// anthropicType maps a status to Anthropic's error type.
func anthropicType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable:
		return "overloaded_error"
	}
	if status >= 400 && status < 500 {
		return "invalid_request_error"
	}
	return "api_error"
}

func anthropicErrorBody(ae *apiError) map[string]any {
	typ := anthropicType(ae.Status)
	if ae.Type == "authentication_error" {
		typ = ae.Type
	}
	return map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": ae.Message}}
}

func anthropicError(w http.ResponseWriter, ae *apiError) {
	w.Header().Set("Content-Type", "application/json")
	if ae.Status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(ae.Status)
	b, _ := marshal(anthropicErrorBody(ae))
	_, _ = w.Write(b)
}

type anthropicRequest struct {
	Model         string             `json:"model"`
	MaxTokens     *int               `json:"max_tokens"`
	Messages      []anthropicMessage `json:"messages"`
	System        json.RawMessage    `json:"system"`
	StopSequences []string           `json:"stop_sequences"`
	Stream        bool               `json:"stream"`
	Temperature   *float64           `json:"temperature"`
	TopP          *float64           `json:"top_p"`
	TopK          *int               `json:"top_k"`
	Tools         []anthropicTool    `json:"tools"`
	ToolChoice    *anthropicChoice   `json:"tool_choice"`
	Metadata      json.RawMessage    `json:"metadata"`
	Thinking      json.RawMessage    `json:"thinking"`
	ServiceTier   string             `json:"service_tier"`
}

type anthropicMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type anthropicBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error"`
}

type anthropicTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
}

type anthropicChoice struct {
	Type string `json:"type"`
	Name string `json:"name"`
}

// blocks reads content: a string or a list of blocks.
func blocks(raw json.RawMessage, where string) ([]anthropicBlock, *apiError) {
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return nil, badRequest(where, "%s: content is required", where)
	case raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, badRequest(where, "%s: %v", where, err)
		}
		return []anthropicBlock{{Type: "text", Text: s}}, nil
	case raw[0] == '[':
		var bs []anthropicBlock
		if err := json.Unmarshal(raw, &bs); err != nil {
			return nil, badRequest(where, "%s: content must be a string or a list of content blocks: %v", where, err)
		}
		return bs, nil
	}
	return nil, badRequest(where, "%s: content must be a string or a list of content blocks", where)
}

// textOf joins text blocks; other kinds are refused, naming them.
func textOf(bs []anthropicBlock, where string) (string, *apiError) {
	var parts []string
	for j, b := range bs {
		if b.Type != "text" {
			return "", badRequest(where, "%s[%d]: content block type %q is not supported here", where, j, b.Type)
		}
		parts = append(parts, b.Text)
	}
	return strings.Join(parts, "\n"), nil
}

// anthropicToChat translates the request into a chat request for prepareChat.
func (s anthropicAPI) anthropicToChat(req *anthropicRequest, countOnly bool) (*chatRequest, *apiError) {
	if ae := s.checkAnthropic(req, countOnly); ae != nil {
		return nil, ae
	}
	cr := &chatRequest{}
	cr.MaxTokens = req.MaxTokens
	cr.Temperature, cr.TopP, cr.TopK = req.Temperature, req.TopP, req.TopK
	if len(req.StopSequences) > 0 {
		b, _ := json.Marshal(req.StopSequences)
		cr.Stop = b
	}
	if sys := bytes.TrimSpace(req.System); len(sys) > 0 && string(sys) != "null" {
		bs, ae := blocks(sys, "system")
		if ae != nil {
			return nil, ae
		}
		text, ae := textOf(bs, "system")
		if ae != nil {
			return nil, ae
		}
		cr.Messages = append(cr.Messages, chatMessageIn{Role: "system", Content: jsonString(text)})
	}
	for i, m := range req.Messages {
		msgs, ae := fromAnthropic(i, m)
		if ae != nil {
			return nil, ae
		}
		cr.Messages = append(cr.Messages, msgs...)
	}
	tools, ae := anthropicTools(req.Tools)
	if ae != nil {
		return nil, ae
	}
	cr.Tools = tools
	if cr.ToolChoice, ae = anthropicToolChoice(req.ToolChoice, len(req.Tools)); ae != nil {
		return nil, ae
	}
	return cr, nil
}

// checkAnthropic checks the fields the translation does not touch.
func (s anthropicAPI) checkAnthropic(req *anthropicRequest, countOnly bool) *apiError {
	if req.Model == "" {
		return badRequest("model", "model: field required")
	}
	if ae := s.checkModel(req.Model); ae != nil {
		return &apiError{Status: http.StatusNotFound, Message: "model: " + req.Model}
	}
	if !countOnly {
		if req.MaxTokens == nil {
			return badRequest("max_tokens", "max_tokens: field required")
		}
		if *req.MaxTokens < 1 {
			return badRequest("max_tokens", "max_tokens: must be at least 1, got %d", *req.MaxTokens)
		}
	}
	if len(req.Messages) == 0 {
		return badRequest("messages", "messages: at least one message is required")
	}
	if req.Temperature != nil && (*req.Temperature < 0 || *req.Temperature > 1) {
		return badRequest("temperature", "temperature: must be in [0, 1], got %v", *req.Temperature)
	}
	return nil
}

// fromAnthropic is message i as chat messages: tool results become
// tool messages of their own, before the message's text and tool calls.
func fromAnthropic(i int, m anthropicMessage) ([]chatMessageIn, *apiError) {
	where := fmt.Sprintf("messages.%d.content", i)
	if m.Role != "user" && m.Role != "assistant" {
		return nil, badRequest("messages", "messages.%d.role: must be \"user\" or \"assistant\", got %q", i, m.Role)
	}
	bs, ae := blocks(m.Content, where)
	if ae != nil {
		return nil, ae
	}
	var out []chatMessageIn
	var text []string
	var calls []any
	for j, b := range bs {
		switch b.Type {
		case "text":
			text = append(text, b.Text)
		case "tool_use":
			if m.Role != "assistant" {
				return nil, badRequest("messages", "%s.%d: tool_use blocks belong in assistant messages", where, j)
			}
			in := bytes.TrimSpace(b.Input)
			if len(in) == 0 {
				in = []byte("{}")
			}
			calls = append(calls, map[string]any{"id": b.ID, "type": "function",
				"function": map[string]any{"name": b.Name, "arguments": string(in)}})
		case "tool_result":
			if m.Role != "user" {
				return nil, badRequest("messages", "%s.%d: tool_result blocks belong in user messages", where, j)
			}
			msg, ae := toolResult(b, fmt.Sprintf("%s.%d.content", where, j))
			if ae != nil {
				return nil, ae
			}
			out = append(out, msg)
		case "thinking", "redacted_thinking":
			// Earlier reasoning is not replayed to the model.
		default:
			return nil, badRequest("messages", "%s.%d: content block type %q is not supported (text, tool_use and tool_result are)", where, j, b.Type)
		}
	}
	if len(text) == 0 && len(calls) == 0 {
		return out, nil // only tool results
	}
	return append(out, chatMessageIn{Role: m.Role, Content: jsonString(strings.Join(text, "\n")), ToolCalls: calls}), nil
}

// toolResult is a tool_result block as a tool message.
func toolResult(b anthropicBlock, where string) (chatMessageIn, *apiError) {
	out := ""
	if c := bytes.TrimSpace(b.Content); len(c) > 0 && string(c) != "null" {
		rb, ae := blocks(c, where)
		if ae != nil {
			return chatMessageIn{}, ae
		}
		if out, ae = textOf(rb, where); ae != nil {
			return chatMessageIn{}, ae
		}
	}
	if b.IsError {
		out = "Error: " + out
	}
	return chatMessageIn{Role: "tool", Content: jsonString(out), ToolCallID: b.ToolUseID}, nil
}

// anthropicTools is the custom tools as OpenAI function tools.
func anthropicTools(tools []anthropicTool) ([]json.RawMessage, *apiError) {
	var out []json.RawMessage
	for i, t := range tools {
		if t.Type != "" && t.Type != "custom" {
			return nil, badRequest("tools", "tools.%d: server tool type %q is not supported (only custom tools with input_schema)", i, t.Type)
		}
		if t.Name == "" {
			return nil, badRequest("tools", "tools.%d.name: field required", i)
		}
		schema := t.InputSchema
		if len(bytes.TrimSpace(schema)) == 0 {
			return nil, badRequest("tools", "tools.%d.input_schema: field required", i)
		}
		fn := map[string]any{"name": t.Name, "parameters": schema}
		if t.Description != "" {
			fn["description"] = t.Description
		}
		b, _ := json.Marshal(map[string]any{"type": "function", "function": fn})
		out = append(out, b)
	}
	return out, nil
}

// anthropicToolChoice is tool_choice in OpenAI's terms (nil for auto).
func anthropicToolChoice(c *anthropicChoice, tools int) (json.RawMessage, *apiError) {
	if c == nil {
		return nil, nil
	}
	var choice any
	switch c.Type {
	case "auto", "":
		return nil, nil
	case "any":
		choice = "required"
	case "none":
		choice = "none"
	case "tool":
		if c.Name == "" {
			return nil, badRequest("tool_choice", "tool_choice.name: field required for type \"tool\"")
		}
		choice = map[string]any{"type": "function", "function": map[string]any{"name": c.Name}}
	default:
		return nil, badRequest("tool_choice", "tool_choice.type: must be auto, any, tool or none, got %q", c.Type)
	}
	if tools == 0 {
		return nil, badRequest("tool_choice", "tool_choice %q needs tools", c.Type)
	}
	b, _ := json.Marshal(choice)
	return b, nil
}

func (s anthropicAPI) handleCountTokens(w http.ResponseWriter, r *http.Request) {
	var req anthropicRequest
	if ae := decodeBody(r, &req); ae != nil {
		anthropicError(w, ae)
		return
	}
	cr, ae := s.anthropicToChat(&req, true)
	if ae != nil {
		anthropicError(w, ae)
		return
	}
	tools := cr.Tools
	if string(cr.ToolChoice) == `"none"` {
		tools = nil
	}
	ids, ae := s.chatPrompt(cr.Messages, nil, tools, nil, false)
	if ae != nil {
		anthropicError(w, ae)
		return
	}
	writeJSON(w, map[string]int{"input_tokens": len(ids)})
}

type anthropicUsage struct {
	InputTokens          int `json:"input_tokens"`
	OutputTokens         int `json:"output_tokens"`
	CacheReadInputTokens int `json:"cache_read_input_tokens"`
}

type anthropicContent struct {
	Type  string          `json:"type"`
	Text  *string         `json:"text,omitempty"`
	ID    string          `json:"id,omitempty"`
	Name  string          `json:"name,omitempty"`
	Input json.RawMessage `json:"input,omitempty"`
}

type anthropicResponse struct {
	ID           string             `json:"id"`
	Type         string             `json:"type"`
	Role         string             `json:"role"`
	Model        string             `json:"model"`
	Content      []anthropicContent `json:"content"`
	StopReason   *string            `json:"stop_reason"`
	StopSequence *string            `json:"stop_sequence"`
	Usage        anthropicUsage     `json:"usage"`
}

func (s anthropicAPI) handleMessages(w http.ResponseWriter, r *http.Request) {
	var req anthropicRequest
	if ae := decodeBody(r, &req); ae != nil {
		anthropicError(w, ae)
		return
	}
	cr, ae := s.anthropicToChat(&req, false)
	if ae != nil {
		anthropicError(w, ae)
		return
	}
	er, format, ae := s.prepareChat(r.Context(), cr)
	if ae != nil {
		anthropicError(w, ae)
		return
	}
	s.templateHeader(w)
	if ae := admission(s.Server); ae != nil {
		anthropicError(w, ae)
		return
	}
	defer s.release()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	id := newID("msg_")[:28]
	head := anthropicResponse{ID: id, Type: "message", Role: "assistant", Model: s.b.ModelName(), Content: []anthropicContent{},
		Usage: anthropicUsage{InputTokens: len(er.Prompt)}}
	if req.Stream {
		s.streamMessage(ctx, cancel, w, er, format, head, req.StopSequences)
		return
	}
	res, ae := s.runTurn(ctx, cancel, er, format, nil)
	if ae != nil {
		anthropicError(w, ae)
		return
	}
	if ctx.Err() != nil {
		return
	}
	if res.text != "" || len(res.calls) == 0 {
		t := res.text
		head.Content = append(head.Content, anthropicContent{Type: "text", Text: &t})
	}
	for _, c := range res.calls {
		head.Content = append(head.Content, anthropicContent{Type: "tool_use", ID: toolUseID(), Name: c.Name, Input: argsObject(c.Arguments)})
	}
	reason, seq := s.anthropicStop(res, req.StopSequences)
	head.StopReason, head.StopSequence = &reason, seq
	head.Usage = anthropicUsage{InputTokens: res.usage.PromptTokens, OutputTokens: res.usage.CompletionTokens}
	if res.usage.PromptTokensDetails != nil {
		head.Usage.CacheReadInputTokens = res.usage.PromptTokensDetails.CachedTokens
	}
	writeJSON(w, head)
}

// streamMessage runs the turn as Anthropic's event stream: message_start,
// a ping, each content block's start/delta/stop, message_delta and
// message_stop.
func (s anthropicAPI) streamMessage(ctx context.Context, cancel context.CancelFunc, w http.ResponseWriter, er *engine.Request, format toolFormat, head anthropicResponse, stops []string) {
	out := newSSE(w, s.cutError)
	ev := func(name string, v any) {
		b, err := marshal(v)
		if err != nil {
			return
		}
		out.rawEvent(name, b)
	}
	ev("message_start", map[string]any{"type": "message_start", "message": head})
	index, textOpen, pinged := 0, false, false
	ping := func() {
		if !pinged {
			pinged = true
			ev("ping", map[string]string{"type": "ping"})
		}
	}
	openText := func() {
		if !textOpen {
			textOpen = true
			empty := ""
			ev("content_block_start", map[string]any{"type": "content_block_start", "index": index,
				"content_block": anthropicContent{Type: "text", Text: &empty}})
			ping()
		}
	}
	res, ae := s.runTurn(ctx, cancel, er, format, func(text string) {
		openText()
		ev("content_block_delta", map[string]any{"type": "content_block_delta", "index": index,
			"delta": map[string]string{"type": "text_delta", "text": text}})
	})
	if ae != nil {
		ev("error", anthropicErrorBody(ae))
		return
	}
	if ctx.Err() != nil {
		return
	}
	if len(res.calls) == 0 {
		openText() // an empty reply is still one (empty) text block
	}
	if textOpen {
		ev("content_block_stop", map[string]any{"type": "content_block_stop", "index": index})
		index++
	}
	for _, c := range res.calls {
		ev("content_block_start", map[string]any{"type": "content_block_start", "index": index,
			"content_block": anthropicContent{Type: "tool_use", ID: toolUseID(), Name: c.Name, Input: json.RawMessage("{}")}})
		ping()
		ev("content_block_delta", map[string]any{"type": "content_block_delta", "index": index,
			"delta": map[string]string{"type": "input_json_delta", "partial_json": string(argsObject(c.Arguments))}})
		ev("content_block_stop", map[string]any{"type": "content_block_stop", "index": index})
		index++
	}
	reason, seq := s.anthropicStop(res, stops)
	ev("message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": reason, "stop_sequence": seq},
		"usage": map[string]int{"output_tokens": res.usage.CompletionTokens}})
	ev("message_stop", map[string]string{"type": "message_stop"})
}

func toolUseID() string { return "toolu_" + newID("")[:24] }

// anthropicStop is stop_reason and stop_sequence for a finished turn.
func (s anthropicAPI) anthropicStop(res *turnResult, stops []string) (string, *string) {
	switch {
	case len(res.calls) > 0:
		return "tool_use", nil
	case res.finish == engine.FinishLength:
		return "max_tokens", nil
	}
	if seq := s.stopSequence(res, stops); seq != "" {
		return "stop_sequence", &seq
	}
	return "end_turn", nil
}
