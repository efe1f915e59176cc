// Package server is Pagoda's OpenAI-compatible HTTP front end: request
// validation, chat templating and tokenization through a Backend, SSE
// streaming, API-key auth, body limits, /metrics and graceful drain.
//
// Endpoints: POST /v1/completions, POST /v1/chat/completions, GET
// /v1/models, POST /tokenize and /detokenize (vLLM's shapes), GET /health,
// /version and /metrics; GET / is a web page (chat and a live engine view
// fed by GET /api/engine, which needs the API key like /v1/*).
//
// echo returns the prompt before the completion, with its logprobs when
// logprobs is set; with max_tokens 0 it returns the prompt alone (scoring).
//
// Deliberately unsupported (400, naming the field): suffix, best_of other than n, continue_final_message,
// non-text content parts, and JSON schema keywords package grammar cannot
// enforce. response_format json_object and json_schema, and tool_choice
// "required" or a named function (Hermes and Llama 3 tool syntax), constrain
// sampling with package grammar when the Backend is a GrammarVocaber. Tool calls in the output are parsed into
// tool_calls for Qwen (Hermes), Llama 3.x and Mistral templates when the
// Backend shows its template (ChatTemplateSourcer); otherwise they come back
// as plain content.
package server

import (
	"context"
	"errors"

	"pagoda/engine"
)

// Backend is everything the server needs from the model and the engine.
// The server owns this interface so it can be tested with a fake; the
// command wires an adapter over the engine, the tokenizer and package jinja.
type Backend interface {
	ModelName() string
	ContextLen() int
	// Tokenize encodes text; addSpecial adds BOS (and EOS) as the vocabulary
	// says.
	Tokenize(text string, addSpecial bool) []int32
	Detokenize(ids []int32) string
	// TokenText is the text of one token for logprobs "token" fields. A
	// token that is not valid UTF-8 on its own is written "bytes:\xNN…" as
	// OpenAI does.
	TokenText(id int32) string
	// ApplyChat renders msgs with the model's chat template; extra carries
	// template variables such as "tools". An error becomes a 400.
	ApplyChat(msgs []ChatMessage, addGenerationPrompt bool, extra map[string]any) (string, error)
	// Submit starts a request. Cancelling ctx cancels it. The channel is
	// closed after the event that carries Usage.
	Submit(ctx context.Context, r *engine.Request) (<-chan engine.Event, error)
}

// VocabSizer is optionally implemented by a Backend so that token ids in
// prompts, logit_bias and stop_token_ids are range-checked here (400)
// rather than deep in the engine.
type VocabSizer interface {
	VocabSize() int
}

// ChatMessage is one message handed to the chat template. Content is
// already flattened to text (text parts joined by "\n").
type ChatMessage struct {
	Role       string `json:"role"`
	Content    string `json:"content"`
	Name       string `json:"name,omitempty"`
	ToolCalls  []any  `json:"tool_calls,omitempty"` // passed through unparsed
	ToolCallID string `json:"tool_call_id,omitempty"`
}

// Errors a Backend (or the engine behind it) may return from Submit, wrapped
// or not, to select the HTTP status. engine.ErrQueueFull is recognised too
// once the engine defines it; an adapter can wrap it with ErrQueueFull.
var (
	ErrQueueFull = errors.New("server: queue full")       // → 429
	ErrTooLong   = errors.New("server: request too long") // → 400
	ErrBadInput  = errors.New("server: invalid request")  // → 400
)

// StatusError lets an error choose its own HTTP status.
type StatusError interface {
	error
	HTTPStatus() int
}
