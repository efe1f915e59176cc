package server

import (
	"encoding/json"
	"math"
	"strconv"

	"pagoda/engine"
	"pagoda/sample"
)

// commonParams are the request fields shared by both generation endpoints.
type commonParams struct {
	Model               string             `json:"model"`
	CacheSalt           string             `json:"cache_salt"` // vLLM: requests share prefix-cache blocks only with the same salt
	MaxTokens           *int               `json:"max_tokens"`
	MaxCompletionTokens *int               `json:"max_completion_tokens"`
	Temperature         *float64           `json:"temperature"`
	TopP                *float64           `json:"top_p"`
	TopK                *int               `json:"top_k"`
	MinP                *float64           `json:"min_p"`
	RepetitionPenalty   *float64           `json:"repetition_penalty"`
	FrequencyPenalty    *float64           `json:"frequency_penalty"`
	PresencePenalty     *float64           `json:"presence_penalty"`
	Seed                *int64             `json:"seed"`
	Stop                json.RawMessage    `json:"stop"`
	StopTokenIDs        []int64            `json:"stop_token_ids"`
	N                   *int               `json:"n"`
	BestOf              *int               `json:"best_of"`
	IgnoreEOS           bool               `json:"ignore_eos"`
	LogitBias           map[string]float64 `json:"logit_bias"`
	Stream              bool               `json:"stream"`
	StreamOptions       *streamOptions     `json:"stream_options"`
	User                string             `json:"user"` // accepted and ignored
	// SpecTokens (Pagoda's extension) caps the draft tokens verified per
	// step when the server speculates: 0 turns speculation off for the
	// request; absent leaves the server's --spec-tokens.
	SpecTokens *int `json:"spec_tokens"`
	// KVPolicy (Pagoda's extension) is the request's KV cache policy:
	// "quest:budget=1024" or {"name": "quest", "budget": 1024}; "none" is
	// full attention; absent leaves the server's --kv-policy.
	KVPolicy json.RawMessage `json:"kv_policy"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// limits the validation needs from the server.
type limits struct {
	maxN, maxLogprobs, vocab int
}

func (s *Server) limits() limits {
	l := limits{maxN: s.o.MaxN, maxLogprobs: s.o.MaxLogprobs}
	if v, ok := s.b.(VocabSizer); ok {
		l.vocab = v.VocabSize()
	}
	return l
}

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// toEngine validates the shared fields and fills the engine request (all
// but the prompt and max tokens).
func (p *commonParams) toEngine(l limits) (*engine.Request, *apiError) {
	r := &engine.Request{N: 1, IgnoreEOS: p.IgnoreEOS, CacheSalt: p.CacheSalt}
	sp, ae := p.sampling(l.vocab)
	if ae != nil {
		return nil, ae
	}
	r.Sampling = sp
	pol, kerr := parseKVPolicy(p.KVPolicy)
	if kerr != nil {
		return nil, kerr
	}
	r.KVPolicy = pol
	if p.SpecTokens != nil {
		if *p.SpecTokens < 0 || *p.SpecTokens > engine.MaxSpecTokens {
			return nil, badRequest("spec_tokens", "spec_tokens must be in [0, %d] (0 turns speculation off), got %d", engine.MaxSpecTokens, *p.SpecTokens)
		}
		r.SpecTokens = *p.SpecTokens
		if r.SpecTokens == 0 {
			r.SpecTokens = -1
		}
	}

	if p.N != nil {
		if *p.N < 1 || *p.N > l.maxN {
			return nil, badRequest("n", "n must be in [1, %d], got %d", l.maxN, *p.N)
		}
		r.N = *p.N
	}
	if p.BestOf != nil && *p.BestOf != r.N {
		return nil, badRequest("best_of", "best_of other than n is not supported")
	}
	if ae := p.stops(r, l.vocab); ae != nil {
		return nil, ae
	}
	if p.StreamOptions != nil && !p.Stream {
		return nil, badRequest("stream_options", "stream_options is only allowed when stream is true")
	}
	return r, nil
}

// sampling validates the sampler's fields, in the order their errors
// have always been reported; the temperature defaults to OpenAI's 1.
func (p *commonParams) sampling(vocab int) (sample.Params, *apiError) {
	sp := sample.Params{Temperature: 1}
	if ae := floatIn("temperature", p.Temperature, &sp.Temperature, 0, 2, false); ae != nil {
		return sp, ae
	}
	if ae := floatIn("top_p", p.TopP, &sp.TopP, 0, 1, true); ae != nil {
		return sp, ae
	}
	if p.TopK != nil {
		k := *p.TopK
		if k < -1 {
			return sp, badRequest("top_k", "top_k must be -1 (off), 0 (off) or at least 1, got %d", k)
		}
		sp.TopK = max(k, 0)
	}
	if ae := floatIn("min_p", p.MinP, &sp.MinP, 0, 1, false); ae != nil {
		return sp, ae
	}
	if ae := floatIn("repetition_penalty", p.RepetitionPenalty, &sp.RepetitionPenalty, 0, 2, true); ae != nil {
		return sp, ae
	}
	if ae := floatIn("frequency_penalty", p.FrequencyPenalty, &sp.FrequencyPenalty, -2, 2, false); ae != nil {
		return sp, ae
	}
	if ae := floatIn("presence_penalty", p.PresencePenalty, &sp.PresencePenalty, -2, 2, false); ae != nil {
		return sp, ae
	}
	if p.Seed != nil {
		sp.Seed, sp.HasSeed = uint64(*p.Seed), true
	}
	var ae *apiError
	sp.LogitBias, ae = logitBias(p.LogitBias, vocab)
	return sp, ae
}

// floatIn checks an optional sampling field against [lo, hi], or (lo, hi]
// when openLo (0 is no valid top_p or repetition_penalty), and stores it.
func floatIn(name string, v *float64, dst *float32, lo, hi float64, openLo bool) *apiError {
	if v == nil {
		return nil
	}
	t := *v
	if !finite(t) || t < lo || t > hi || (openLo && t == lo) {
		open := "["
		if openLo {
			open = "("
		}
		return badRequest(name, "%s must be in %s%v, %v], got %v", name, open, lo, hi, t)
	}
	*dst = float32(t)
	return nil
}

// logitBias checks the token ids and values of a logit_bias object.
func logitBias(in map[string]float64, vocab int) (map[int32]float32, *apiError) {
	if len(in) == 0 {
		return nil, nil
	}
	out := make(map[int32]float32, len(in))
	for k, v := range in {
		id, err := strconv.ParseInt(k, 10, 32)
		if err != nil || id < 0 || (vocab > 0 && id >= int64(vocab)) {
			return nil, badRequest("logit_bias", "logit_bias key %q is not a token id%s", k, vocabHint(vocab))
		}
		if !finite(v) || v < -100 || v > 100 {
			return nil, badRequest("logit_bias", "logit_bias value for token %s must be in [-100, 100], got %v", k, v)
		}
		out[int32(id)] = float32(v)
	}
	return out, nil
}

// stops validates stop and stop_token_ids into r.
func (p *commonParams) stops(r *engine.Request, vocab int) *apiError {
	stops, ae := parseStop(p.Stop)
	if ae != nil {
		return ae
	}
	r.StopStrings = stops
	for _, id := range p.StopTokenIDs {
		if id < 0 || id > math.MaxInt32 || (vocab > 0 && id >= int64(vocab)) {
			return badRequest("stop_token_ids", "stop_token_ids: %d is not a token id%s", id, vocabHint(vocab))
		}
		r.StopTokens = append(r.StopTokens, int32(id))
	}
	return nil
}

func vocabHint(vocab int) string {
	if vocab > 0 {
		return " in [0, " + strconv.Itoa(vocab) + ")"
	}
	return ""
}

func parseStop(raw json.RawMessage) ([]string, *apiError) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		if one == "" {
			return nil, nil
		}
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, badRequest("stop", "stop must be a string or a list of strings")
	}
	out := many[:0]
	for _, s := range many {
		if s != "" {
			out = append(out, s)
		}
	}
	return out, nil
}

// setMaxTokens checks the prompt and the requested completion length
// against the context and fills r.MaxTokens. def is the default when the
// client gave none (0: whatever room is left, as the engine decides).
func (s *Server) setMaxTokens(r *engine.Request, p *commonParams, def int, field string) *apiError {
	want := def
	var asked *int
	if p.MaxCompletionTokens != nil {
		asked, field = p.MaxCompletionTokens, "max_completion_tokens"
	} else if p.MaxTokens != nil {
		asked, field = p.MaxTokens, "max_tokens"
	}
	if asked != nil {
		if *asked < 1 {
			return badRequest(field, "%s must be at least 1, got %d", field, *asked)
		}
		want = *asked
	}
	ctxLen := s.b.ContextLen()
	np := len(r.Prompt)
	if ctxLen > 0 {
		if np >= ctxLen {
			return &apiError{Status: 400, Type: "invalid_request_error", Param: "messages", Code: "context_length_exceeded",
				Message: "This model's maximum context length is " + strconv.Itoa(ctxLen) + " tokens. However, your prompt has " +
					strconv.Itoa(np) + " tokens, which leaves no room for the completion. Please reduce the length of the prompt."}
		}
		// want > ctxLen-np, not np+want > ctxLen: a max_tokens near 2^63
		// would wrap the sum negative and pass.
		if asked != nil && want > ctxLen-np {
			return &apiError{Status: 400, Type: "invalid_request_error", Param: field, Code: "context_length_exceeded",
				Message: "This model's maximum context length is " + strconv.Itoa(ctxLen) + " tokens. However, you requested " +
					strconv.FormatUint(uint64(np)+uint64(want), 10) + " tokens (" + strconv.Itoa(np) + " in the prompt, " + strconv.Itoa(want) +
					" in the completion). Please reduce the length of the prompt or the completion."}
		}
		if want > ctxLen-np {
			want = ctxLen - np
		}
	}
	// 0 leaves the limit to the engine: the room left in the context or in
	// the KV cache, whichever is smaller.
	r.MaxTokens = max(want, 0)
	return nil
}

func (s *Server) checkPromptIDs(ids []int32, field string) *apiError {
	l := s.limits()
	for j, id := range ids {
		if id < 0 || (l.vocab > 0 && int(id) >= l.vocab) {
			hint := ""
			if l.vocab > 0 {
				hint = " (valid ids: 0 to " + strconv.Itoa(l.vocab-1) + ")"
			}
			return badRequest(field, "%s[%d]: token id %d is out of the vocabulary%s", field, j, id, hint)
		}
	}
	return nil
}
