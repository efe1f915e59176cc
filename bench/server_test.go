package bench

import (
	"context"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"pagoda/engine"
	"pagoda/server"
)

// echoBackend is a byte-level model behind the real server: it streams
// MaxTokens letters and counts prefix-cache hits like a block cache with
// 10-token blocks keyed by everything up to the block's end.
type echoBackend struct {
	hits, queries prometheus.Counter
	mu            sync.Mutex
	seen          map[string]bool
}

func (e *echoBackend) ModelName() string { return "echo" }
func (e *echoBackend) ContextLen() int   { return 4096 }
func (e *echoBackend) Tokenize(s string, add bool) []int32 {
	var ids []int32
	for _, b := range []byte(s) {
		ids = append(ids, int32(b))
	}
	return ids
}
func (e *echoBackend) Detokenize(ids []int32) string {
	b := make([]byte, len(ids))
	for i, id := range ids {
		b[i] = byte(id)
	}
	return string(b)
}
func (e *echoBackend) TokenText(id int32) string { return string(rune(id)) }
func (e *echoBackend) ApplyChat(m []server.ChatMessage, gen bool, _ map[string]any) (string, error) {
	var sb strings.Builder
	for _, x := range m {
		sb.WriteString(x.Content)
	}
	return sb.String(), nil
}

func (e *echoBackend) Submit(ctx context.Context, r *engine.Request) (<-chan engine.Event, error) {
	e.mu.Lock()
	for end := 10; end <= len(r.Prompt); end += 10 {
		k := e.Detokenize(r.Prompt[:end])
		if e.seen[k] {
			e.hits.Add(10)
		}
		e.seen[k] = true
		e.queries.Add(10)
	}
	e.mu.Unlock()
	ch := make(chan engine.Event, r.MaxTokens+1)
	go func() {
		defer close(ch)
		for k := range r.MaxTokens {
			time.Sleep(time.Millisecond)
			ev := engine.Event{Tokens: []int32{'a'}, Text: "a"}
			if k == r.MaxTokens-1 {
				ev.Finish = engine.FinishLength
			}
			ch <- ev
		}
		ch <- engine.Event{Usage: &engine.Usage{PromptTokens: len(r.Prompt), CompletionTokens: r.MaxTokens}}
	}()
	return ch, nil
}

// TestAgainstServer drives Pagoda's own HTTP server through the chat
// endpoint (prompts made via /detokenize) with a shared-prefix dataset and
// reads the prefix-cache counters from /metrics.
func TestAgainstServer(t *testing.T) {
	reg := prometheus.NewRegistry()
	be := &echoBackend{seen: map[string]bool{},
		hits:    prometheus.NewCounter(prometheus.CounterOpts{Name: "vllm:prefix_cache_hits_total"}),
		queries: prometheus.NewCounter(prometheus.CounterOpts{Name: "vllm:prefix_cache_queries_total"})}
	reg.MustRegister(be.hits, be.queries)
	ts := httptest.NewServer(server.New(be, server.Options{Registry: reg, APIKey: "k"}).Handler())
	defer ts.Close()
	res, err := Run(context.Background(), Config{BaseURL: ts.URL, Model: "echo", Endpoint: "chat", Dataset: "shared-prefix",
		NumPrompts: 10, PrefixLen: 30, InputLen: 10, OutputLen: 6, MinTokenID: 'A', VocabSize: 'Z' + 1,
		RequestRate: 200, Seed: 1, APIKey: "k", ScrapeMetrics: true, SkipTestRequest: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Completed != 10 || res.TotalInput != 400 || res.TotalOutput != 60 {
		t.Fatalf("completed %d input %d output %d", res.Completed, res.TotalInput, res.TotalOutput)
	}
	for i, g := range res.ITLs {
		if len(g) != 5 {
			t.Fatalf("request %d: %d gaps", i, len(g))
		}
	}
	// 9 of the 10 prompts find the 30-token prefix (3 blocks) cached; the
	// random 10-token suffix blocks never repeat.
	if res.PrefixCacheHitRate == nil || *res.PrefixCacheHitRate != 270.0/400 {
		t.Fatalf("hit rate %v (metrics %v)", res.PrefixCacheHitRate, res.ServerMetrics)
	}
}
