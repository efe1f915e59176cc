// Package generate runs one prompt through a model on a flat KV cache:
// the single-user path behind `pagoda run` and `pagoda score`. The serving
// engine (package engine) handles many users at once.
package generate

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"

	"pagoda/executor"
	"pagoda/model"
	"pagoda/sample"
	"pagoda/tokenizer"
)

// Options for one generation.
type Options struct {
	MaxTokens   int // 0 = until the context is full
	Sampling    sample.Params
	StopStrings []string
	StopTokens  []int32
	IgnoreEOS   bool
	TopLogprobs int // alternatives to report per token
	// PrefillChunk bounds the tokens per forward pass during the prompt
	// (0 = the whole prompt at once).
	PrefillChunk int
	// NewCache makes the KV cache for a sequence of up to maxLen tokens
	// (nil: the model's flat f32 cache); `run --kv-dtype` passes a paged
	// cache of a quantized format.
	NewCache NewCache
}

// NewCache makes a one-sequence KV cache of up to maxLen tokens.
type NewCache func(maxLen int) (model.KVCache, error)

func (nc NewCache) make(m *model.Model, maxLen int) (model.KVCache, error) {
	if nc == nil {
		return m.NewFlatCache(1, maxLen), nil
	}
	return nc(maxLen)
}

// Token is one generated token as reported to the callback.
type Token struct {
	ID      int32
	Text    string // UTF-8-safe text delta this token completes (may be "")
	Logprob float32
	Top     []sample.TokenLogprob
}

// Result summarises a generation.
type Result struct {
	Tokens       []int32
	Text         string
	FinishReason string // "stop" or "length"
	PromptTokens int
}

// Generate continues prompt greedily or by sampling, calling emit for every
// new token. A stop string ends generation and is cut from the text.
func Generate(ctx context.Context, m *model.Model, tok tokenizer.Tokenizer, prompt []int32, o Options, emit func(Token) error) (*Result, error) {
	c := &m.Config
	if len(prompt) == 0 {
		return nil, errors.New("generate: empty prompt")
	}
	if len(prompt) >= c.ContextLen {
		return nil, fmt.Errorf("generate: prompt of %d tokens does not fit the context of %d", len(prompt), c.ContextLen)
	}
	smp, err := sample.New(o.Sampling)
	if err != nil {
		return nil, err
	}
	maxNew := c.ContextLen - len(prompt)
	if o.MaxTokens > 0 && o.MaxTokens < maxNew {
		maxNew = o.MaxTokens
	}
	cache, err := o.NewCache.make(m, len(prompt)+maxNew)
	if err != nil {
		return nil, err
	}
	ex := executor.NewLocal(m, cache)
	logits, err := prefill(ex, prompt, o.PrefillChunk)
	if err != nil {
		return nil, err
	}
	history := append([]int32(nil), prompt...)
	res := &Result{PromptTokens: len(prompt), FinishReason: "length"}
	var text strings.Builder
	var ts *tokenizer.TextStream
	if tok != nil {
		ts = tokenizer.NewTextStream(tok, prompt, o.StopStrings)
	}
	logp := make([]float32, len(logits))
	dec := executor.StepInput{Tokens: make([]int32, 1), Pos: make([]int32, 1), Seq: make([]int32, 1)}
	for step := 0; step < maxNew; step++ {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		var lp []float32
		if o.TopLogprobs > 0 {
			sample.LogSoftmax(logits, logp)
			lp = logp
		}
		id := smp.Sample(logits, history)
		history = append(history, id)
		res.Tokens = append(res.Tokens, id)
		eog := tok != nil && !o.IgnoreEOS && tok.Vocab().IsEOG(id)
		for _, s := range o.StopTokens {
			if s == id {
				eog = true
			}
		}
		t := Token{ID: id}
		if lp != nil {
			t.Logprob = lp[id]
			t.Top = sample.TopLogprobs(lp, o.TopLogprobs)
			for i := range t.Top {
				// The same numbers as Logprob, not a second log-softmax.
				t.Top[i].Logprob = lp[t.Top[i].ID]
			}
		}
		if eog {
			res.FinishReason = "stop"
			if ts != nil {
				t.Text = ts.Flush()
			}
			text.WriteString(t.Text)
			if err := emit(t); err != nil {
				return res, err
			}
			break
		}
		var stop bool
		if ts != nil {
			t.Text, stop = ts.Add(id)
		}
		text.WriteString(t.Text)
		if err := emit(t); err != nil {
			return res, err
		}
		if stop {
			res.FinishReason = "stop"
			break
		}
		if step+1 == maxNew {
			break
		}
		pos := int32(len(history) - 1)
		dec.Tokens[0], dec.Pos[0] = id, pos
		out, err := ex.Execute(&dec)
		if err != nil {
			return res, err
		}
		logits = out.Logits
	}
	if res.FinishReason == "length" && ts != nil {
		if rest := ts.Flush(); rest != "" {
			text.WriteString(rest)
			if err := emit(Token{ID: -1, Text: rest}); err != nil {
				return res, err
			}
		}
	}
	res.Text = text.String()
	return res, nil
}

func prefill(ex executor.Executor, prompt []int32, chunk int) ([]float32, error) {
	if chunk <= 0 {
		chunk = len(prompt)
	}
	var logits []float32
	for lo := 0; lo < len(prompt); lo += chunk {
		hi := min(lo+chunk, len(prompt))
		b := &executor.StepInput{Tokens: prompt[lo:hi], Pos: make([]int32, hi-lo), Seq: make([]int32, hi-lo)}
		for i := range b.Pos {
			b.Pos[i] = int32(lo + i)
		}
		out, err := ex.Execute(b)
		if err != nil {
			return nil, err
		}
		logits = out.Logits
	}
	return logits, nil
}

// Score evaluates tokens teacher-forced: Logprobs[i] is the log-probability
// of tokens[i+1] given tokens[:i+1]. With keepLogits, Logits holds every
// position's full row.
type Score struct {
	Logprobs   []float64
	NLL        float64 // sum of −log p
	Perplexity float64
	Logits     [][]float32
}

// ScoreTokens runs tokens through m in one pass (chunked by chunk tokens).
func ScoreTokens(m *model.Model, tokens []int32, keepLogits bool, chunk int) (*Score, error) {
	return ScoreTokensCache(m, tokens, keepLogits, chunk, nil)
}

// ScoreTokensCache is ScoreTokens on the cache newCache makes (nil: flat).
func ScoreTokensCache(m *model.Model, tokens []int32, keepLogits bool, chunk int, newCache NewCache) (*Score, error) {
	c := &m.Config
	if len(tokens) < 2 && !keepLogits {
		return nil, errors.New("score: need at least two tokens")
	}
	if len(tokens) > c.ContextLen {
		return nil, fmt.Errorf("score: %d tokens do not fit the context of %d", len(tokens), c.ContextLen)
	}
	if chunk <= 0 {
		chunk = 512
	}
	cache, err := newCache.make(m, len(tokens))
	if err != nil {
		return nil, err
	}
	ex := executor.NewLocal(m, cache)
	sc := &Score{}
	lsm := make([]float32, c.VocabSize)
	for lo := 0; lo < len(tokens); lo += chunk {
		hi := min(lo+chunk, len(tokens))
		n := hi - lo
		b := &executor.StepInput{Tokens: tokens[lo:hi], Pos: make([]int32, n), Seq: make([]int32, n), Logits: make([]bool, n)}
		for i := range b.Pos {
			b.Pos[i] = int32(lo + i)
			b.Logits[i] = true
		}
		out, err := ex.Execute(b)
		if err != nil {
			return nil, err
		}
		logits := out.Logits
		for i := 0; i < n; i++ {
			row := logits[i*c.VocabSize : (i+1)*c.VocabSize]
			if keepLogits {
				sc.Logits = append(sc.Logits, append([]float32(nil), row...))
			}
			p := lo + i
			if p+1 < len(tokens) {
				sample.LogSoftmax(row, lsm)
				lp := float64(lsm[tokens[p+1]])
				sc.Logprobs = append(sc.Logprobs, lp)
				sc.NLL -= lp
			}
		}
	}
	if len(sc.Logprobs) > 0 {
		sc.Perplexity = math.Exp(sc.NLL / float64(len(sc.Logprobs)))
	}
	return sc, nil
}
