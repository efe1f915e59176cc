package engine

import (
	"fmt"
	"time"

	"pagoda/sample"
)

// step drives one step: plan, batch, forward, sample, update (streaming as
// it samples); false when there was nothing to run.
func (e *Engine) step() bool {
	p := e.sch.Schedule()
	e.account(p)
	if len(p.seqs) == 0 {
		return false
	}
	e.buildBatch(p)
	e.st.Steps++
	e.st.BatchedTokens += uint64(p.tokens)
	logits, err := e.fw.Forward(&e.batch, e.kv)
	if err == nil && len(logits) != p.rows*e.cfg.VocabSize {
		err = fmt.Errorf("engine: model returned %d logits for %d rows of %d", len(logits), p.rows, e.cfg.VocabSize)
	}
	if err != nil {
		for _, w := range p.seqs {
			if !w.seq.req.ended {
				e.endRequest(w.seq.req, FinishError, fmt.Errorf("engine: forward pass: %w", err))
			}
		}
		return true
	}
	e.sch.Update(p, e.sampleStep(p, logits))
	return true
}

// account counts what the scheduler did besides planning work.
func (e *Engine) account(p *plan) {
	for _, r := range p.admitted {
		e.queued.Add(-1)
		e.m.prefixQueries.Add(float64(len(r.r.Prompt)))
		e.m.prefixHits.Add(float64(r.cached))
	}
	e.st.Preemptions += uint64(len(p.preempted))
	e.m.preemptions.Add(float64(len(p.preempted)))
}

// buildBatch flattens the plan into the model's batch.
func (e *Engine) buildBatch(p *plan) {
	b := &e.batch
	b.Tokens, b.Pos, b.Seq, b.Logits = b.Tokens[:0], b.Pos[:0], b.Seq[:0], b.Logits[:0]
	for i := range p.seqs {
		w := &p.seqs[i]
		for j := 0; j < w.n; j++ {
			b.Tokens = append(b.Tokens, w.token(j))
			b.Pos = append(b.Pos, int32(w.start+j))
			b.Seq = append(b.Seq, w.seq.id)
			b.Logits = append(b.Logits, j >= w.n-w.rows-w.promptRows)
		}
	}
}

// sampleStep turns each planned sequence's logits rows into its outcome,
// streaming the tokens. There is no proposer yet, so no sequence carries
// drafts; one that did would accept none and sample its first row (the one
// after its last kept token): right, if wasteful, until a verifier using
// sample's SampleProbs goes here.
func (e *Engine) sampleStep(p *plan, logits []float32) []outcome {
	res := make([]outcome, len(p.seqs))
	now := time.Now()
	V := e.cfg.VocabSize
	row := 0
	for i := range p.seqs {
		w := &p.seqs[i]
		if w.promptRows > 0 {
			e.scorePrompt(w, logits[row*V:(row+w.promptRows)*V])
			row += w.promptRows
		}
		if w.rows == 0 {
			continue
		}
		lg := logits[row*V : (row+1)*V]
		row += w.rows
		s := w.seq
		if !w.fork {
			res[i].next, res[i].done = e.emit(s.req, s.index, lg, s.tokens, now)
			continue
		}
		// Every completion samples the prompt's logits with its own
		// sampler; Sample edits its input, so each gets a copy.
		base := append([]float32(nil), lg...)
		for c := range s.req.comps {
			buf := append(make([]float32, 0, len(base)), base...)
			tok, done := e.emit(s.req, c, buf, s.tokens, now)
			if c == 0 {
				res[i].next, res[i].done = tok, done
			} else {
				res[i].forks = append(res[i].forks, forkToken{tok, done})
			}
		}
	}
	return res
}

// scorePrompt streams the logprobs of the prompt tokens that w's prompt
// rows predict, one copy per completion, as each chunk of the prompt is
// computed, so no row outlives its step.
func (e *Engine) scorePrompt(w *scheduled, rows []float32) {
	r := w.seq.req
	V := e.cfg.VocabSize
	from := r.promptDone
	ev := Event{Prompt: true, Tokens: make([]int32, w.promptRows), Logprob: make([]float32, w.promptRows)}
	if r.r.TopLogprobs > 0 {
		ev.Top = make([][]TokenLogprob, w.promptRows)
	}
	for j := range w.promptRows {
		lg := rows[j*V : (j+1)*V]
		tok := r.r.Prompt[from+j+1]
		ev.Tokens[j] = tok
		ev.Logprob[j] = sample.Logprob(lg, tok)
		if ev.Top != nil {
			ev.Top[j] = topLogprobs(lg, r.r.TopLogprobs)
		}
	}
	r.promptDone += w.promptRows
	for c := range r.comps {
		ev.Index = c
		r.out.push(ev, false)
	}
}

// emit samples completion index of r from lg after history, streams the
// token, and reports it and whether the completion ends with it.
func (e *Engine) emit(r *request, index int, lg []float32, history []int32, now time.Time) (int32, bool) {
	c := &r.comps[index]
	if c.text == nil {
		c.text = newTextOut(e.tok, r.r.Prompt, r.r.StopStrings, r.r.ShowTokens...)
	}
	// Logprobs are of the raw model distribution (as vLLM reports them),
	// taken before Sample edits the logits in place.
	var lp float32
	var top []TokenLogprob
	want := r.r.Logprobs || r.r.TopLogprobs > 0
	if want {
		e.scratch = append(e.scratch[:0], lg...)
		top = topLogprobs(e.scratch, r.r.TopLogprobs)
	}
	tok := c.sampler.Sample(lg, history)
	if err := c.sampler.Err(); err != nil { // the constraint allows no token
		e.finishCompletion(r, Event{Index: index, Finish: FinishError, Err: fmt.Errorf("engine: request %q: %w", r.r.ID, err)})
		return tok, true
	}
	if want {
		lp = sample.Logprob(e.scratch, tok)
	}
	c.nOut++
	r.completion++
	e.st.GenerationTokens++
	e.m.genTokens.Inc()
	if r.firstTok.IsZero() {
		r.firstTok = now
		e.m.ttft.Observe(now.Sub(r.arrival).Seconds())
		e.st.PromptTokens += uint64(len(r.r.Prompt))
		e.m.promptTokens.Add(float64(len(r.r.Prompt)))
	} else if !c.lastTok.IsZero() {
		e.m.itl.Observe(now.Sub(c.lastTok).Seconds())
	}
	c.lastTok = now

	ev := Event{Index: index, Tokens: []int32{tok}}
	if want {
		ev.Logprob = []float32{lp}
		if r.r.TopLogprobs > 0 {
			ev.Top = [][]TokenLogprob{top}
		}
	}
	ev.Finish = e.finishReason(r, c, tok, len(history)+1, &ev)
	if ev.Finish == FinishNone {
		r.out.push(ev, false)
		return tok, false
	}
	e.finishCompletion(r, ev)
	return tok, true
}

// finishReason feeds tok to the detokenizer (adding the text to ev) and
// says whether the completion ends with it; length is the sequence's
// length with tok.
func (e *Engine) finishReason(r *request, c *completion, tok int32, length int, ev *Event) FinishReason {
	finish := FinishNone
	if !r.r.IgnoreEOS && e.vocab.IsEOG(tok) {
		finish = FinishStop
	}
	for _, st := range r.r.StopTokens {
		if tok == st {
			finish = FinishStop
		}
	}
	if finish != FinishNone {
		ev.Text = c.text.flush()
		return finish
	}
	text, stopped := c.text.add(tok)
	ev.Text = text
	switch {
	case stopped:
		return FinishStop
	case c.nOut >= r.maxTokens || length >= e.maxLen:
		ev.Text += c.text.flush()
		return FinishLength
	}
	return FinishNone
}
