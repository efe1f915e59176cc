package server

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"pagoda/engine"
)

// maxChoices bounds prompts × n in one request, so one call cannot fill
// the engine's waiting queue on its own.
const maxChoices = 256

type completionRequest struct {
	commonParams
	Prompt           json.RawMessage `json:"prompt"`
	Suffix           *string         `json:"suffix"`
	Echo             bool            `json:"echo"`
	Logprobs         *int            `json:"logprobs"`
	AddSpecialTokens *bool           `json:"add_special_tokens"`
	ResponseFormat   *responseFormat `json:"response_format"`
}

// promptItem is one prompt of a completions request.
type promptItem struct {
	text    string // as given, or "" for token prompts
	ids     []int32
	hasText bool
	where   string // "prompt" or "prompt[i]" for token prompts, for errors
}

// parseIDs reads a list of token ids, naming the offending element: a
// number too large for a token id is out of the vocabulary, not a
// malformed prompt.
func parseIDs(list []json.RawMessage, where string) ([]int32, *apiError) {
	ids := make([]int32, len(list))
	for j, el := range list {
		n, err := strconv.ParseInt(string(el), 10, 64)
		if err != nil {
			var f float64
			if json.Unmarshal(el, &f) != nil || f != math.Trunc(f) {
				return nil, badRequest("prompt", "%s[%d] must be an integer token id, got %s", where, j, el)
			}
			n = math.MaxInt64 // an integer beyond int64
		}
		if n < 0 || n > math.MaxInt32 {
			return nil, badRequest("prompt", "%s[%d]: token id %s is out of the vocabulary", where, j, el)
		}
		ids[j] = int32(n)
	}
	return ids, nil
}

// parsePrompt accepts a string, a list of strings, a list of token ids or
// a list of such lists.
func parsePrompt(raw json.RawMessage) ([]promptItem, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest("prompt", "prompt is required")
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return []promptItem{{text: one, hasText: true}}, nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, badRequest("prompt", "prompt must be a string, a list of strings, a list of token ids or a list of token-id lists")
	}
	if len(list) == 0 {
		return nil, badRequest("prompt", "prompt must not be an empty list")
	}
	if c := list[0]; len(c) > 0 && (c[0] == '-' || (c[0] >= '0' && c[0] <= '9')) {
		ids, ae := parseIDs(list, "prompt")
		if ae != nil {
			return nil, ae
		}
		return []promptItem{{ids: ids, where: "prompt"}}, nil
	}
	out := make([]promptItem, 0, len(list))
	for i, el := range list {
		var s string
		if json.Unmarshal(el, &s) == nil {
			out = append(out, promptItem{text: s, hasText: true})
			continue
		}
		var sub []json.RawMessage
		if err := json.Unmarshal(el, &sub); err != nil {
			return nil, badRequest("prompt", "prompt[%d] must be a string or a list of token ids", i)
		}
		if len(sub) == 0 {
			return nil, badRequest("prompt", "prompt[%d] is an empty token list", i)
		}
		where := "prompt[" + strconv.Itoa(i) + "]"
		ids, ae := parseIDs(sub, where)
		if ae != nil {
			return nil, ae
		}
		out = append(out, promptItem{ids: ids, where: where})
	}
	return out, nil
}

func (s completionsAPI) handleCompletions(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	if ae := decodeBody(r, &req); ae != nil {
		writeAPIError(w, ae)
		return
	}
	base, prompts, ae := s.prepareCompletion(r.Context(), &req)
	if ae != nil {
		writeAPIError(w, ae)
		return
	}
	id := newID("cmpl-")
	reqs, ae := s.completionRequests(&req, base, prompts, id)
	if ae != nil {
		writeAPIError(w, ae)
		return
	}
	c := &completionRun{s: s.Server, id: id, created: time.Now().Unix(), n: base.N, prompts: prompts,
		echo: req.Echo, logprobs: base.Logprobs, promptLP: base.PromptLogprobs, usage: newUsageSum(reqs)}
	s.generate(w, r, &req.commonParams, reqs, nil, c)
}

// prepareCompletion validates a completions request into the engine
// request its prompts share and the prompts as parsed (not tokenized).
func (s completionsAPI) prepareCompletion(ctx context.Context, req *completionRequest) (*engine.Request, []promptItem, *apiError) {
	if ae := s.checkModel(req.Model); ae != nil {
		return nil, nil, ae
	}
	if req.Suffix != nil && *req.Suffix != "" {
		return nil, nil, badRequest("suffix", "suffix is not supported")
	}
	lim := s.limits()
	base, ae := req.toEngine(lim)
	if ae != nil {
		return nil, nil, ae
	}
	if base.Constraint, ae = s.constraint(ctx, req.ResponseFormat); ae != nil {
		return nil, nil, ae
	}
	if req.Logprobs != nil {
		if *req.Logprobs < 0 || *req.Logprobs > lim.maxLogprobs {
			return nil, nil, badRequest("logprobs", "logprobs must be in [0, %d], got %d", lim.maxLogprobs, *req.Logprobs)
		}
		// Echo with logprobs scores the prompt too, as vLLM does.
		base.Logprobs, base.TopLogprobs, base.PromptLogprobs = true, *req.Logprobs, req.Echo
	}
	prompts, ae := parsePrompt(req.Prompt)
	if ae != nil {
		return nil, nil, ae
	}
	if s.o.MaxWaiting > 0 && len(prompts) > s.o.MaxWaiting {
		// Each prompt is one engine request; more than the queue holds
		// would be refused (429) however long the client waited.
		return nil, nil, badRequest("prompt", "%d prompts exceed the server's waiting-queue capacity of %d requests; send them in smaller batches", len(prompts), s.o.MaxWaiting)
	}
	if len(prompts)*base.N > maxChoices {
		return nil, nil, badRequest("prompt", "%d prompts × n = %d asks for more than %d completions in one request", len(prompts), base.N, maxChoices)
	}
	return base, prompts, nil
}

// completionRequests makes one engine request per prompt from base, with
// its own id and token budget. It fills in each prompt's ids (and, for
// token prompts echoed, its text), which the reply reads.
func (s completionsAPI) completionRequests(req *completionRequest, base *engine.Request, prompts []promptItem, id string) ([]*engine.Request, *apiError) {
	// echo with max_tokens 0 returns the prompt (and its logprobs) alone,
	// as OpenAI's legacy completions and vLLM do: evaluation harnesses
	// score text this way.
	scoreOnly := req.Echo && req.MaxCompletionTokens == nil && req.MaxTokens != nil && *req.MaxTokens == 0
	addSpecial := true
	if req.AddSpecialTokens != nil {
		addSpecial = *req.AddSpecialTokens
	}
	reqs := make([]*engine.Request, len(prompts))
	for i := range prompts {
		p := &prompts[i]
		if ae := s.tokenizePrompt(p, addSpecial, req.Echo); ae != nil {
			return nil, ae
		}
		if len(p.ids) == 0 {
			return nil, badRequest("prompt", "prompt %d is empty after tokenization", i)
		}
		er := *base
		er.ID = id
		if len(prompts) > 1 {
			er.ID = id + "-" + strconv.Itoa(i)
		}
		er.Prompt = p.ids
		limits := &req.commonParams
		if scoreOnly {
			// Checked as one token, so a prompt that fills the context is
			// still refused; nothing is generated.
			one := 1
			cp := req.commonParams
			cp.MaxTokens = &one
			limits, er.ScoreOnly = &cp, true
		}
		if ae := s.setMaxTokens(&er, limits, 16, "max_tokens"); ae != nil {
			ae.Param = strings.Replace(ae.Param, "messages", "prompt", 1)
			return nil, ae
		}
		reqs[i] = &er
	}
	return reqs, nil
}

// tokenizePrompt gives a text prompt its ids; a token prompt's ids are
// checked against the vocabulary, and decoded when the reply echoes them.
func (s completionsAPI) tokenizePrompt(p *promptItem, addSpecial, echo bool) *apiError {
	if p.hasText {
		p.ids = s.b.Tokenize(p.text, addSpecial)
		return nil
	}
	if ae := s.checkPromptIDs(p.ids, p.where); ae != nil {
		ae.Param = "prompt"
		return ae
	}
	if echo {
		p.text = s.b.Detokenize(p.ids)
	}
	return nil
}

type completionRun struct {
	s        *Server
	id       string
	created  int64
	n        int
	prompts  []promptItem
	echo     bool
	logprobs bool
	promptLP bool // echo with logprobs: the prompt's tokens lead each choice's logprobs
	usage    *usageSum
}

type completionChoice struct {
	Index        int                 `json:"index"`
	Text         string              `json:"text"`
	Logprobs     *completionLogprobs `json:"logprobs"`
	FinishReason any                 `json:"finish_reason"`
}

type completionLogprobs struct {
	Tokens        []string     `json:"tokens"`
	TokenLogprobs []*float64   `json:"token_logprobs"` // null for the first prompt token
	TopLogprobs   []orderedMap `json:"top_logprobs"`
	TextOffset    []int        `json:"text_offset"`
}

type completionResponse struct {
	ID                string             `json:"id"`
	Object            string             `json:"object"`
	Created           int64              `json:"created"`
	Model             string             `json:"model"`
	SystemFingerprint string             `json:"system_fingerprint"`
	Choices           []completionChoice `json:"choices"`
	Usage             *usageJSON         `json:"usage,omitempty"`
}

// streamUsage marshals "usage": null on every chunk when include_usage is
// on, as OpenAI does, and omits it otherwise.
type completionChunk struct {
	completionResponse
	Usage *usageJSON `json:"usage"`
}

// orderedMap is a JSON object that keeps its keys in insertion order
// (most likely first), like the dicts vLLM returns.
type orderedMap []kv

type kv struct {
	k string
	v float64
}

func (m orderedMap) MarshalJSON() ([]byte, error) {
	if m == nil {
		return []byte("null"), nil // the first prompt token has nothing to rank
	}
	var b bytes.Buffer
	b.WriteByte('{')
	for i, e := range m {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := marshal(e.k)
		b.Write(k)
		b.WriteByte(':')
		b.WriteString(strconv.FormatFloat(e.v, 'g', -1, 64))
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// addLogprobs appends entries to lp, advancing the character offset.
func (c *completionRun) addLogprobs(lp *completionLogprobs, entries []lpEntry, offset *int) {
	for _, e := range entries {
		text := c.s.b.TokenText(e.id)
		lp.Tokens = append(lp.Tokens, text)
		v := clampLP(e.lp)
		lp.TokenLogprobs = append(lp.TokenLogprobs, &v)
		top := make(orderedMap, 0, len(e.top)+1)
		seen := make(map[string]bool, len(e.top)+1)
		for _, t := range e.top {
			tt := c.s.b.TokenText(t.ID)
			if !seen[tt] {
				seen[tt] = true
				top = append(top, kv{tt, clampLP(t.Logprob)})
			}
		}
		if !seen[text] {
			top = append(top, kv{text, clampLP(e.lp)})
		}
		lp.TopLogprobs = append(lp.TopLogprobs, top)
		lp.TextOffset = append(lp.TextOffset, *offset)
		*offset += tokenRunes(text)
	}
}

// promptLogprobs starts a choice's logprobs with the first prompt token,
// which nothing predicts, so its logprob and alternatives are null.
func (c *completionRun) promptLogprobs(prompt []int32, offset *int) *completionLogprobs {
	text := c.s.b.TokenText(prompt[0])
	lp := &completionLogprobs{Tokens: []string{text}, TokenLogprobs: []*float64{nil},
		TopLogprobs: []orderedMap{nil}, TextOffset: []int{*offset}}
	*offset += tokenRunes(text)
	return lp
}

// promptHead is how many leading prompt tokens promptOffsets places by
// decoding the prefix before them: the start is where a tokenizer adds
// what the text does not show (BOS, a dummy-prefix space the decoder
// drops). Past it each token adds its own length, so a long prompt costs
// O(n), not the O(n²) of decoding every prefix.
const promptHead = 8

// promptOffsets are OpenAI's text_offset for a prompt's tokens: where each
// starts in text, the prompt as echoed. A control token (BOS) takes no
// room; offsets never pass the text's end nor go back.
func (c *completionRun) promptOffsets(ids []int32, text string) []int {
	limit := runeLen(text)
	offs := make([]int, len(ids))
	off := 0
	for i := range ids {
		switch {
		case i <= promptHead:
			off = max(off, runeLen(c.s.b.Detokenize(ids[:i])))
		case c.s.b.Detokenize(ids[i-1:i]) != "":
			off += tokenRunes(c.s.b.TokenText(ids[i-1]))
		}
		offs[i] = min(off, limit)
	}
	return offs
}

// placePrompt sets the text offsets of the prompt's entries in lp (the
// first len(p.ids)) from promptOffsets; the completion's, counted from the
// text's end, stay.
func (c *completionRun) placePrompt(lp *completionLogprobs, p promptItem) {
	if lp == nil {
		return
	}
	copy(lp.TextOffset, c.promptOffsets(p.ids, p.text))
}

// tokenRunes is how many characters a token adds to the text; a partial
// UTF-8 byte counts as one, as Python's decode with replacement would.
func tokenRunes(text string) int {
	if strings.HasPrefix(text, "bytes:") {
		var raw []byte
		for _, b := range tokenBytes(text) {
			raw = append(raw, byte(b))
		}
		return utf8.RuneCount(raw)
	}
	return runeLen(text)
}

func (c *completionRun) collect(ctx context.Context, w http.ResponseWriter, events <-chan tagged) {
	nc := len(c.prompts) * c.n
	texts := make([]strings.Builder, nc)
	finish := make([]engine.FinishReason, nc)
	lps := make([]*completionLogprobs, nc)
	offsets := make([]int, nc)
	promptOff := make([]int, nc) // prompt tokens' offsets count from the text's start
	for i := range nc {
		if c.echo {
			texts[i].WriteString(c.prompts[i/c.n].text)
			offsets[i] = runeLen(c.prompts[i/c.n].text)
		}
		if c.logprobs {
			lps[i] = &completionLogprobs{Tokens: []string{}, TokenLogprobs: []*float64{}, TopLogprobs: []orderedMap{}, TextOffset: []int{}}
		}
		if c.promptLP {
			lps[i] = c.promptLogprobs(c.prompts[i/c.n].ids, &promptOff[i])
		}
	}
	for t := range events {
		if t.ev.Err != nil {
			writeAPIError(w, toAPIError(t.ev.Err))
			return
		}
		c.usage.add(t)
		i := t.sub*c.n + t.ev.Index
		if t.ev.Index < 0 || t.ev.Index >= c.n {
			continue
		}
		if t.ev.Prompt {
			// Prompt events come before the choice's first token, so
			// appending keeps the prompt's entries ahead of the completion's.
			c.addLogprobs(lps[i], eventLogprobs(&t.ev), &promptOff[i])
			continue
		}
		texts[i].WriteString(t.ev.Text)
		if c.logprobs {
			c.addLogprobs(lps[i], eventLogprobs(&t.ev), &offsets[i])
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
	resp := completionResponse{ID: c.id, Object: "text_completion", Created: c.created,
		Model: c.s.b.ModelName(), SystemFingerprint: c.s.fp, Usage: c.usage.json()}
	for i := range nc {
		if c.promptLP {
			c.placePrompt(lps[i], c.prompts[i/c.n])
		}
		f := finish[i]
		if f == engine.FinishNone {
			f = engine.FinishStop
		}
		resp.Choices = append(resp.Choices, completionChoice{Index: i, Text: texts[i].String(),
			Logprobs: lps[i], FinishReason: finishString(f)})
	}
	writeJSON(w, resp)
}

func (c *completionRun) chunk(choices []completionChoice, withUsage bool) any {
	ch := completionChunk{completionResponse: completionResponse{ID: c.id, Object: "text_completion",
		Created: c.created, Model: c.s.b.ModelName(), SystemFingerprint: c.s.fp, Choices: choices}}
	if !withUsage {
		return ch.completionResponse
	}
	return ch
}

func (c *completionRun) stream(ctx context.Context, w http.ResponseWriter, events <-chan tagged, includeUsage bool) {
	out := newSSE(w, c.s.cutError)
	nc := len(c.prompts) * c.n
	offsets := make([]int, nc)
	// With prompt logprobs each choice's echo chunk waits for the prompt's
	// scores, which arrive over the prefill's steps; pending counts them.
	promptLPs := make([]*completionLogprobs, nc)
	pending := make([]int, nc)
	sendEcho := func(i int) {
		c.placePrompt(promptLPs[i], c.prompts[i/c.n])
		out.send(c.chunk([]completionChoice{{Index: i, Text: c.prompts[i/c.n].text, Logprobs: promptLPs[i]}}, includeUsage))
		promptLPs[i] = nil
	}
	if c.echo {
		for i := range nc {
			p := c.prompts[i/c.n]
			offsets[i] = runeLen(p.text)
			if c.promptLP {
				off := 0
				promptLPs[i] = c.promptLogprobs(p.ids, &off)
				if pending[i] = len(p.ids) - 1; pending[i] > 0 {
					continue
				}
			}
			sendEcho(i)
		}
	}
	if !out.relay(ctx, events, c.usage, func(t tagged) {
		if t.ev.Index < 0 || t.ev.Index >= c.n {
			return
		}
		i := t.sub*c.n + t.ev.Index
		if t.ev.Prompt {
			if promptLPs[i] == nil {
				return
			}
			off := promptLPs[i].TextOffset[len(promptLPs[i].TextOffset)-1] + tokenRunes(promptLPs[i].Tokens[len(promptLPs[i].Tokens)-1])
			c.addLogprobs(promptLPs[i], eventLogprobs(&t.ev), &off)
			if pending[i] -= len(t.ev.Tokens); pending[i] <= 0 {
				sendEcho(i)
			}
			return
		}
		var lp *completionLogprobs
		if c.logprobs && len(t.ev.Tokens) > 0 {
			lp = &completionLogprobs{}
			c.addLogprobs(lp, eventLogprobs(&t.ev), &offsets[i])
		}
		if t.ev.Text == "" && lp == nil && t.ev.Finish == engine.FinishNone {
			return
		}
		out.send(c.chunk([]completionChoice{{Index: i, Text: t.ev.Text, Logprobs: lp,
			FinishReason: finishString(t.ev.Finish)}}, includeUsage))
	}) {
		return
	}
	if includeUsage {
		out.send(completionChunk{completionResponse: completionResponse{ID: c.id, Object: "text_completion",
			Created: c.created, Model: c.s.b.ModelName(), SystemFingerprint: c.s.fp, Choices: []completionChoice{}},
			Usage: c.usage.json()})
	}
	out.done()
}
