package server

import (
	"context"
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"pagoda/engine"
)

// tagged is an engine event from the sub-request (one per prompt) sub.
type tagged struct {
	sub int
	ev  engine.Event
}

// submitAll starts one engine request per prompt and merges their event
// streams. On error every request already started is cancelled through
// ctx and its channel drained, so nothing leaks.
func (s *Server) submitAll(ctx context.Context, cancel context.CancelFunc, reqs []*engine.Request) (<-chan tagged, error) {
	chans := make([]<-chan engine.Event, 0, len(reqs))
	for _, r := range reqs {
		ch, err := s.b.Submit(ctx, r)
		if err != nil {
			cancel()
			for _, c := range chans {
				go drain(c)
			}
			return nil, err
		}
		if ch == nil {
			cancel()
			return nil, errors.New("server: backend returned no event channel")
		}
		chans = append(chans, ch)
	}
	out := make(chan tagged)
	var wg sync.WaitGroup
	for i, ch := range chans {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Keep reading after ctx ends: the engine closes the channel
			// once it has seen the cancellation, and must not block on us.
			for ev := range ch {
				select {
				case out <- tagged{i, ev}:
				case <-ctx.Done():
				}
			}
		}()
	}
	go func() { wg.Wait(); close(out) }()
	return out, nil
}

// answerer writes a generation's reply from its events: whole at the
// end, or as server-sent events as they come.
type answerer interface {
	collect(ctx context.Context, w http.ResponseWriter, events <-chan tagged)
	stream(ctx context.Context, w http.ResponseWriter, events <-chan tagged, includeUsage bool)
}

// generate admits the requests, submits them (show: the special tokens
// the reply must keep in its text) and answers through a, streaming when
// the client asked.
func (s completionsAPI) generate(w http.ResponseWriter, r *http.Request, p *commonParams, reqs []*engine.Request, show []int32, a answerer) {
	if !s.admit(w) {
		return
	}
	defer s.release()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	events, err := s.submitAll(engine.WithShowTokens(ctx, show...), cancel, reqs)
	if err != nil {
		writeAPIError(w, submitError(err))
		return
	}
	if p.Stream {
		a.stream(ctx, w, events, p.StreamOptions != nil && p.StreamOptions.IncludeUsage)
	} else {
		a.collect(ctx, w, events)
	}
}

func drain[T any](ch <-chan T) {
	for range ch {
	}
}

// lpEntry is the logprob record of one generated token.
type lpEntry struct {
	id  int32
	lp  float32
	top []engine.TokenLogprob
}

func eventLogprobs(ev *engine.Event) []lpEntry {
	if len(ev.Logprob) == 0 && len(ev.Top) == 0 {
		return nil
	}
	out := make([]lpEntry, len(ev.Tokens))
	for i, id := range ev.Tokens {
		out[i].id = id
		out[i].lp = float32(math.Inf(-1))
		if i < len(ev.Logprob) {
			out[i].lp = ev.Logprob[i]
		}
		if i < len(ev.Top) {
			out[i].top = ev.Top[i]
		}
	}
	return out
}

// clampLP keeps logprobs JSON-encodable (-inf has no JSON form); vLLM
// uses the same floor.
func clampLP(x float32) float64 {
	f := float64(x)
	if math.IsNaN(f) || f < -9999 {
		return -9999
	}
	return f
}

// tokenBytes is the UTF-8 bytes of a token's text, decoding the
// "bytes:\xNN" form used for partial characters.
func tokenBytes(text string) []int {
	var raw []byte
	if rest, ok := strings.CutPrefix(text, "bytes:"); ok {
		for len(rest) >= 4 && rest[0] == '\\' && rest[1] == 'x' {
			v, err := strconv.ParseUint(rest[2:4], 16, 8)
			if err != nil {
				break
			}
			raw = append(raw, byte(v))
			rest = rest[4:]
		}
		if rest != "" {
			raw = append(raw, rest...)
		}
	} else {
		raw = []byte(text)
	}
	out := make([]int, len(raw))
	for i, b := range raw {
		out[i] = int(b)
	}
	return out
}

// usageJSON is OpenAI's usage object.
type usageJSON struct {
	PromptTokens        int            `json:"prompt_tokens"`
	CompletionTokens    int            `json:"completion_tokens"`
	TotalTokens         int            `json:"total_tokens"`
	PromptTokensDetails *promptDetails `json:"prompt_tokens_details"`
}

type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// usageSum adds up the engine's usage over sub-requests, counting what it
// can itself for a sub-request that ended without one.
type usageSum struct {
	got    []bool
	prompt []int
	gen    []int
	cached []int
}

func newUsageSum(reqs []*engine.Request) *usageSum {
	u := &usageSum{got: make([]bool, len(reqs)), prompt: make([]int, len(reqs)),
		gen: make([]int, len(reqs)), cached: make([]int, len(reqs))}
	for i, r := range reqs {
		u.prompt[i] = len(r.Prompt)
	}
	return u
}

func (u *usageSum) add(t tagged) {
	if t.ev.Usage != nil {
		u.got[t.sub] = true
		u.prompt[t.sub] = t.ev.Usage.PromptTokens
		u.gen[t.sub] = t.ev.Usage.CompletionTokens
		u.cached[t.sub] = t.ev.Usage.CachedTokens
	} else if !u.got[t.sub] && !t.ev.Prompt {
		u.gen[t.sub] += len(t.ev.Tokens)
	}
}

func (u *usageSum) json() *usageJSON {
	var out usageJSON
	var c int
	for i := range u.prompt {
		out.PromptTokens += u.prompt[i]
		out.CompletionTokens += u.gen[i]
		c += u.cached[i]
	}
	out.PromptTokensDetails = &promptDetails{CachedTokens: c}
	out.TotalTokens = out.PromptTokens + out.CompletionTokens
	return &out
}

func finishString(f engine.FinishReason) any {
	switch f {
	case engine.FinishNone:
		return nil
	case engine.FinishLength:
		return "length"
	case engine.FinishCancelled:
		return "abort"
	case finishToolCalls:
		return "tool_calls"
	default:
		return "stop"
	}
}

// sse writes server-sent events and notices a vanished client.
type sse struct {
	w      http.ResponseWriter
	rc     *http.ResponseController
	failed bool
	cut    func() *apiError // Server.cutError
}

func newSSE(w http.ResponseWriter, cut func() *apiError) *sse {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	s := &sse{w: w, rc: http.NewResponseController(w), cut: cut}
	s.flush()
	return s
}

func (s *sse) flush() {
	if err := s.rc.Flush(); err != nil {
		s.failed = true
	}
}

func (s *sse) send(v any) {
	if s.failed {
		return
	}
	b, err := marshal(v)
	if err != nil {
		b, _ = marshal(&apiError{Status: 500, Type: "server_error", Message: "encoding chunk: " + err.Error()})
	}
	s.raw(b)
}

func (s *sse) raw(b []byte) {
	if s.failed {
		return
	}
	buf := make([]byte, 0, len(b)+8)
	buf = append(buf, "data: "...)
	buf = append(buf, b...)
	buf = append(buf, "\n\n"...)
	if _, err := s.w.Write(buf); err != nil {
		s.failed = true
		return
	}
	s.flush()
}

func (s *sse) done() { s.raw([]byte("[DONE]")) }

// relay streams the engine's events to the client: it adds each event to
// usage and hands it to chunk, which sends what the endpoint shows of it.
// An engine error is sent as an error chunk and ends the stream. It
// reports whether the events ran to their end (false: the client left or
// an error ended the stream, so no usage chunk or [DONE] should follow).
func (s *sse) relay(ctx context.Context, events <-chan tagged, usage *usageSum, chunk func(t tagged)) bool {
	for {
		var t tagged
		var ok bool
		select {
		case t, ok = <-events:
		case <-ctx.Done():
			if ae := s.cut(); ae != nil {
				s.send(ae)
				s.done()
			}
			return false
		}
		if !ok {
			return true
		}
		if t.ev.Err != nil {
			s.send(toAPIError(t.ev.Err))
			s.done()
			return false
		}
		usage.add(t)
		chunk(t)
		if s.failed {
			return false
		}
	}
}

// runeLen counts characters as OpenAI's text_offset does.
func runeLen(s string) int { return utf8.RuneCountInString(s) }

// rawEvent writes a named server-sent event (Anthropic's streams name
// every event).
func (s *sse) rawEvent(name string, b []byte) {
	if s.failed {
		return
	}
	buf := make([]byte, 0, len(b)+len(name)+16)
	buf = append(buf, "event: "...)
	buf = append(buf, name...)
	buf = append(buf, "\ndata: "...)
	buf = append(buf, b...)
	buf = append(buf, "\n\n"...)
	if _, err := s.w.Write(buf); err != nil {
		s.failed = true
		return
	}
	s.flush()
}
