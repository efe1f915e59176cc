package server

import (
	"context"
	"strings"
	"time"

	"pagoda/engine"
)

// turnResult is one finished completion (n = 1) for the endpoints that
// are not OpenAI's: the reply's text with tool-call markup parsed out, the
// calls, and what ollama and Anthropic report about it.
type turnResult struct {
	text      string
	calls     []toolCall
	tokens    []int32
	finish    engine.FinishReason
	usage     usageJSON
	total     time.Duration // submit to the last event
	promptDur time.Duration // submit to the first generated token
}

// reason is ollama's done_reason.
func (r *turnResult) reason() string {
	if r.finish == engine.FinishLength {
		return "length"
	}
	return "stop"
}

// stopSequence is the caller's stop string that ended the reply, or "":
// the engine cuts the stop string from the text, so it is found in the
// detokenized tokens just past the text.
func (s *Server) stopSequence(r *turnResult, stops []string) string {
	if r.finish != engine.FinishStop || len(stops) == 0 || len(r.calls) > 0 {
		return ""
	}
	full := s.b.Detokenize(r.tokens)
	i := strings.LastIndex(full, r.text)
	if r.text == "" {
		i = 0
	}
	if i < 0 {
		return ""
	}
	rest := full[i+len(r.text):]
	best, at := "", len(rest)+1
	for _, st := range stops {
		if j := strings.Index(rest, st); j >= 0 && j < at {
			best, at = st, j
		}
	}
	return best
}

// runTurn submits er and gathers its events. onText, when set, receives
// the reply's text as it comes (held back where it may be tool-call
// markup). An engine error before the end comes back as the apiError; a
// client that left yields a partial result with ctx done.
func (s *Server) runTurn(ctx context.Context, cancel context.CancelFunc, er *engine.Request, format toolFormat, onText func(string)) (*turnResult, *apiError) {
	start := time.Now()
	reqs := []*engine.Request{er}
	events, err := s.submitAll(engine.WithShowTokens(ctx, s.markerTokens(format)...), cancel, reqs)
	if err != nil {
		return nil, submitError(err)
	}
	usage := newUsageSum(reqs)
	c := &chatRun{s: s, tools: format}
	var held, all strings.Builder
	sent := 0
	res := &turnResult{}
	var first time.Time
	for t := range events {
		if t.ev.Err != nil {
			cancel()
			return nil, toAPIError(t.ev.Err)
		}
		usage.add(t)
		if t.ev.Prompt {
			continue
		}
		if first.IsZero() && len(t.ev.Tokens) > 0 {
			first = time.Now()
		}
		res.tokens = append(res.tokens, t.ev.Tokens...)
		text, finish := t.ev.Text, t.ev.Finish
		if format != toolNone {
			var calls []toolCall
			text, calls = c.toolText(&held, &sent, text, finish)
			res.calls = append(res.calls, calls...)
		}
		all.WriteString(text)
		if text != "" && onText != nil {
			onText(text)
		}
		if finish != engine.FinishNone {
			res.finish = finish
		}
	}
	if ctx.Err() != nil {
		if ae := s.cutError(); ae != nil {
			return nil, ae
		}
	}
	res.text = all.String()
	res.usage = *usage.json()
	res.total = time.Since(start)
	res.promptDur = res.total
	if !first.IsZero() {
		res.promptDur = first.Sub(start)
	}
	if res.finish == engine.FinishNone {
		res.finish = engine.FinishStop
	}
	return res, nil
}
