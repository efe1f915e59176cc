// Package engine runs many generation requests at once: the scheduler
// (continuous batching, chunked prefill, preemption), the step loop over
// the model, and the static-batching baseline.
package engine

import (
	"context"

	"pagoda/grammar"
	"pagoda/sample"
)

// Request is one generation request as the server or CLI submits it.
// Prompt is already tokenized. It is plain data (it round-trips through
// encoding/json): the KV policy is its spec string and the constraint its
// source, both instantiated on the engine side at Submit.
type Request struct {
	ID        string
	Prompt    []int32
	MaxTokens int // new tokens; 0 means up to the context length
	N         int // parallel completions sharing the prompt (default 1)
	Sampling  sample.Params

	StopTokens  []int32  // besides the vocabulary's end-of-generation ids
	StopStrings []string // matched on the detokenized output; not emitted
	IgnoreEOS   bool
	TopLogprobs int // 0 = none; >0: return that many alternatives per token (logprob of chosen always returned when Logprobs)
	Logprobs    bool
	// PromptLogprobs asks for the logprob (and TopLogprobs alternatives)
	// of every prompt token after the first, streamed as Prompt events
	// before the completion's first token. Such a request takes no prefix
	// cache hits: cached positions are never computed, so their logits
	// rows would not exist.
	PromptLogprobs bool
	// ScoreOnly computes the prompt and ends every completion without
	// generating (finish "length", no tokens): with PromptLogprobs, the
	// prompt's scores alone, as OpenAI's echo with max_tokens 0 gives them
	// (what evaluation harnesses ask for). MaxTokens is ignored.
	ScoreOnly bool

	// CacheSalt (vLLM's cache_salt) isolates prefix caching: requests
	// share cached prompt blocks only with requests of the same salt, so
	// one tenant cannot learn another's prompts from time to first token.
	// Empty shares with every other unsalted request.
	CacheSalt string

	// SpecTokens caps the draft tokens verified per step for this request
	// when the engine speculates (Config.Spec): 0 leaves the engine's
	// setting, a negative value turns speculation off for the request.
	SpecTokens int

	// KVPolicy is the KV cache policy this request's sequences run, as
	// kvcache.ParsePolicy reads it ("quest:budget=1024"; streaming, quest,
	// h2o, snapkv): "" runs the engine's Config.KVPolicy, "none" (or
	// "full") runs none (the model's own attention) even where the engine
	// has one. A spec that does not parse is ErrBadKVPolicy at Submit. Requests
	// batch together whatever their policies; a request whose effective
	// policy is not full attention does not speculate. A per-request
	// policy never lets a request past the model's context unless the
	// engine's policy does too (a streaming Config.KVPolicy).
	KVPolicy string

	// Constraint restricts the output to a grammar (a JSON schema, any
	// JSON object, a tool call): nil for none. The engine compiles it at
	// Submit (Config.Constraints; compiled grammars are cached by
	// Spec.Key) and gives each completion its own matcher. A spec that
	// does not compile is ErrBadConstraint. Constrained requests do not
	// speculate.
	Constraint *grammar.Spec `json:",omitempty"`
}

type showKey struct{}

// WithShowTokens returns ctx carrying control tokens that the output
// processor renders as their text in a request's output, which
// detokenization otherwise drops: the server's tool-call parser needs
// markers such as Mistral's [TOOL_CALLS]. This is front-end rendering,
// no part of the request the engine schedules, so it travels beside it
// rather than in it.
func WithShowTokens(ctx context.Context, ids ...int32) context.Context {
	if len(ids) == 0 {
		return ctx
	}
	return context.WithValue(ctx, showKey{}, append([]int32(nil), ids...))
}

func showTokens(ctx context.Context) []int32 {
	ids, _ := ctx.Value(showKey{}).([]int32)
	return ids
}

// FinishReason says why a completion ended.
type FinishReason string

const (
	FinishNone      FinishReason = ""
	FinishStop      FinishReason = "stop"   // EOS, stop token or stop string
	FinishLength    FinishReason = "length" // max tokens or context full
	FinishCancelled FinishReason = "cancelled"
	FinishError     FinishReason = "error"
)

// TokenLogprob is one candidate token and its log-probability.
type TokenLogprob struct {
	ID      int32
	Logprob float32
}

// Event is one step of output for one completion (Index in [0, N)).
// Text is the UTF-8-safe text delta (stop strings held back and removed).
type Event struct {
	Index   int
	Tokens  []int32
	Text    string
	Logprob []float32        // per token in Tokens, when requested
	Top     [][]TokenLogprob // per token in Tokens, when TopLogprobs > 0
	Finish  FinishReason
	Err     error
	// Prompt marks prompt logprobs (Request.PromptLogprobs): Tokens are
	// prompt tokens, Text is empty, and every completion gets a copy.
	Prompt bool

	// Set on the final event of the whole request (all N completions done).
	Usage *Usage
}

// Usage counts tokens for the OpenAI usage object.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
	CachedTokens     int // prompt tokens served from the prefix cache
}
