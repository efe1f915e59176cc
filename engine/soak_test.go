package engine_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"pagoda/engine"
	"pagoda/kvcache"
	"pagoda/model"
	"pagoda/server"
	"pagoda/spec"
	"pagoda/testutil"
)

// soakFor sets the long form: go test ./engine -run TestSoak -soak=3m
// (the time is shared between the engine configurations). Without it the
// test runs a short form of a few seconds per configuration.
var soakFor = flag.Duration("soak", 0, "soak test: total load time of the long form (0 = short form)")

// soakConfig is one engine configuration the soak cycles through. New
// knobs (KV quantization, KV policies, speculative decoding) become fields
// here and rows in soakConfigs.
type soakConfig struct {
	name      string
	dtype     kvcache.DType
	prefix    bool
	blockSize int
	kvBlocks  int    // small on purpose: preemption pressure
	batched   int    // max_num_batched_tokens: small values chunk prefills
	spec      string // speculative decoding: "", "ngram", or "draft" (stories260K drafting for itself)
}

var soakConfigs = []soakConfig{
	{name: "f16/prefix/bs16", dtype: kvcache.F16, prefix: true, blockSize: 16, kvBlocks: 40, batched: 256},
	{name: "f32/noprefix/bs4", dtype: kvcache.F32, prefix: false, blockSize: 4, kvBlocks: 160, batched: 96},
	{name: "f32/prefix/bs32", dtype: kvcache.F32, prefix: true, blockSize: 32, kvBlocks: 20, batched: 512},
	{name: "f16/noprefix/bs16", dtype: kvcache.F16, prefix: false, blockSize: 16, kvBlocks: 40, batched: 64},
	{name: "f16/prefix/bs16/spec-ngram", dtype: kvcache.F16, prefix: true, blockSize: 16, kvBlocks: 40, batched: 256, spec: "ngram"},
	{name: "f32/noprefix/bs4/spec-draft", dtype: kvcache.F32, prefix: false, blockSize: 4, kvBlocks: 160, batched: 96, spec: "draft"},
}

const soakTemplate = "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}" +
	"{% if add_generation_prompt %}[assistant]{% endif %}"

// soakSpec is one distinct request shape. Greedy specs are run alone
// first; every completed greedy choice under load must match that text.
type soakSpec struct {
	chat      bool
	prompt    string
	maxTokens int
	stop      []string
	greedy    bool
}

func (s soakSpec) key() string {
	return fmt.Sprintf("%v %q %d %q %v", s.chat, s.prompt, s.maxTokens, s.stop, s.greedy)
}

func soakSpecs() []soakSpec {
	// Prompts share long prefixes so the prefix cache has work, and differ
	// in their tails so they are distinct requests.
	stem := "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her"
	tails := []string{" dog.", " friend Tom.", " big red ball.", " mom and dad. One day,", " toys. She saw a bird"}
	short := []string{"The cat", "Tim and Sue went to the store", "One day, a big bear"}
	stops := [][]string{nil, {"."}, {"\n", " and"}, {"Lily"}}
	var specs []soakSpec
	for i, t := range tails {
		specs = append(specs, soakSpec{prompt: stem + t, maxTokens: 48 + 16*(i%3), stop: stops[i%len(stops)], greedy: true})
		specs = append(specs, soakSpec{chat: true, prompt: stem + t, maxTokens: 40, stop: stops[(i+1)%len(stops)], greedy: true})
	}
	for i, s := range short {
		specs = append(specs, soakSpec{prompt: s, maxTokens: 96, stop: stops[i%len(stops)], greedy: true})
		specs = append(specs, soakSpec{prompt: s, maxTokens: 64})
		specs = append(specs, soakSpec{chat: true, prompt: s, maxTokens: 64})
	}
	return specs
}

// soakBody is the JSON body for spec with n completions.
func soakBody(s soakSpec, n int, stream bool, seed int64) []byte {
	m := map[string]any{"max_tokens": s.maxTokens, "n": n}
	if s.chat {
		m["messages"] = []map[string]string{{"role": "user", "content": s.prompt}}
	} else {
		m["prompt"] = s.prompt
	}
	if len(s.stop) > 0 {
		m["stop"] = s.stop
	}
	if s.greedy {
		m["temperature"] = 0
	} else {
		m["temperature"] = 0.9
		m["top_p"] = 0.95
		m["seed"] = seed
	}
	if stream {
		m["stream"] = true
		m["stream_options"] = map[string]any{"include_usage": true}
	}
	b, _ := json.Marshal(m)
	return b
}

func soakPath(s soakSpec) string {
	if s.chat {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

type soakChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	FinishReason *string `json:"finish_reason"`
	Message      *struct {
		Content string `json:"content"`
	} `json:"message"`
	Delta *struct {
		Content string `json:"content"`
	} `json:"delta"`
}

type soakResp struct {
	Choices []soakChoice `json:"choices"`
	Usage   *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

func (c soakChoice) text() string {
	switch {
	case c.Message != nil:
		return c.Message.Content
	case c.Delta != nil:
		return c.Delta.Content
	}
	return c.Text
}

// soakResult is one finished request: per choice, text and finish reason.
type soakResult struct {
	texts, finish []string
	completion    int
}

// errInterrupted marks a request the client cut short on purpose.
var errInterrupted = errors.New("interrupted by the client")

type soakClient struct {
	base string // http://127.0.0.1:port
	addr string // 127.0.0.1:port
	hc   *http.Client
}

func (c *soakClient) do(ctx context.Context, s soakSpec, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", c.base+soakPath(s), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return nil, fmt.Errorf("HTTP %d: %s", resp.StatusCode, b)
	}
	return resp, nil
}

// plain runs a non-streaming request.
func (c *soakClient) plain(ctx context.Context, s soakSpec, n int, seed int64) (*soakResult, error) {
	resp, err := c.do(ctx, s, soakBody(s, n, false, seed))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r soakResp
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return nil, err
	}
	if len(r.Choices) != n || r.Usage == nil {
		return nil, fmt.Errorf("%d choices (want %d), usage %v", len(r.Choices), n, r.Usage)
	}
	res := &soakResult{texts: make([]string, n), finish: make([]string, n), completion: r.Usage.CompletionTokens}
	for _, ch := range r.Choices {
		if ch.Index < 0 || ch.Index >= n || ch.FinishReason == nil {
			return nil, fmt.Errorf("bad choice %+v", ch)
		}
		res.texts[ch.Index], res.finish[ch.Index] = ch.text(), *ch.FinishReason
	}
	return res, nil
}

// stream runs a streaming request; with cutAfter > 0 it calls cut after
// that many data events and reports errInterrupted if the stream had not
// ended by then.
func (c *soakClient) stream(ctx context.Context, s soakSpec, n int, seed int64, cutAfter int, cut func()) (*soakResult, error) {
	resp, err := c.do(ctx, s, soakBody(s, n, true, seed))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return readSSE(resp.Body, n, cutAfter, cut)
}

func readSSE(body io.Reader, n, cutAfter int, cut func()) (*soakResult, error) {
	res := &soakResult{texts: make([]string, n), finish: make([]string, n)}
	sc := bufio.NewScanner(body)
	events, done, usage := 0, false, false
	for sc.Scan() {
		line := sc.Text()
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		if done {
			return nil, fmt.Errorf("event after [DONE]: %q", line)
		}
		events++
		if data == "[DONE]" {
			done = true
			continue
		}
		var r soakResp
		if err := json.Unmarshal([]byte(data), &r); err != nil {
			return nil, fmt.Errorf("bad chunk %q: %v", data, err)
		}
		if r.Usage != nil {
			usage = true
			res.completion = r.Usage.CompletionTokens
		}
		for _, ch := range r.Choices {
			if ch.Index < 0 || ch.Index >= n {
				return nil, fmt.Errorf("choice index %d of %d", ch.Index, n)
			}
			if res.finish[ch.Index] != "" {
				return nil, fmt.Errorf("choice %d continues after finish %q: %q", ch.Index, res.finish[ch.Index], data)
			}
			res.texts[ch.Index] += ch.text()
			if ch.FinishReason != nil && *ch.FinishReason != "" {
				res.finish[ch.Index] = *ch.FinishReason
			}
		}
		if cutAfter > 0 && events >= cutAfter {
			// Hang up mid-stream; the rest of the stream is not read.
			cut()
			return nil, errInterrupted
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if !done || !usage {
		return nil, fmt.Errorf("stream ended without [DONE] (%v) or usage (%v)", done, usage)
	}
	for i, f := range res.finish {
		if f == "" {
			return nil, fmt.Errorf("choice %d has no finish_reason", i)
		}
	}
	return res, nil
}

// disconnect sends a streaming request over a raw TCP connection, reads
// a few SSE events and closes the connection. It reports whether the
// stream was still running when it hung up.
func (c *soakClient) disconnect(ctx context.Context, s soakSpec, n int, seed int64, after int) (bool, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", c.addr)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	body := soakBody(s, n, true, seed)
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		soakPath(s), c.addr, len(body), body)
	br := bufio.NewReader(conn)
	status, err := br.ReadString('\n')
	if err != nil {
		return false, err
	}
	if !strings.Contains(status, " 200 ") {
		return false, fmt.Errorf("status %q", strings.TrimSpace(status))
	}
	events := 0
	for events < after {
		line, err := br.ReadString('\n')
		if err != nil {
			return false, err
		}
		if strings.HasPrefix(line, "data: [DONE]") {
			return false, nil
		}
		if strings.HasPrefix(line, "data: ") {
			events++
		}
	}
	return true, nil
}

type soakCounts struct {
	requests, completed, greedyChecked, cancelled, disconnected, streamed, chat, multi atomic.Int64
}

func TestSoak(t *testing.T) {
	path := testutil.Shared(t, "models/gguf/stories260K.gguf")
	m, err := model.Open(path, model.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	perConfig := 3 * time.Second
	if testing.Short() {
		perConfig = 1500 * time.Millisecond
	}
	if *soakFor > 0 {
		perConfig = *soakFor / time.Duration(len(soakConfigs))
	}
	for i, sc := range soakConfigs {
		t.Run(strings.ReplaceAll(sc.name, "/", "_"), func(t *testing.T) {
			soakOne(t, m, sc, perConfig, uint64(i+1))
		})
	}
}

func soakOne(t *testing.T, m *model.Model, sc soakConfig, dur time.Duration, seed uint64) {
	c := m.Config
	tok := m.Tokenizer()
	var sp engine.SpecConfig
	var draft *spec.Draft
	switch sc.spec {
	case "ngram":
		g, err := spec.NewNGram(1, 3)
		if err != nil {
			t.Fatal(err)
		}
		sp = engine.SpecConfig{Proposer: g, Tokens: 4}
	case "draft":
		d, err := spec.NewDraft(m, tok.Vocab(), spec.DraftOptions{TargetVocab: c.VocabSize, KVBlocks: 200, BlockSize: 8})
		if err != nil {
			t.Fatal(err)
		}
		draft, sp = d, engine.SpecConfig{Proposer: d, Tokens: 3, Fixed: true}
	}
	eng, err := engine.New(m, tok, engine.Config{
		ModelName: "stories260K", NLayer: c.NLayer, NKVHead: c.NKVHead, HeadDim: c.HeadDim,
		VocabSize: c.VocabSize, ContextLen: c.ContextLen, SlidingWindow: c.SlidingWindow,
		BlockSize: sc.blockSize, KVBlocks: sc.kvBlocks, KVDType: sc.dtype, DisablePrefixCache: !sc.prefix,
		MaxNumBatchedTokens: sc.batched, MaxNumSeqs: 32, Spec: sp,
	})
	if err != nil {
		t.Fatal(err)
	}
	eng.Start()
	stopped := false
	defer func() {
		if !stopped {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			eng.Stop(ctx)
		}
	}()
	be, err := server.NewEngineBackend(eng, tok, "stories260K", c.ContextLen, soakTemplate)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(server.New(be, server.Options{}).Handler())
	defer ts.Close()
	tr := &http.Transport{MaxIdleConns: 64, MaxIdleConnsPerHost: 64}
	defer tr.CloseIdleConnections()
	cl := &soakClient{base: ts.URL, addr: strings.TrimPrefix(ts.URL, "http://"), hc: &http.Client{Transport: tr, Timeout: time.Minute}}

	// Solo runs: each greedy spec alone, before any load.
	specs := soakSpecs()
	solo := map[string]*soakResult{}
	for _, s := range specs {
		if !s.greedy {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		r, err := cl.plain(ctx, s, 1, 0)
		cancel()
		if err != nil {
			t.Fatalf("solo %s: %v", s.key(), err)
		}
		if r.texts[0] == "" && r.finish[0] == "length" {
			t.Fatalf("solo %s: empty text", s.key())
		}
		solo[s.key()] = r
	}
	// A stop string that never fires would leave the stop paths untested.
	stopped1 := 0
	for _, s := range specs {
		if r := solo[s.key()]; r != nil && len(s.stop) > 0 && r.finish[0] == "stop" {
			stopped1++
		}
	}
	if stopped1 == 0 {
		t.Fatalf("no greedy solo run ended on a stop string")
	}

	// Idle levels, with the client's idle connections closed.
	tr.CloseIdleConnections()
	idleG, idleHeap := soakIdle()
	st0 := eng.Stats()

	var cnt soakCounts
	var level atomic.Int64
	level.Store(1)
	const maxWorkers = 24
	deadline := time.Now().Add(dur)
	var wg sync.WaitGroup
	var firstErr sync.Once
	fail := func(format string, a ...any) {
		firstErr.Do(func() { t.Errorf(format, a...) })
	}
	var nfail atomic.Int64
	for w := range maxWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for time.Now().Before(deadline) {
				if int64(w) >= level.Load() {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				if err := soakRequest(cl, rng, specs, solo, &cnt); err != nil {
					nfail.Add(1)
					fail("worker %d: %v", w, err)
				}
			}
		}()
	}
	// Vary the concurrency: phases of 1, 4, 12, 24, 8 workers.
	phases := []int64{1, 4, 12, 24, 8, 2, 16}
	phase := max(dur/time.Duration(2*len(phases)), 100*time.Millisecond)
	for i := 0; time.Now().Before(deadline); i++ {
		level.Store(phases[i%len(phases)])
		time.Sleep(min(phase, time.Until(deadline)))
	}
	wg.Wait()
	// A short run's random mix can miss a mid-stream hang-up (7.5% of
	// requests try one, and only while the stream is live): make one on
	// purpose so the path is always exercised.
	for try := 0; try < 5 && cnt.disconnected.Load() == 0; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		live, err := cl.disconnect(ctx, soakSpec{prompt: "Once upon a time", maxTokens: 200}, 1, int64(seed), 1)
		cancel()
		if err != nil {
			t.Errorf("deliberate disconnect: %v", err)
			break
		}
		if live {
			cnt.disconnected.Add(1)
		}
	}

	// Settle: the engine must be empty.
	var st engine.Stats
	for end := time.Now().Add(10 * time.Second); ; {
		st = eng.Stats()
		if st.Running == 0 && st.Waiting == 0 && st.RunningSeqs == 0 && st.KV.Used == 0 && st.KV.Seqs == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("engine not idle after the load: running %d (%d seqs) waiting %d, KV used %d blocks in %d sequences",
				st.Running, st.RunningSeqs, st.Waiting, st.KV.Used, st.KV.Seqs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	preempt := st.Preemptions - st0.Preemptions
	if preempt == 0 {
		t.Errorf("no preemption under a KV budget of %d blocks", sc.kvBlocks)
	}
	if sc.prefix && st.PrefixHits == 0 {
		t.Errorf("prefix cache on but no hits")
	}
	tr.CloseIdleConnections()
	g, heap := soakSettle(idleG, idleHeap)
	leaks := 0
	if g > idleG+soakGoroutineSlack {
		leaks++
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		t.Errorf("goroutines: %d after the load, %d idle\n%s", g, idleG, buf)
	}
	if heap > idleHeap+soakHeapSlack {
		leaks++
		t.Errorf("HeapInuse: %.1f MiB after the load, %.1f MiB idle", float64(heap)/(1<<20), float64(idleHeap)/(1<<20))
	}
	if cnt.requests.Load() < 10 || cnt.greedyChecked.Load() == 0 || cnt.completed.Load() == 0 {
		t.Errorf("too little load: %d requests, %d completed, %d greedy checked",
			cnt.requests.Load(), cnt.completed.Load(), cnt.greedyChecked.Load())
	}
	if *soakFor > 0 || !testing.Short() {
		if cnt.cancelled.Load() == 0 || cnt.disconnected.Load() == 0 {
			t.Errorf("no cancellation (%d) or disconnect (%d) happened mid-request", cnt.cancelled.Load(), cnt.disconnected.Load())
		}
	}

	ts.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := eng.Stop(ctx); err != nil {
		t.Errorf("engine stop: %v", err)
	}
	stopped = true
	if err := engine.SoakCheck(eng); err != nil {
		leaks++
		t.Errorf("after stop: %v", err)
	}
	if draft != nil {
		if err := draft.KV().Check(); err != nil {
			leaks++
			t.Errorf("draft cache after stop: %v", err)
		}
		if u := draft.KV().Usage(); u.Used != 0 || u.Seqs != 0 {
			leaks++
			t.Errorf("draft cache after stop: %d blocks of %d sequences held", u.Used, u.Seqs)
		}
	}
	if sp.Proposer != nil {
		if st := eng.Stats(); st.SpecDrafts == 0 {
			t.Errorf("%s: no drafts were verified", sc.name)
		} else {
			t.Logf("%s: %d of %d draft tokens accepted", sc.name, st.SpecAccepted, st.SpecDraftTokens)
		}
	}
	t.Logf("%s: %v, %d requests (%d completed, %d greedy choices checked against solo runs, %d streamed, %d chat, %d with n>1), "+
		"%d cancelled, %d disconnected, %d failed, %d preemptions, prefix hits %d/%d tokens, %d steps; "+
		"goroutines %d→%d, HeapInuse %.1f→%.1f MiB, KV blocks %d (%d cached free); leaks: %d",
		sc.name, dur, cnt.requests.Load(), cnt.completed.Load(), cnt.greedyChecked.Load(), cnt.streamed.Load(), cnt.chat.Load(), cnt.multi.Load(),
		cnt.cancelled.Load(), cnt.disconnected.Load(), nfail.Load(), preempt, st.PrefixHits, st.PrefixQueries, st.Steps,
		idleG, g, float64(idleHeap)/(1<<20), float64(heap)/(1<<20), st.KV.Blocks, st.KV.CachedFree, leaks)
}

const (
	soakGoroutineSlack = 4
	soakHeapSlack      = 32 << 20
)

func soakIdle() (int, uint64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return runtime.NumGoroutine(), ms.HeapInuse
}

// soakSettle waits up to 5 s for goroutines and heap to come back to the
// idle levels; it returns the last readings.
func soakSettle(idleG int, idleHeap uint64) (int, uint64) {
	var g int
	var heap uint64
	for end := time.Now().Add(5 * time.Second); ; {
		g, heap = soakIdle()
		if (g <= idleG+soakGoroutineSlack && heap <= idleHeap+soakHeapSlack) || time.Now().After(end) {
			return g, heap
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// soakRequest sends one random request and checks what came back.
func soakRequest(cl *soakClient, rng *rand.Rand, specs []soakSpec, solo map[string]*soakResult, cnt *soakCounts) error {
	s := specs[rng.IntN(len(specs))]
	n := 1
	if rng.IntN(4) == 0 {
		n = 2 + rng.IntN(2)
		cnt.multi.Add(1)
	}
	seed := rng.Int64N(1 << 30)
	stream := rng.IntN(2) == 0
	action := rng.IntN(100) // <70 complete, <85 cancel, else disconnect (streaming)
	cnt.requests.Add(1)
	if s.chat {
		cnt.chat.Add(1)
	}
	if stream {
		cnt.streamed.Add(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var res *soakResult
	var err error
	switch {
	case action >= 85 && stream:
		live, err := cl.disconnect(ctx, s, n, seed, 1+rng.IntN(8))
		if err != nil {
			return fmt.Errorf("disconnect %s: %w", s.key(), err)
		}
		if live {
			cnt.disconnected.Add(1)
		}
		return nil
	case action >= 70 && stream:
		res, err = cl.stream(ctx, s, n, seed, 1+rng.IntN(8), cancel)
	case action >= 70:
		delay := time.Duration(rng.IntN(40)) * time.Millisecond
		go func() {
			time.Sleep(delay)
			cancel()
		}()
		res, err = cl.plain(ctx, s, n, seed)
		if err != nil && errors.Is(ctx.Err(), context.Canceled) {
			err = errInterrupted
		}
	case stream:
		res, err = cl.stream(ctx, s, n, seed, 0, nil)
	default:
		res, err = cl.plain(ctx, s, n, seed)
	}
	if errors.Is(err, errInterrupted) {
		cnt.cancelled.Add(1)
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s (n=%d stream=%v): %w", s.key(), n, stream, err)
	}
	cnt.completed.Add(1)
	if res.completion <= 0 || res.completion > n*s.maxTokens {
		return fmt.Errorf("%s: usage completion_tokens %d for n=%d max_tokens %d", s.key(), res.completion, n, s.maxTokens)
	}
	for i := range n {
		if f := res.finish[i]; f != "stop" && f != "length" {
			return fmt.Errorf("%s: choice %d finished %q", s.key(), i, f)
		}
		if !s.greedy {
			continue
		}
		want := solo[s.key()]
		if res.texts[i] != want.texts[0] || res.finish[i] != want.finish[0] {
			return fmt.Errorf("%s (n=%d stream=%v) choice %d differs from its solo run:\n got %q (%s)\nwant %q (%s)",
				s.key(), n, stream, i, res.texts[i], res.finish[i], want.texts[0], want.finish[0])
		}
		cnt.greedyChecked.Add(1)
	}
	return nil
}
