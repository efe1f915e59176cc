// Package bench is a load generator for OpenAI-compatible servers with
// vLLM `bench serve` semantics: random or shared-prefix prompts, Poisson
// arrivals, a concurrency cap, streamed requests timed per token, and the
// same TTFT/TPOT/ITL/E2EL definitions and report table.
package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"pagoda/tokenizer"
)

// Config describes one benchmark run.
type Config struct {
	BaseURL  string // server root, e.g. http://127.0.0.1:8080 (a trailing /v1 is accepted)
	Model    string
	Endpoint string // "completions" (default) or "chat"
	Dataset  string // "random" (default), "shared-prefix" or "text"
	// Text is the "text" dataset's corpus: each prompt is InputLen tokens
	// of it from a random offset (needs Tokenizer). Speculation's
	// acceptance depends on the text, so random token ids would misstate it.
	Text string

	NumPrompts  int
	InputLen    int     // random tokens per prompt (after the shared prefix)
	OutputLen   int     // max_tokens per request
	RangeRatio  float64 // vLLM --random-range-ratio: lengths uniform in [L·(1−r), L·(1+r)]
	PrefixLen   int     // shared-prefix: tokens of common prefix
	NumPrefixes int     // shared-prefix: distinct prefixes, prompts cycle through them (default 1)

	// Token ids for random prompts are drawn from [MinTokenID, VocabSize).
	// VocabSize is required unless Tokenizer is set.
	VocabSize  int
	MinTokenID int

	RequestRate    float64 // requests/s with Poisson arrivals; 0 or +Inf = all at once
	MaxConcurrency int     // 0 = unlimited
	Seed           int64
	IgnoreEOS      bool
	LogitBias      map[int]float64 // e.g. ban ids 0–258 with -100
	Temperature    float64         // default 0 (greedy), as vLLM's bench

	// Tokenizer, when set, turns the random ids into text prompts of the
	// requested length (needed for exact lengths on the chat endpoint).
	// Without it completions send token-id prompts (exact, tokenizer-free)
	// and chat prompts are made through the server's /detokenize.
	Tokenizer tokenizer.Tokenizer
	APIKey    string

	SkipTestRequest bool // vLLM sends one request first to check the setup
	ScrapeMetrics   bool // read /metrics before and after the run
	Client          *http.Client

	clock func() time.Time // tests: a deterministic clock
}

func (c *Config) now() time.Time {
	if c.clock != nil {
		return c.clock()
	}
	return time.Now()
}

func (c *Config) defaults() error {
	if c.Endpoint == "" {
		c.Endpoint = "completions"
	}
	if c.Dataset == "" {
		c.Dataset = "random"
	}
	if c.NumPrefixes <= 0 {
		c.NumPrefixes = 1
	}
	if c.Client == nil {
		// Keep a connection per concurrent request alive, so TTFT does not
		// include dialing (Go keeps only 2 idle per host by default).
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = max(c.MaxConcurrency, 256)
		tr.MaxIdleConns = tr.MaxIdleConnsPerHost
		c.Client = &http.Client{Transport: tr}
	}
	c.BaseURL = strings.TrimSuffix(strings.TrimSuffix(c.BaseURL, "/"), "/v1")
	switch {
	case c.BaseURL == "":
		return errors.New("bench: BaseURL is required")
	case c.Endpoint != "completions" && c.Endpoint != "chat":
		return fmt.Errorf("bench: endpoint %q: want completions or chat", c.Endpoint)
	case c.Dataset != "random" && c.Dataset != "shared-prefix" && c.Dataset != "text":
		return fmt.Errorf("bench: dataset %q: want random, shared-prefix or text", c.Dataset)
	case c.Dataset == "text" && (c.Tokenizer == nil || c.Text == ""):
		return errors.New("bench: the text dataset needs a tokenizer and a text")
	case c.NumPrompts <= 0:
		return fmt.Errorf("bench: NumPrompts must be positive, got %d", c.NumPrompts)
	case c.InputLen <= 0 && !(c.Dataset == "shared-prefix" && c.PrefixLen > 0):
		return fmt.Errorf("bench: InputLen must be positive, got %d", c.InputLen)
	case c.OutputLen <= 0:
		return fmt.Errorf("bench: OutputLen must be positive, got %d", c.OutputLen)
	case c.RangeRatio < 0 || c.RangeRatio >= 1:
		return fmt.Errorf("bench: RangeRatio must be in [0, 1), got %v", c.RangeRatio)
	case c.RequestRate < 0 || math.IsNaN(c.RequestRate):
		return fmt.Errorf("bench: RequestRate must be positive or +Inf, got %v", c.RequestRate)
	case c.MaxConcurrency < 0:
		return fmt.Errorf("bench: MaxConcurrency must be >= 0, got %d", c.MaxConcurrency)
	}
	if c.Tokenizer != nil && c.VocabSize == 0 {
		c.VocabSize = c.Tokenizer.Vocab().Size()
	}
	if c.VocabSize <= c.MinTokenID {
		return fmt.Errorf("bench: token ids range [%d, %d) is empty; set VocabSize (or a Tokenizer)", c.MinTokenID, c.VocabSize)
	}
	return nil
}

// prompt is one dataset entry.
type prompt struct {
	ids  []int32 // token prompt (completions without a tokenizer)
	text string  // text prompt
	len  int     // tokens, as the dataset counts them
}

func (c *Config) lengths(rng *rand.Rand, l int) int {
	if c.RangeRatio == 0 || l == 0 {
		return l
	}
	lo := int(float64(l) * (1 - c.RangeRatio))
	hi := int(float64(l) * (1 + c.RangeRatio))
	return max(lo+rng.IntN(hi-lo+1), 1)
}

func (c *Config) randomIDs(rng *rand.Rand, n int) []int32 {
	ids := make([]int32, n)
	span := c.VocabSize - c.MinTokenID
	for i := range ids {
		ids[i] = int32(c.MinTokenID + rng.IntN(span))
	}
	return ids
}

// dataset builds the prompts deterministically from Seed.
func (c *Config) dataset(ctx context.Context) ([]prompt, error) {
	rng := rand.New(rand.NewPCG(uint64(c.Seed), 0x9e3779b97f4a7c15))
	var prefixes [][]int32
	if c.Dataset == "shared-prefix" {
		for range c.NumPrefixes {
			prefixes = append(prefixes, c.randomIDs(rng, c.PrefixLen))
		}
	}
	if c.Dataset == "text" {
		return c.textDataset(rng)
	}
	out := make([]prompt, c.NumPrompts)
	for i := range out {
		var ids []int32
		if prefixes != nil {
			ids = append(ids, prefixes[i%len(prefixes)]...)
		}
		ids = append(ids, c.randomIDs(rng, c.lengths(rng, c.InputLen))...)
		switch {
		case c.Tokenizer != nil:
			text, n := fitText(c.Tokenizer, ids)
			out[i] = prompt{text: text, len: n}
		case c.Endpoint == "completions":
			out[i] = prompt{ids: ids, len: len(ids)}
		default:
			text, err := c.detokenize(ctx, ids)
			if err != nil {
				return nil, err
			}
			out[i] = prompt{text: text, len: len(ids)}
		}
	}
	return out, nil
}

// textDataset is NumPrompts stretches of Text, each InputLen tokens
// (within RangeRatio) from a random offset, as text.
func (c *Config) textDataset(rng *rand.Rand) ([]prompt, error) {
	corpus := c.Tokenizer.Encode(c.Text, tokenizer.Options{})
	out := make([]prompt, c.NumPrompts)
	for i := range out {
		n := c.lengths(rng, c.InputLen)
		if n >= len(corpus) {
			return nil, fmt.Errorf("bench: the text holds %d tokens, too few for prompts of %d", len(corpus), n)
		}
		at := rng.IntN(len(corpus) - n)
		text, k := fitText(c.Tokenizer, corpus[at:at+n])
		out[i] = prompt{text: text, len: k}
	}
	return out, nil
}

// fitText decodes ids and trims the text until it re-encodes to no more
// than len(ids) tokens (as vLLM's random dataset does, decode/encode does
// not round-trip exactly).
func fitText(tok tokenizer.Tokenizer, ids []int32) (string, int) {
	want := len(ids)
	text := tok.Decode(ids)
	for range 8 {
		enc := tok.Encode(text, tokenizer.Options{})
		if len(enc) <= want {
			return text, len(enc)
		}
		text = tok.Decode(enc[:want])
	}
	return text, len(tok.Encode(text, tokenizer.Options{}))
}

func (c *Config) detokenize(ctx context.Context, ids []int32) (string, error) {
	body, _ := json.Marshal(map[string]any{"model": c.Model, "tokens": ids})
	req, err := http.NewRequestWithContext(ctx, "POST", c.BaseURL+"/detokenize", bytes.NewReader(body))
	if err != nil {
		return "", fmt.Errorf("bench: %w", err)
	}
	c.headers(req)
	resp, err := c.Client.Do(req)
	if err != nil {
		return "", fmt.Errorf("bench: /detokenize (needed for chat prompts without a Tokenizer): %w", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<24))
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("bench: /detokenize (needed for chat prompts without a Tokenizer): status %d: %s", resp.StatusCode, b)
	}
	var r struct {
		Prompt string `json:"prompt"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return "", fmt.Errorf("bench: /detokenize: %w", err)
	}
	return r.Prompt, nil
}

func (c *Config) headers(req *http.Request) {
	req.Header.Set("Content-Type", "application/json")
	if c.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.APIKey)
	}
}

func (c *Config) body(p prompt) []byte {
	m := map[string]any{
		"model":          c.Model,
		"temperature":    c.Temperature,
		"stream":         true,
		"stream_options": map[string]any{"include_usage": true},
	}
	if c.IgnoreEOS {
		m["ignore_eos"] = true
	}
	if len(c.LogitBias) > 0 {
		lb := make(map[string]float64, len(c.LogitBias))
		for k, v := range c.LogitBias {
			lb[strconv.Itoa(k)] = v
		}
		m["logit_bias"] = lb
	}
	if c.Endpoint == "chat" {
		m["messages"] = []map[string]string{{"role": "user", "content": p.text}}
		m["max_completion_tokens"] = c.OutputLen
	} else {
		if p.ids != nil {
			m["prompt"] = p.ids
		} else {
			m["prompt"] = p.text
		}
		m["max_tokens"] = c.OutputLen
	}
	b, _ := json.Marshal(m)
	return b
}

func (c *Config) path() string {
	if c.Endpoint == "chat" {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

// streamChunk is the part of a completion/chat chunk the benchmark reads.
type streamChunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// send runs one streamed request, timing each chunk that carries text.
func (c *Config) send(ctx context.Context, p prompt, t0 time.Time) RequestOutput {
	o := RequestOutput{PromptLen: p.len}
	start := c.now()
	o.Start = start.Sub(t0)
	fail := func(format string, args ...any) RequestOutput {
		o.Success = false
		o.Error = fmt.Sprintf(format, args...)
		o.End = c.now().Sub(t0)
		return o
	}
	req, err := http.NewRequestWithContext(ctx, "POST", c.BaseURL+c.path(), bytes.NewReader(c.body(p)))
	if err != nil {
		return fail("%v", err)
	}
	c.headers(req)
	// A server may close a kept-alive connection just as a request goes out
	// on it (llama-server closes idle ones after a few seconds); the request
	// then fails before the server has read it. Marked idempotent, it is
	// resent on a fresh connection, as a GET would be, instead of counting
	// as the server's failure (the empty key is not sent on the wire).
	req.Header["Idempotency-Key"] = nil
	resp, err := c.Client.Do(req)
	if err != nil {
		return fail("%v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fail("status %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	var text strings.Builder
	var last time.Time
	chunks, usageOut, usageIn := 0, -1, -1
	done := false
	for !done {
		line, err := br.ReadBytes('\n')
		now := c.now()
		line = bytes.TrimSpace(line)
		if data, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			data = bytes.TrimSpace(data)
			if string(data) == "[DONE]" {
				done = true
				break
			}
			var ch streamChunk
			if jerr := json.Unmarshal(data, &ch); jerr != nil {
				return fail("bad stream chunk %q: %v", data, jerr)
			}
			if ch.Error != nil {
				return fail("server error in stream: %s", ch.Error.Message)
			}
			if ch.Usage != nil {
				usageOut, usageIn = ch.Usage.CompletionTokens, ch.Usage.PromptTokens
			}
			if len(ch.Choices) > 0 {
				c0 := ch.Choices[0]
				piece := c0.Text + c0.Delta.Content
				if piece != "" {
					if chunks == 0 {
						o.TTFT = now.Sub(start)
					} else {
						o.ITL = append(o.ITL, now.Sub(last))
					}
					last = now
					chunks++
					text.WriteString(piece)
				}
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return fail("reading stream: %v", err)
		}
	}
	o.End = c.now().Sub(t0)
	if chunks == 0 {
		return fail("no tokens streamed (done=%v)", done)
	}
	o.Success = true
	o.Latency = last.Sub(start)
	o.Text = text.String()
	o.OutputTokens = chunks
	if usageOut >= 0 {
		o.OutputTokens = usageOut
	} else if c.Tokenizer != nil {
		o.OutputTokens = len(c.Tokenizer.Encode(o.Text, tokenizer.Options{}))
	}
	if usageIn > 0 {
		o.PromptLen = usageIn
	}
	return o
}

// Run executes the benchmark. It returns an error when the setup is wrong
// or the test request fails, and the Result (with an error) when every
// request failed.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	defer cfg.Client.CloseIdleConnections()
	prompts, err := cfg.dataset(ctx)
	if err != nil {
		return nil, err
	}
	if !cfg.SkipTestRequest {
		if o := cfg.send(ctx, prompts[0], cfg.now()); !o.Success {
			return nil, fmt.Errorf("bench: test request to %s%s failed: %s", cfg.BaseURL, cfg.path(), o.Error)
		}
	}
	var before map[string]float64
	if cfg.ScrapeMetrics {
		before, _ = scrape(ctx, &cfg)
	}

	rng := rand.New(rand.NewPCG(uint64(cfg.Seed), 1))
	var sem chan struct{}
	if cfg.MaxConcurrency > 0 {
		sem = make(chan struct{}, cfg.MaxConcurrency)
	}
	outs := make([]RequestOutput, len(prompts))
	var wg sync.WaitGroup
	t0 := cfg.now()
	next := t0
	for i, p := range prompts {
		if i > 0 && cfg.RequestRate > 0 && !math.IsInf(cfg.RequestRate, 1) {
			next = next.Add(interval(rng, cfg.RequestRate))
			if d := next.Sub(cfg.now()); d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
				}
			}
		}
		if ctx.Err() != nil {
			outs[i] = RequestOutput{PromptLen: p.len, Error: ctx.Err().Error()}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if sem != nil {
				select {
				case sem <- struct{}{}:
					defer func() { <-sem }()
				case <-ctx.Done():
					outs[i] = RequestOutput{PromptLen: p.len, Error: ctx.Err().Error()}
					return
				}
			}
			outs[i] = cfg.send(ctx, p, t0)
		}()
	}
	wg.Wait()
	res := Compute(outs, cfg.now().Sub(t0))
	res.Endpoint, res.Dataset, res.Model = cfg.Endpoint, cfg.Dataset, cfg.Model
	res.NumPrompts, res.MaxConcurrency = cfg.NumPrompts, cfg.MaxConcurrency
	res.InputLen, res.OutputLen, res.PrefixLen, res.BaseURL = cfg.InputLen, cfg.OutputLen, cfg.PrefixLen, cfg.BaseURL
	res.Date = t0.UTC().Format(time.RFC3339)
	res.Host, _ = os.Hostname()
	res.NumCPU, res.GoVersion = runtime.NumCPU(), runtime.Version()
	res.RequestRate = cfg.RequestRate
	if cfg.RequestRate <= 0 || math.IsInf(cfg.RequestRate, 1) {
		res.RequestRate = math.Inf(1)
		res.RequestRateJSON = "inf"
	} else {
		res.RequestRateJSON = cfg.RequestRate
	}
	if cfg.ScrapeMetrics {
		if after, err := scrape(ctx, &cfg); err == nil {
			res.serverExtras(before, after)
		}
	}
	if res.Completed == 0 {
		return res, fmt.Errorf("bench: all %d requests failed; first: %s", len(outs), firstError(outs))
	}
	return res, nil
}

func firstError(outs []RequestOutput) string {
	for _, o := range outs {
		if o.Error != "" {
			return o.Error
		}
	}
	return "unknown"
}

// interval draws a Poisson-process gap for rate requests/s.
func interval(rng *rand.Rand, rate float64) time.Duration {
	return time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
}
