package engine

import (
	"fmt"
	"slices"
	"time"

	"pagoda/executor"
	"pagoda/model"
	"pagoda/sample"
	"pagoda/tokenizer"
)

// step drives one step: plan, batch, forward, sample, update (streaming as
// it samples); false when there was nothing to run.
func (e *Engine) step() bool {
	if e.pp != nil {
		return e.pp.round(e)
	}
	checkRestart(e)
	if e.cfg.Spec.Proposer != nil {
		e.propose()
	}
	// The cost model times the whole step but the proposer (timed on its
	// own): scheduling, the forward pass, sampling and verification.
	t0 := time.Now()
	p := e.sch.Schedule()
	e.account(p)
	if len(p.seqs) == 0 {
		return false
	}
	e.buildBatch(p, &e.in)
	e.st.Steps++
	e.st.BatchedTokens += uint64(p.tokens)
	// The KV manager writes the block tables, slot mapping and spans into
	// the step, so the executor's storage looks nothing up.
	err := e.kv.Plan(e.in.Pos, e.in.Seq, e.treePar, &e.plan)
	e.in.KV = &e.plan
	var out executor.StepOutput
	if err == nil {
		out, err = e.ex.Execute(&e.in)
	}
	finishStep(e, p, &e.in, &e.plan, out, err, t0)
	return true
}

// finishStep takes the output of the step in (planned as p, its KV plan
// kvp, started at t0) or its error: it samples, streams and updates the
// scheduler. Sequences that ended while the step was in flight
// (inflight.go) are passed over. A function, not a method: Engine's
// method set is full.
func finishStep(e *Engine, p *plan, in *executor.StepInput, kvp *model.KVPlan, out executor.StepOutput, err error, t0 time.Time) {
	if err == nil && e.kv.Link != nil {
		e.kv.Link.Report(out.KV) // before Update commits: what to free, what not to hash
	}
	e.moves, in.Moves = e.moves[:0], nil // applied, or lost with the step's requests
	logits := out.Logits
	if err == nil && in.TopK > 0 {
		e.topRows, err = spreadTop(e.topRows, out.TopIDs, out.Logits, p.rows, e.cfg.VocabSize, in.TopK)
		logits = e.topRows
	}
	if err == nil && len(logits) != p.rows*e.cfg.VocabSize {
		err = fmt.Errorf("engine: model returned %d logits for %d rows of %d", len(logits), p.rows, e.cfg.VocabSize)
	}
	if err != nil {
		for _, w := range p.seqs {
			if !w.seq.req.ended {
				e.endRequest(w.seq.req, FinishError, fmt.Errorf("engine: forward pass: %w", err))
			}
		}
		return
	}
	res := e.sampleStep(p, logits)
	e.moves = p.treeMoves(res, kvp.Slots, e.moves)
	e.feat.collect(p, res, out.Hidden, func(r *request) bool { return e.specTokens(r) > 0 })
	e.sch.Update(p, res)
	e.cost.ObserveStep(p.tokens, time.Since(t0).Seconds())
	e.ctlEnd(p.tokens)
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

// buildBatch flattens the plan into the step's input b.
func (e *Engine) buildBatch(p *plan, b *executor.StepInput) {
	b.Tokens, b.Pos, b.Seq, b.Logits = b.Tokens[:0], b.Pos[:0], b.Seq[:0], b.Logits[:0]
	trees := false
	for i := range p.seqs {
		w := &p.seqs[i]
		for j := 0; j < w.n; j++ {
			b.Tokens = append(b.Tokens, w.token(j))
			b.Pos = append(b.Pos, int32(w.start+j))
			b.Seq = append(b.Seq, w.seq.id)
			b.Logits = append(b.Logits, j >= w.n-w.rows-w.promptRows)
		}
		trees = trees || w.parent != nil
	}
	b.Rope, e.treePar = nil, nil
	if trees {
		e.rope, e.treePar = treeRows(p, e.rope, e.treePar)
		b.Rope = e.rope
	}
	b.Moves = e.moves
	b.Hidden = e.feat.wants()
	b.TopK = stepTopK(p, e.cfg.Executor != nil)
}

// sampleStep turns each planned sequence's logits rows into its outcome,
// streaming the tokens: a plain sample, or the verification of drafts.
func (e *Engine) sampleStep(p *plan, logits []float32) []outcome {
	res := make([]outcome, len(p.seqs))
	now := time.Now()
	V := e.cfg.VocabSize
	row := 0
	for i := range p.seqs {
		w := &p.seqs[i]
		if w.seq.finished {
			// Cancelled or stopped while its step was in flight
			// (inflight.go): its request has ended, nothing streams.
			row += w.promptRows + w.rows
			continue
		}
		if w.promptRows > 0 {
			e.scorePrompt(w, logits[row*V:(row+w.promptRows)*V])
			row += w.promptRows
		}
		if w.rows == 0 {
			continue
		}
		rows := logits[row*V : (row+w.rows)*V]
		row += w.rows
		s := w.seq
		if len(w.draft) > 0 {
			res[i] = e.verify(w, rows, now)
			continue
		}
		lg := rows[:V]
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

// verify decides which of w's drafts to keep from its logits rows (row i
// follows the sequence's tokens and drafts 0..i-1) and streams the kept
// tokens and the one after them, one at a time, so a stop (EOS, stop
// token or string, max_tokens, the context) inside the drafts cuts there.
//
// With q (the distribution each draft was drawn from) the rule is
// Leviathan/Chen speculative sampling: keep draft x with probability
// min(1, p(x)/q(x)); at the first rejection draw from normalise(max(0,
// p-q)); when every draft is kept, draw a bonus token from the last row.
// p is the target's distribution after the request's whole chain (bias,
// penalties over the tokens and the drafts kept so far, temperature,
// top-k, top-p, min-p), and the proposer drew q through the same chain.
// When q is one-hot (n-gram, greedy drafting) the rule needs no q: draw y
// from p as without speculation; x is kept if y = x (probability p(x)),
// and otherwise y is a draw from p without x, which is the residual. So
// each position costs one draw of the sampler's stream, and a seeded or
// greedy request yields exactly the tokens it yields without speculation.
func (e *Engine) verify(w *scheduled, rows []float32, now time.Time) outcome {
	s := w.seq
	r := s.req
	c := &r.comps[s.index]
	ps := c.sampler.(probSampler) // specTokens admitted only such samplers
	V := e.cfg.VocabSize
	q := s.spec.probs
	if len(q) > 0 && len(q) < len(w.draft)*V {
		panic(fmt.Sprintf("engine: %d q rows for %d drafts", len(q)/V, len(w.draft)))
	}
	hist := append(e.hist[:0], s.tokens...)
	var o outcome
	accepted, decided := 0, 0 // drafts kept (the one that ends the completion too), tree levels decided
	for node := int32(-1); ; {
		lg := rows[int(node+1)*V : int(node+2)*V] // row 0 is the root's, row k+1 node k's
		raw := e.keepRaw(r, lg)
		tok, next, leaf := e.pk.pick(w, ps, q, V, lg, hist, node, c.vrng, e.accept)
		done := e.emitToken(r, s.index, tok, raw, len(hist)+1, now)
		hist = append(hist, tok)
		if !leaf {
			decided++
		}
		if next >= 0 {
			accepted++
		}
		if next < 0 || done {
			// tok is next: a correction, a bonus, or the accepted draft
			// that ends the completion.
			o.next, o.done = tok, done
			break
		}
		o.path = append(o.path, next)
		node = next
	}
	e.hist = hist[:0]
	o.accepted = len(o.path)
	if w.parent == nil {
		o.path = nil // a chain keeps its leading drafts
	}
	s.spec.acc.Observe(decided, accepted)
	e.st.SpecDrafts++
	e.st.SpecDraftTokens += uint64(len(w.draft))
	e.st.SpecAccepted += uint64(accepted)
	e.m.specDrafts.Inc()
	e.m.specDraftTokens.Add(float64(len(w.draft)))
	e.m.specAccepted.Add(float64(accepted))
	e.m.specAccLen.Observe(float64(accepted + 1))
	for j := 0; j < accepted && j < len(e.m.specPos); j++ {
		e.m.specPos[j].Inc()
	}
	return o
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
	if r.r.ScoreOnly {
		// The prompt is computed (and scored); nothing is generated.
		if r.firstTok.IsZero() {
			r.firstTok = now
			e.st.PromptTokens += uint64(len(r.r.Prompt))
			e.m.promptTokens.Add(float64(len(r.r.Prompt)))
		}
		e.finishCompletion(r, Event{Index: index, Finish: FinishLength})
		return 0, true
	}
	raw := e.keepRaw(r, lg)
	c := &r.comps[index]
	tok := c.sampler.Sample(lg, history)
	if err := c.sampler.Err(); err != nil { // the constraint allows no token
		e.finishCompletion(r, Event{Index: index, Finish: FinishError, Err: fmt.Errorf("engine: request %q: %w", r.r.ID, err)})
		return tok, true
	}
	return tok, e.emitToken(r, index, tok, raw, len(history)+1, now)
}

// keepRaw copies the logits row lg when r wants logprobs: they are of the
// raw model distribution (as vLLM reports them), and sampling edits the
// row in place. nil when r wants none.
func (e *Engine) keepRaw(r *request, lg []float32) []float32 {
	if !r.r.Logprobs && r.r.TopLogprobs == 0 {
		return nil
	}
	e.scratch = append(e.scratch[:0], lg...)
	return e.scratch
}

// emitToken streams token tok of completion index of r (raw is its row
// from keepRaw, for logprobs; length the sequence's length with tok) and
// reports whether the completion ends with it. The event carries token
// ids, logprobs and the finish only: its text, and the stop strings, are
// the output processor's (outProc), off this loop.
func (e *Engine) emitToken(r *request, index int, tok int32, raw []float32, length int, now time.Time) bool {
	c := &r.comps[index]
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
	if raw != nil {
		if r.r.TopLogprobs > 0 {
			ev.Top = [][]TokenLogprob{topLogprobs(raw, r.r.TopLogprobs)}
		}
		ev.Logprob = []float32{sample.Logprob(raw, tok)}
	}
	ev.Finish = r.finishReason(e.vocab, c, tok, length)
	if ev.Finish == FinishNone {
		r.out.push(ev, false)
		return false
	}
	e.finishCompletion(r, ev)
	return true
}

// finishReason says whether completion c ends with tok (length is the
// sequence's length with tok): FinishStop only at an end-of-generation or
// stop token, as the output processor relies on.
func (r *request) finishReason(vocab *tokenizer.Vocab, c *completion, tok int32, length int) FinishReason {
	switch {
	case !r.r.IgnoreEOS && vocab.IsEOG(tok), slices.Contains(r.r.StopTokens, tok):
		return FinishStop
	case c.nOut >= r.maxTokens || length >= r.maxLen:
		return FinishLength
	}
	return FinishNone
}
