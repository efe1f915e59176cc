package engine

import (
	"strings"

	"pagoda/tokenizer"
)

// outProc is a request's output processor (vLLM v1's OutputProcessor):
// it runs on the request's own goroutine (outbox.pump), not on the engine
// loop, and turns the loop's events, which carry only token ids, logprobs
// and finish reasons, into what the client sees: text deltas, UTF-8 safe,
// with stop strings matched and cut. A stop string ends its completion
// here: the tokens after it are dropped, the loop is asked to stop the
// sequence (stop, through the path a cancellation takes), and the usage
// the loop reports is corrected by the tokens it generated meanwhile, so
// it counts what the client got.
type outProc struct {
	tok    tokenizer.Tokenizer
	prompt []int32
	stops  []string
	show   []int32
	stop   func(index int) // asks the loop to end a completion

	texts   []*tokenizer.TextStream // per completion, made at its first token
	done    []bool                  // finished, as the client sees it
	open    int                     // completions not done
	dropped int                     // tokens generated past a stop string
	// held is the request's last finish when it came before the loop's
	// usage (a stop string ended the completion the loop still ran): it
	// goes out with the usage, which must be on the final event.
	held *Event
}

func newOutProc(tok tokenizer.Tokenizer, r *request, stop func(int)) *outProc {
	n := r.r.N
	return &outProc{tok: tok, prompt: r.r.Prompt, stops: r.r.StopStrings, show: r.show, stop: stop,
		texts: make([]*tokenizer.TextStream, n), done: make([]bool, n), open: n}
}

// process takes the loop's events in order and hands out the client's
// through emit; true once the request's final event (the one with Usage)
// has gone out.
func (p *outProc) process(ev Event, emit func(Event)) bool {
	if ev.Prompt {
		emit(ev)
		return false
	}
	i := ev.Index
	if p.done[i] {
		// Generated after a stop string, or the loop's own end of a
		// completion the processor already ended.
		p.dropped += len(ev.Tokens)
		if ev.Usage == nil {
			return false
		}
		out := Event{Index: i}
		if p.held != nil {
			out, p.held = *p.held, nil
		}
		out.Usage = p.usage(ev.Usage)
		emit(out)
		return true
	}
	if len(ev.Tokens) > 0 {
		p.render(&ev)
	}
	if ev.Finish != FinishNone {
		p.done[i] = true
		p.open--
	}
	if ev.Usage != nil {
		ev.Usage = p.usage(ev.Usage)
		emit(ev)
		return true
	}
	if p.open == 0 {
		p.held = &ev
		return false
	}
	emit(ev)
	return false
}

func (p *outProc) usage(u *Usage) *Usage {
	c := *u
	c.CompletionTokens -= p.dropped
	return &c
}

// render sets ev's text from its tokens. The loop ends a completion with
// FinishStop only at an end-of-generation or stop token, which is not
// text; a stop string in the text ends it here.
func (p *outProc) render(ev *Event) {
	i := ev.Index
	ts := p.texts[i]
	if ts == nil {
		ts = tokenizer.NewTextStream(p.tok, p.prompt, p.stops)
		ts.ShowSpecial(p.show...)
		p.texts[i] = ts
	}
	var sb strings.Builder
	for j, tok := range ev.Tokens {
		last := j == len(ev.Tokens)-1
		if last && ev.Finish == FinishStop {
			sb.WriteString(ts.Flush())
			break
		}
		text, stopped := ts.Add(tok)
		sb.WriteString(text)
		if stopped {
			if ev.Finish == FinishNone {
				p.stop(i) // the loop has not ended it
			}
			p.cut(ev, j+1)
			break
		}
		if last && ev.Finish == FinishLength {
			sb.WriteString(ts.Flush())
		}
	}
	ev.Text = sb.String()
}

// cut keeps ev's first n tokens, the last of which completed a stop
// string.
func (p *outProc) cut(ev *Event, n int) {
	p.dropped += len(ev.Tokens) - n
	ev.Tokens = ev.Tokens[:n]
	if ev.Logprob != nil {
		ev.Logprob = ev.Logprob[:n]
	}
	if ev.Top != nil {
		ev.Top = ev.Top[:n]
	}
	ev.Finish = FinishStop
}
