package server

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"pagoda/engine"
)

// fakeBackend is a byte-level "model": token id = byte + 3, BOS = 1. It
// writes completion i as the letters 'a'+i, 'b'+i, … one token per event.
type fakeBackend struct {
	ctxLen    int
	delay     time.Duration // between tokens
	submitErr error
	midErr    error         // sent as an event error after the first token
	hold      chan struct{} // when set, generation waits for it to close
	stopAt    string        // a completion that reaches this letter stops
	script    string        // when set, every completion is this text, then stop
	tmplSrc   string        // ChatTemplateSource

	mu        sync.Mutex
	reqs      []*engine.Request
	cancelled int
	finished  int
	started   chan struct{} // one value per Submit
}

func newFake() *fakeBackend {
	return &fakeBackend{ctxLen: 64, started: make(chan struct{}, 100)}
}

func (f *fakeBackend) ModelName() string { return "fake-model" }
func (f *fakeBackend) ContextLen() int   { return f.ctxLen }
func (f *fakeBackend) VocabSize() int    { return 259 }

func (f *fakeBackend) Tokenize(text string, addSpecial bool) []int32 {
	var ids []int32
	if addSpecial {
		ids = append(ids, 1)
	}
	for _, b := range []byte(text) {
		ids = append(ids, int32(b)+3)
	}
	return ids
}

func (f *fakeBackend) Detokenize(ids []int32) string {
	var b []byte
	for _, id := range ids {
		if id >= 3 {
			b = append(b, byte(id-3))
		}
	}
	return string(b)
}

func (f *fakeBackend) TokenText(id int32) string {
	if id < 3 {
		return fmt.Sprintf("<s%d>", id)
	}
	b := byte(id - 3)
	if b >= 0x80 {
		return fmt.Sprintf("bytes:\\x%02x", b)
	}
	return string(rune(b))
}

func (f *fakeBackend) ChatTemplateSource() string { return f.tmplSrc }

// runScript writes f.script one byte per event for each of n completions.
func (f *fakeBackend) runScript(ch chan<- engine.Event, r *engine.Request, n int) {
	defer close(ch)
	for i := range n {
		for k := 0; k < len(f.script); k++ {
			ev := engine.Event{Index: i, Tokens: []int32{int32(f.script[k]) + 3}, Text: f.script[k : k+1]}
			if k == len(f.script)-1 {
				ev.Finish = engine.FinishStop
			}
			ch <- ev
		}
	}
	ch <- engine.Event{Usage: &engine.Usage{PromptTokens: len(r.Prompt), CompletionTokens: n * len(f.script)}}
}

func (f *fakeBackend) ApplyChat(msgs []ChatMessage, gen bool, extra map[string]any) (string, error) {
	var sb strings.Builder
	for _, m := range msgs {
		if m.Content == "BOOM" {
			return "", errors.New("template: raise_exception('boom')")
		}
		fmt.Fprintf(&sb, "<%s>%s\n", m.Role, m.Content)
	}
	if t, ok := extra["tools"].([]any); ok {
		fmt.Fprintf(&sb, "[tools:%d]", len(t))
	}
	if gen {
		sb.WriteString("<assistant>")
	}
	return sb.String(), nil
}

func (f *fakeBackend) Submit(ctx context.Context, r *engine.Request) (<-chan engine.Event, error) {
	if f.submitErr != nil {
		return nil, f.submitErr
	}
	f.mu.Lock()
	f.reqs = append(f.reqs, r)
	f.mu.Unlock()
	select {
	case f.started <- struct{}{}:
	default: // nobody is counting; never block a test
	}
	ch := make(chan engine.Event, 256)
	n := max(r.N, 1)
	if f.script != "" {
		go f.runScript(ch, r, n)
		return ch, nil
	}
	maxTokens := r.MaxTokens
	if maxTokens == 0 {
		maxTokens = f.ctxLen - len(r.Prompt)
	}
	go func() {
		defer close(ch)
		if f.hold != nil {
			select {
			case <-f.hold:
			case <-ctx.Done():
				f.mu.Lock()
				f.cancelled++
				f.mu.Unlock()
				return
			}
		}
		done := make([]bool, n)
		gen := 0
		for k := 0; k < maxTokens; k++ {
			for i := range n {
				if done[i] {
					continue
				}
				if f.delay > 0 {
					select {
					case <-time.After(f.delay):
					case <-ctx.Done():
					}
				}
				if ctx.Err() != nil {
					f.mu.Lock()
					f.cancelled++
					f.mu.Unlock()
					return
				}
				letter := string(rune('a' + (k+i)%26))
				id := int32(letter[0]) + 3
				ev := engine.Event{Index: i, Tokens: []int32{id}, Text: letter}
				if r.Logprobs {
					ev.Logprob = []float32{-0.5 * float32(k+1)}
				}
				if r.TopLogprobs > 0 {
					var top []engine.TokenLogprob
					for j := range r.TopLogprobs {
						// alternatives are 'X','Y',…, so the sampled token is
						// never among them.
						top = append(top, engine.TokenLogprob{ID: int32('X'+j) + 3, Logprob: -0.1 * float32(j+1)})
					}
					ev.Top = [][]engine.TokenLogprob{top}
				}
				gen++
				switch {
				case f.stopAt != "" && letter == f.stopAt:
					ev.Text = "" // stop strings are not emitted
					ev.Finish = engine.FinishStop
					done[i] = true
				case k == maxTokens-1:
					ev.Finish = engine.FinishLength
					done[i] = true
				}
				if f.midErr != nil && k == 1 {
					ch <- engine.Event{Index: i, Err: f.midErr, Finish: engine.FinishError}
					return
				}
				ch <- ev
			}
		}
		f.mu.Lock()
		f.finished++
		f.mu.Unlock()
		ch <- engine.Event{Index: 0, Usage: &engine.Usage{PromptTokens: len(r.Prompt), CompletionTokens: gen, CachedTokens: 2}}
	}()
	return ch, nil
}

func (f *fakeBackend) lastReq(t *testing.T) *engine.Request {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.reqs) == 0 {
		t.Fatal("backend saw no request")
	}
	return f.reqs[len(f.reqs)-1]
}

func (f *fakeBackend) counts() (cancelled, finished int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cancelled, f.finished
}

func startServer(t *testing.T, f *fakeBackend, o Options) *httptest.Server {
	t.Helper()
	ts := httptest.NewServer(New(f, o).Handler())
	t.Cleanup(ts.Close)
	return ts
}

func post(t *testing.T, ts *httptest.Server, path, body string, hdr ...string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest("POST", ts.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

func decode[T any](t *testing.T, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
	return v
}

// sseEvents reads an SSE body into its data payloads.
func sseEvents(t *testing.T, r io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	blank := true
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			blank = true
			continue
		}
		if !blank {
			t.Fatalf("SSE: two lines in one event: %q", line)
		}
		blank = false
		d, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("SSE: line without data prefix: %q", line)
		}
		out = append(out, d)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func postStream(t *testing.T, ts *httptest.Server, path, body string) []string {
	t.Helper()
	resp, err := ts.Client().Post(ts.URL+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	return sseEvents(t, resp.Body)
}

type errBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}
