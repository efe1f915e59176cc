package server

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"pagoda/engine"
)

type chatRequest struct {
	commonParams
	Messages             []chatMessageIn   `json:"messages"`
	Logprobs             bool              `json:"logprobs"`
	TopLogprobs          *int              `json:"top_logprobs"`
	ResponseFormat       *responseFormat   `json:"response_format"`
	Tools                []json.RawMessage `json:"tools"`
	ToolChoice           json.RawMessage   `json:"tool_choice"`
	AddGenerationPrompt  *bool             `json:"add_generation_prompt"`
	ContinueFinalMessage bool              `json:"continue_final_message"`
	AddSpecialTokens     bool              `json:"add_special_tokens"`
	ChatTemplateKwargs   map[string]any    `json:"chat_template_kwargs"`
}

type chatMessageIn struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	Name       string          `json:"name"`
	ToolCalls  []any           `json:"tool_calls"`
	ToolCallID string          `json:"tool_call_id"`
}

type contentPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// flattenMessages validates the messages and turns content parts into
// plain text for the template.
func flattenMessages(in []chatMessageIn) ([]ChatMessage, *apiError) {
	if len(in) == 0 {
		return nil, badRequest("messages", "messages must be a non-empty list")
	}
	out := make([]ChatMessage, len(in))
	for i, m := range in {
		switch m.Role {
		case "system", "user", "assistant", "tool":
		case "developer":
			// OpenAI's newer name for system; templates only know system.
			m.Role = "system"
		case "":
			return nil, badRequest("messages", "messages[%d].role is required", i)
		default:
			return nil, badRequest("messages", "messages[%d].role %q is not one of system, developer, user, assistant, tool", i, m.Role)
		}
		cm := ChatMessage{Role: m.Role, Name: m.Name, ToolCalls: m.ToolCalls, ToolCallID: m.ToolCallID}
		raw := bytes.TrimSpace(m.Content)
		switch {
		case len(raw) == 0 || string(raw) == "null":
			if m.Role != "assistant" {
				return nil, badRequest("messages", "messages[%d].content is required", i)
			}
		case raw[0] == '"':
			if err := json.Unmarshal(raw, &cm.Content); err != nil {
				return nil, badRequest("messages", "messages[%d].content: %v", i, err)
			}
		case raw[0] == '[':
			var parts []contentPart
			if err := json.Unmarshal(raw, &parts); err != nil {
				return nil, badRequest("messages", "messages[%d].content must be a string or a list of content parts", i)
			}
			texts := make([]string, 0, len(parts))
			for j, p := range parts {
				if p.Type != "text" {
					return nil, badRequest("messages", "messages[%d].content[%d]: content part type %q is not supported (text only)", i, j, p.Type)
				}
				texts = append(texts, p.Text)
			}
			cm.Content = strings.Join(texts, "\n")
		default:
			return nil, badRequest("messages", "messages[%d].content must be a string or a list of content parts", i)
		}
		out[i] = cm
	}
	return out, nil
}

// chatPrompt renders and tokenizes the conversation.
func (s *Server) chatPrompt(msgs []chatMessageIn, addGen *bool, tools []json.RawMessage, kwargs map[string]any, addSpecial bool) ([]int32, *apiError) {
	cms, ae := flattenMessages(msgs)
	if ae != nil {
		return nil, ae
	}
	extra := make(map[string]any, len(kwargs)+1)
	for k, v := range kwargs {
		extra[k] = v
	}
	if len(tools) > 0 {
		// Raw JSON keeps the client's key order through tojson.
		ts := make([]any, len(tools))
		for i, t := range tools {
			ts[i] = t
		}
		extra["tools"] = ts
	}
	gen := true
	if addGen != nil {
		gen = *addGen
	}
	text, err := s.b.ApplyChat(cms, gen, extra)
	if err != nil {
		return nil, badRequest("messages", "applying the chat template: %v", err)
	}
	ids := s.b.Tokenize(text, addSpecial)
	if len(ids) == 0 {
		return nil, badRequest("messages", "the rendered chat prompt is empty")
	}
	return ids, nil
}

func (s completionsAPI) handleChat(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	if ae := decodeBody(r, &req); ae != nil {
		writeAPIError(w, ae)
		return
	}
	er, format, ae := s.prepareChat(r.Context(), &req)
	if ae != nil {
		writeAPIError(w, ae)
		return
	}
	s.templateHeader(w)
	reqs := []*engine.Request{er}
	c := &chatRun{s: s.Server, id: er.ID, created: time.Now().Unix(), n: er.N, logprobs: er.Logprobs, usage: newUsageSum(reqs), tools: format}
	s.generate(w, r, &req.commonParams, reqs, s.markerTokens(format), c)
}

// prepareChat validates a chat request and builds the engine request:
// sampling, response format, tools, the rendered prompt and the
// template's end-of-turn stops. The ollama and Anthropic endpoints
// translate into a chatRequest and share it.
func (s *Server) prepareChat(ctx context.Context, req *chatRequest) (*engine.Request, toolFormat, *apiError) {
	if ae := s.checkModel(req.Model); ae != nil {
		return nil, toolNone, ae
	}
	lim := s.limits()
	base, ae := req.toEngine(lim)
	if ae != nil {
		return nil, toolNone, ae
	}
	if req.TopLogprobs != nil {
		if !req.Logprobs {
			return nil, toolNone, badRequest("top_logprobs", "top_logprobs requires logprobs to be true")
		}
		if *req.TopLogprobs < 0 || *req.TopLogprobs > lim.maxLogprobs {
			return nil, toolNone, badRequest("top_logprobs", "top_logprobs must be in [0, %d], got %d", lim.maxLogprobs, *req.TopLogprobs)
		}
		base.TopLogprobs = *req.TopLogprobs
	}
	base.Logprobs = req.Logprobs
	if base.Constraint, ae = s.constraint(ctx, req.ResponseFormat); ae != nil {
		return nil, toolNone, ae
	}
	if req.ContinueFinalMessage {
		return nil, toolNone, badRequest("continue_final_message", "continue_final_message is not supported")
	}
	tools := req.Tools
	if _, ae := checkTools(tools); ae != nil {
		return nil, toolNone, ae
	}
	forced, none, ae := forcedTools(req.ToolChoice, tools)
	if ae != nil {
		return nil, toolNone, ae
	}
	if none {
		tools = nil
	}
	prompt, ae := s.chatPrompt(req.Messages, req.AddGenerationPrompt, tools, req.ChatTemplateKwargs, req.AddSpecialTokens)
	if ae != nil {
		return nil, toolNone, ae
	}
	er := base
	er.ID, er.Prompt = newID("chatcmpl-"), prompt
	if ae := s.setMaxTokens(er, &req.commonParams, 0, "max_tokens"); ae != nil {
		return nil, toolNone, ae
	}
	if ct, ok := s.templateInfo(); ok {
		er.StopStrings = append(er.StopStrings, ct.Stops...)
	}

	format := toolNone
	if len(tools) > 0 {
		if ts, ok := s.b.(ChatTemplateSourcer); ok {
			format = detectToolFormat(ts.ChatTemplateSource())
		}
	}
	if forced != nil {
		// The reply must be a call: constrained decoding writes it.
		if er.Constraint != nil {
			return nil, toolNone, badRequest("tool_choice", "tool_choice that forces a call cannot be combined with response_format")
		}
		if er.Constraint, ae = s.toolConstraint(ctx, format, forced); ae != nil {
			return nil, toolNone, ae
		}
	}
	return er, format, nil
}

type chatRun struct {
	s        *Server
	id       string
	created  int64
	n        int
	logprobs bool
	usage    *usageSum
	tools    toolFormat // toolNone: replies are never parsed for calls
}

type chatLogprobs struct {
	Content []chatLogprob `json:"content"`
	Refusal any           `json:"refusal"`
}

type chatLogprob struct {
	Token       string    `json:"token"`
	Logprob     float64   `json:"logprob"`
	Bytes       []int     `json:"bytes"`
	TopLogprobs []chatTop `json:"top_logprobs"`
}

type chatTop struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

type chatMessageOut struct {
	Role      string        `json:"role"`
	Content   *string       `json:"content"`
	Refusal   any           `json:"refusal"`
	ToolCalls []toolCallOut `json:"tool_calls,omitempty"`
}

type chatChoice struct {
	Index        int            `json:"index"`
	Message      chatMessageOut `json:"message"`
	Logprobs     *chatLogprobs  `json:"logprobs"`
	FinishReason any            `json:"finish_reason"`
}

type chatResponse struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"`
	Created           int64        `json:"created"`
	Model             string       `json:"model"`
	SystemFingerprint string       `json:"system_fingerprint"`
	Choices           []chatChoice `json:"choices"`
	Usage             *usageJSON   `json:"usage"`
}

type chatDelta struct {
	Role      string          `json:"role,omitempty"`
	Content   *string         `json:"content,omitempty"`
	ToolCalls []toolCallDelta `json:"tool_calls,omitempty"`
}

type chatChunkChoice struct {
	Index        int           `json:"index"`
	Delta        chatDelta     `json:"delta"`
	Logprobs     *chatLogprobs `json:"logprobs"`
	FinishReason any           `json:"finish_reason"`
}

type chatChunk struct {
	ID                string            `json:"id"`
	Object            string            `json:"object"`
	Created           int64             `json:"created"`
	Model             string            `json:"model"`
	SystemFingerprint string            `json:"system_fingerprint"`
	Choices           []chatChunkChoice `json:"choices"`
}

type chatChunkUsage struct {
	chatChunk
	Usage *usageJSON `json:"usage"`
}

func (c *chatRun) toLogprobs(entries []lpEntry) []chatLogprob {
	out := make([]chatLogprob, len(entries))
	for i, e := range entries {
		text := c.s.b.TokenText(e.id)
		out[i] = chatLogprob{Token: text, Logprob: clampLP(e.lp), Bytes: tokenBytes(text), TopLogprobs: make([]chatTop, len(e.top))}
		for j, t := range e.top {
			tt := c.s.b.TokenText(t.ID)
			out[i].TopLogprobs[j] = chatTop{Token: tt, Logprob: clampLP(t.Logprob), Bytes: tokenBytes(tt)}
		}
	}
	return out
}

func (c *chatRun) collect(ctx context.Context, w http.ResponseWriter, events <-chan tagged) {
	texts := make([]strings.Builder, c.n)
	finish := make([]engine.FinishReason, c.n)
	lps := make([]*chatLogprobs, c.n)
	if c.logprobs {
		for i := range lps {
			lps[i] = &chatLogprobs{Content: []chatLogprob{}}
		}
	}
	for t := range events {
		if t.ev.Err != nil {
			writeAPIError(w, toAPIError(t.ev.Err))
			return
		}
		c.usage.add(t)
		i := t.ev.Index
		if i < 0 || i >= c.n {
			continue
		}
		texts[i].WriteString(t.ev.Text)
		if c.logprobs {
			lps[i].Content = append(lps[i].Content, c.toLogprobs(eventLogprobs(&t.ev))...)
		}
		if t.ev.Finish != engine.FinishNone {
			finish[i] = t.ev.Finish
		}
	}
	if ctx.Err() != nil {
		if ae := c.s.cutError(); ae != nil {
			writeAPIError(w, ae)
		}
		return // the client is gone
	}
	resp := chatResponse{ID: c.id, Object: "chat.completion", Created: c.created, Model: c.s.b.ModelName(),
		SystemFingerprint: c.s.fp, Usage: c.usage.json()}
	for i := range c.n {
		f := finish[i]
		if f == engine.FinishNone {
			f = engine.FinishStop
		}
		msg := chatMessageOut{Role: "assistant"}
		content, calls := splitToolCalls(c.tools, texts[i].String())
		if len(calls) > 0 {
			msg.ToolCalls = toolCallsOut(calls)
			if f == engine.FinishStop {
				f = finishToolCalls
			}
		}
		if content != "" || len(calls) == 0 {
			msg.Content = &content
		}
		resp.Choices = append(resp.Choices, chatChoice{Index: i, Message: msg, Logprobs: lps[i], FinishReason: finishString(f)})
	}
	writeJSON(w, resp)
}

func (c *chatRun) chunk(choices []chatChunkChoice, withUsage bool) any {
	ch := chatChunk{ID: c.id, Object: "chat.completion.chunk", Created: c.created, Model: c.s.b.ModelName(),
		SystemFingerprint: c.s.fp, Choices: choices}
	if withUsage {
		return chatChunkUsage{chatChunk: ch}
	}
	return ch
}

func (c *chatRun) stream(ctx context.Context, w http.ResponseWriter, events <-chan tagged, includeUsage bool) {
	out := newSSE(w, c.s.cutError)
	empty := ""
	for i := range c.n {
		out.send(c.chunk([]chatChunkChoice{{Index: i, Delta: chatDelta{Role: "assistant", Content: &empty}}}, includeUsage))
	}
	held := make([]strings.Builder, c.n) // reply text so far, when parsing tool calls
	sent := make([]int, c.n)             // bytes of held already sent as content
	if !out.relay(ctx, events, c.usage, func(t tagged) {
		i := t.ev.Index
		if i < 0 || i >= c.n {
			return
		}
		var lp *chatLogprobs
		if c.logprobs && len(t.ev.Tokens) > 0 {
			lp = &chatLogprobs{Content: c.toLogprobs(eventLogprobs(&t.ev))}
		}
		text, finish := t.ev.Text, t.ev.Finish
		if c.tools != toolNone {
			var calls []toolCall
			text, calls = c.toolText(&held[i], &sent[i], text, finish)
			if len(calls) > 0 {
				c.sendToolCalls(out, i, text, lp, calls, finish, includeUsage)
				return
			}
		}
		if text == "" && lp == nil && finish == engine.FinishNone {
			return
		}
		var d chatDelta
		if text != "" || lp != nil {
			d.Content = &text
		}
		out.send(c.chunk([]chatChunkChoice{{Index: i, Delta: d, Logprobs: lp, FinishReason: finishString(finish)}}, includeUsage))
	}) {
		return
	}
	if includeUsage {
		out.send(chatChunkUsage{chatChunk: chatChunk{ID: c.id, Object: "chat.completion.chunk", Created: c.created,
			Model: c.s.b.ModelName(), SystemFingerprint: c.s.fp, Choices: []chatChunkChoice{}}, Usage: c.usage.json()})
	}
	out.done()
}

// toolText adds text to a choice's reply and returns what may go out as
// content now: text that cannot be part of a tool call. At the finish the
// held tail is parsed; calls come back with the text around them, and a
// tail that does not parse goes out as content.
func (c *chatRun) toolText(held *strings.Builder, sent *int, text string, finish engine.FinishReason) (string, []toolCall) {
	held.WriteString(text)
	all := held.String()
	if finish == engine.FinishNone {
		h := max(holdFrom(c.tools, all), *sent)
		out := all[*sent:h]
		*sent = h
		return out, nil
	}
	tail := all[*sent:]
	*sent = len(all)
	if i := markerIndex(c.tools, tail); i >= 0 {
		if rest, calls, ok := parseToolCalls(c.tools, tail[i:]); ok && len(calls) > 0 {
			return tail[:i] + strings.TrimSpace(rest), calls
		}
	}
	return tail, nil
}

// sendToolCalls ends a choice whose reply held tool calls: the remaining
// content, one delta per call, then the finish reason on its own, as
// OpenAI streams them.
func (c *chatRun) sendToolCalls(out *sse, i int, text string, lp *chatLogprobs, calls []toolCall, finish engine.FinishReason, withUsage bool) {
	if text != "" || lp != nil {
		out.send(c.chunk([]chatChunkChoice{{Index: i, Delta: chatDelta{Content: &text}, Logprobs: lp}}, withUsage))
	}
	for k, tc := range toolCallsOut(calls) {
		d := chatDelta{ToolCalls: []toolCallDelta{{Index: k, ID: tc.ID, Type: tc.Type, Function: tc.Function}}}
		out.send(c.chunk([]chatChunkChoice{{Index: i, Delta: d}}, withUsage))
	}
	if finish == engine.FinishStop {
		finish = finishToolCalls
	}
	out.send(c.chunk([]chatChunkChoice{{Index: i, Delta: chatDelta{}, FinishReason: finishString(finish)}}, withUsage))
}
