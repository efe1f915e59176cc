package engine_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"pagoda/engine"
	"pagoda/model"
	"pagoda/server"
	"pagoda/spec"
	"pagoda/testutil"
)

// The mixed soak drives a real in-process server (stories260K, n-gram
// speculation) with every kind of request at once (plain and streamed
// completions, JSON-schema and JSON-object response formats, forced tool
// calls, per-request KV policies, speculation with greedy outputs checked
// against solo runs, clients that leave mid-stream) and samples the
// process's RSS. Short form: a few seconds. Long form:
//
//	PAGODA_SOAK=10m go test ./engine -run TestMixedSoak -v
//
// (PAGODA_SOAK_EVERY sets the sampling period: 15 s in the long form).
//
// The bound: after warm-up (the first fifth of the run) every sample is
// within mixedSoakRSSBound of the steady state, the median of the samples
// after warm-up. The KV pool (mixedSoakKV) is mapped outside the heap and
// resident as its blocks are first written; the prefix cache keeps every
// block it can, so the pool is all resident once enough distinct text has
// gone through it. It is small (about 300 blocks of 16 tokens: some
// preemption under 16 sequences) so that happens during warm-up.
const (
	mixedSoakKV       = 3 << 20
	mixedSoakRSSBound = 48 << 20
)

// mixedSoakTemplate renders messages plainly and names <tool_call>, so the
// server uses the Hermes tool syntax (a story model knows no tools: the
// grammar makes its calls).
const mixedSoakTemplate = "{{ bos_token }}{% for m in messages %}{{ m.content }}\n{% endfor %}{# <tool_call> #}"

const mixedSoakTools = `"tools":[
	{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string","maxLength":10}},"required":["city"]}}},
	{"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{"tz":{"enum":["CET","UTC"]}},"required":["tz"]}}}]`

const mixedSoakSchema = `{"type":"object","properties":{"name":{"type":"string","maxLength":12},"age":{"type":"integer","minimum":0,"maximum":20}},"required":["name","age"],"additionalProperties":false}`

var mixedSoakPrompts = []string{
	"Once upon a time, there was a little girl named Lily. She loved to play outside",
	"Tim and Sue went to the store",
	"One day, a big bear",
	"The cat sat on the mat and looked at the bird",
	"Once upon a time, there was a little boy named Ben. He had a red ball",
}

var mixedSoakPolicies = []string{`"streaming:sinks=4,window=64"`, `"quest:budget=64"`, `"snapkv:capacity=48,window=8"`, `"h2o:heavy=0.2,recent=0.2"`, `"none"`}

// rssSample is one reading of the process.
type rssSample struct {
	at         time.Duration
	rss, heap  int64
	goroutines int
	kvUsed     int
	requests   int64
}

func readRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return -1
}

func mixedSoakDurations(t *testing.T) (dur, every time.Duration) {
	dur, every = 4*time.Second, 250*time.Millisecond
	if v := os.Getenv("PAGODA_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("PAGODA_SOAK=%q: want a duration such as 10m", v)
		}
		dur, every = d, 15*time.Second
	}
	if v := os.Getenv("PAGODA_SOAK_EVERY"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("PAGODA_SOAK_EVERY=%q: want a duration", v)
		}
		every = d
	}
	return dur, every
}

// mixedServer starts the engine and its server on 127.0.0.1.
func mixedServer(t *testing.T) (*engine.Engine, *httptest.Server) {
	m, err := model.Open(testutil.Shared(t, "models/gguf/stories260K.gguf"), model.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	ng, err := spec.NewNGram(1, 3)
	if err != nil {
		t.Fatal(err)
	}
	cfg := engine.ModelConfig(m, "stories260K")
	cfg.KVBytes, cfg.MaxNumSeqs = mixedSoakKV, 16
	cfg.Spec = engine.SpecConfig{Proposer: ng, Tokens: 4}
	eng, err := engine.New(m, m.Tokenizer(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	eng.Start()
	be, err := server.NewEngineBackend(eng, m.Tokenizer(), "stories260K", m.Config.ContextLen, mixedSoakTemplate)
	if err != nil {
		t.Fatal(err)
	}
	return eng, httptest.NewServer(server.New(be, server.Options{Engine: eng}).Handler())
}

type mixedClient struct {
	base string
	hc   *http.Client
}

// post sends body and returns the status and the whole reply.
func (c *mixedClient) post(ctx context.Context, path, body string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", c.base+path, strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// mixedReply is the part of a completion or chat reply the soak checks.
type mixedReply struct {
	Choices []struct {
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
		Message      struct {
			Content   string `json:"content"`
			ToolCalls []struct {
				Function struct{ Name, Arguments string } `json:"function"`
			} `json:"tool_calls"`
		} `json:"message"`
	} `json:"choices"`
	Usage struct {
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

// call posts body and decodes a 200 reply with one choice.
func (c *mixedClient) call(ctx context.Context, path, body string) (*mixedReply, error) {
	code, b, err := c.post(ctx, path, body)
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("%s: %d %s", path, code, b)
	}
	var r mixedReply
	if err := json.Unmarshal(b, &r); err != nil || len(r.Choices) != 1 {
		return nil, fmt.Errorf("%s: reply %s: %v", path, b, err)
	}
	if r.Usage.CompletionTokens <= 0 {
		return nil, fmt.Errorf("%s: no completion tokens: %s", path, b)
	}
	return &r, nil
}

// stream posts a streamed request and reads it to [DONE], or closes the
// connection after leave events (leave > 0: a client that goes away).
func (c *mixedClient) stream(ctx context.Context, path, body string, leave int) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", c.base+path, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s stream: %d %s", path, resp.StatusCode, b)
	}
	sc := bufio.NewScanner(resp.Body)
	events, finished, usage := 0, false, false
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: "))
		if !ok {
			continue
		}
		if string(data) == "[DONE]" {
			// Usage comes only to a client that asked for it: a short
			// reply can end before a leaving client (kind 6) goes.
			if !finished || (!usage && strings.Contains(body, `"include_usage":true`)) {
				return fmt.Errorf("%s stream ended without a finish reason (%v) or usage (%v)", path, finished, usage)
			}
			return nil
		}
		events++
		if leave > 0 && events >= leave {
			return nil // the deferred cancel drops the connection
		}
		var ch struct {
			Choices []struct {
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *struct{} `json:"usage"`
		}
		if err := json.Unmarshal(data, &ch); err != nil {
			return fmt.Errorf("%s stream event %q: %v", path, data, err)
		}
		for _, c := range ch.Choices {
			finished = finished || c.FinishReason != nil && *c.FinishReason != ""
		}
		usage = usage || ch.Usage != nil
	}
	if leave > 0 {
		return nil // it finished before the client meant to leave
	}
	return fmt.Errorf("%s stream cut short: %v", path, sc.Err())
}

func chatBody(prompt, extra string) string {
	m, _ := json.Marshal(prompt)
	return `{"messages":[{"role":"user","content":` + string(m) + `}]` + extra + `}`
}

func completionBody(prompt, extra string) string {
	m, _ := json.Marshal(prompt)
	return `{"prompt":` + string(m) + extra + `}`
}

// mixedRequest sends request kind k and checks what came back.
func mixedRequest(ctx context.Context, c *mixedClient, rng *rand.Rand, k int, solo map[string]string) error {
	p := mixedSoakPrompts[rng.IntN(len(mixedSoakPrompts))]
	seed := rng.IntN(1 << 20)
	sampled := fmt.Sprintf(`,"temperature":0.9,"seed":%d`, seed)
	switch k {
	case 0: // plain completion
		r, err := c.call(ctx, "/v1/completions", completionBody(p, `,"max_tokens":48`+sampled))
		if err == nil && r.Choices[0].FinishReason != "stop" && r.Choices[0].FinishReason != "length" {
			err = fmt.Errorf("completion finished %q", r.Choices[0].FinishReason)
		}
		return err
	case 1: // streamed chat
		return c.stream(ctx, "/v1/chat/completions", chatBody(p, `,"max_tokens":40,"stream":true,"stream_options":{"include_usage":true}`+sampled), 0)
	case 2: // JSON schema
		r, err := c.call(ctx, "/v1/chat/completions", chatBody(p, `,"max_tokens":120,"response_format":{"type":"json_schema","json_schema":{"name":"pet","schema":`+mixedSoakSchema+`}}`+sampled))
		if err != nil {
			return err
		}
		var v struct {
			Name *string `json:"name"`
			Age  *int    `json:"age"`
		}
		if ch := r.Choices[0]; ch.FinishReason != "stop" || json.Unmarshal([]byte(ch.Message.Content), &v) != nil || v.Name == nil || v.Age == nil || *v.Age > 20 || len(*v.Name) > 48 {
			return fmt.Errorf("json_schema reply %q finished %q", ch.Message.Content, ch.FinishReason)
		}
		return nil
	case 3: // forced tool call
		r, err := c.call(ctx, "/v1/chat/completions", chatBody(p, `,"max_tokens":200,"tool_choice":"required",`+mixedSoakTools+sampled))
		if err != nil {
			return err
		}
		ch := r.Choices[0]
		if ch.FinishReason == "length" && len(ch.Message.ToolCalls) <= 1 {
			// The grammar lets a sampled call pad with whitespace; cut
			// at max_tokens it is a truncated reply, as OpenAI's are.
			return nil
		}
		var args map[string]any
		if ch.FinishReason != "tool_calls" || len(ch.Message.ToolCalls) != 1 || json.Unmarshal([]byte(ch.Message.ToolCalls[0].Function.Arguments), &args) != nil || len(args) != 1 {
			return fmt.Errorf("forced tool call: finish %q, calls %+v", ch.FinishReason, ch.Message.ToolCalls)
		}
		return nil
	case 4: // a KV policy of the request's own, streamed or not
		pol := mixedSoakPolicies[rng.IntN(len(mixedSoakPolicies))]
		if rng.IntN(2) == 0 {
			return c.stream(ctx, "/v1/completions", completionBody(p, `,"max_tokens":64,"stream":true,"stream_options":{"include_usage":true},"kv_policy":`+pol+sampled), 0)
		}
		_, err := c.call(ctx, "/v1/completions", completionBody(p, `,"max_tokens":64,"kv_policy":`+pol+sampled))
		return err
	case 5: // greedy under speculation: the solo run's text
		r, err := c.call(ctx, "/v1/completions", completionBody(p, `,"max_tokens":40,"temperature":0,"spec_tokens":4`))
		if err == nil && r.Choices[0].Text != solo[p] {
			err = fmt.Errorf("speculative greedy %q\n  solo %q", r.Choices[0].Text, solo[p])
		}
		return err
	case 6: // a JSON object, or a client that leaves mid-stream
		if rng.IntN(2) == 0 {
			_, err := c.call(ctx, "/v1/chat/completions", chatBody(p, `,"max_tokens":60,"response_format":{"type":"json_object"}`+sampled))
			return err
		}
		return c.stream(ctx, "/v1/chat/completions", chatBody(p, `,"max_tokens":100,"stream":true`+sampled), 1+rng.IntN(6))
	}
	return nil
}

const mixedKinds = 7

// TestMixedSoak: under the mixed load nothing fails, RSS stays within
// mixedSoakRSSBound of its steady state after warm-up, and afterwards no
// goroutine, request or KV block is left behind.
func TestMixedSoak(t *testing.T) {
	dur, every := mixedSoakDurations(t)
	eng, ts := mixedServer(t)
	stopped := false
	defer func() {
		ts.Close()
		if !stopped {
			eng.Stop(context.Background())
		}
	}()
	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	cl := &mixedClient{base: ts.URL, hc: &http.Client{Transport: tr, Timeout: 6 * time.Minute}}
	solo := map[string]string{}
	for _, p := range mixedSoakPrompts {
		r, err := cl.call(context.Background(), "/v1/completions", completionBody(p, `,"max_tokens":40,"temperature":0,"spec_tokens":0`))
		if err != nil {
			t.Fatal(err)
		}
		solo[p] = r.Choices[0].Text
	}
	tr.CloseIdleConnections()
	idleG, idleHeap := soakIdle()

	var reqs, fails atomic.Int64
	var kinds [mixedKinds]atomic.Int64
	var firstErrs sync.Map
	start := time.Now()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			// Each worker's first two requests are of two kinds of its
			// own, so a short run sends every kind; then kinds at random.
			for i := 0; i < 2 || time.Since(start) < dur; i++ {
				k := rng.IntN(mixedKinds)
				if i < 2 {
					k = (2*w + i) % mixedKinds
				}
				// Generous: on a shared machine a step can starve for
				// a while; a lost reply still fails the run.
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				err := mixedRequest(ctx, cl, rng, k, solo)
				cancel()
				reqs.Add(1)
				kinds[k].Add(1)
				if err != nil {
					fails.Add(1)
					firstErrs.LoadOrStore(k, err)
				}
			}
		}()
	}
	samples := sampleRSS(eng, start, dur, every, &reqs)
	wg.Wait()
	tr.CloseIdleConnections()

	for k := range mixedKinds {
		if err, ok := firstErrs.Load(k); ok {
			t.Errorf("request kind %d: %v", k, err)
		}
		if kinds[k].Load() == 0 {
			t.Errorf("request kind %d never ran", k)
		}
	}
	if n := fails.Load(); n != 0 {
		t.Errorf("%d of %d requests failed", n, reqs.Load())
	}
	logSamples(t, samples)
	checkRSS(t, samples)
	checkIdle(t, eng, idleG, idleHeap)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := eng.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	stopped = true
	if err := engine.SoakCheck(eng); err != nil {
		t.Errorf("after stop: %v", err)
	}
	st := eng.Stats()
	t.Logf("%v: %d requests, %d failed, %d draft tokens verified (%d accepted), prefix hits %d/%d tokens",
		dur, reqs.Load(), fails.Load(), st.SpecDraftTokens, st.SpecAccepted, st.PrefixHits, st.PrefixQueries)
}

// sampleRSS reads the process every period until dur has passed.
func sampleRSS(eng *engine.Engine, start time.Time, dur, every time.Duration, reqs *atomic.Int64) []rssSample {
	var out []rssSample
	tick := time.NewTicker(every)
	defer tick.Stop()
	for range tick.C {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		out = append(out, rssSample{at: time.Since(start), rss: readRSS(), heap: int64(ms.HeapAlloc),
			goroutines: runtime.NumGoroutine(), kvUsed: eng.Stats().KV.Used, requests: reqs.Load()})
		if time.Since(start) >= dur {
			return out
		}
	}
	return out
}

func logSamples(t *testing.T, s []rssSample) {
	var b strings.Builder
	fmt.Fprintf(&b, "\n| t | RSS MiB | HeapAlloc MiB | goroutines | KV blocks used | requests |\n|---|---|---|---|---|---|\n")
	for _, x := range s {
		fmt.Fprintf(&b, "| %v | %.1f | %.1f | %d | %d | %d |\n", x.at.Round(100*time.Millisecond), float64(x.rss)/(1<<20), float64(x.heap)/(1<<20), x.goroutines, x.kvUsed, x.requests)
	}
	t.Log(b.String())
}

// checkRSS holds every sample after warm-up (the first fifth) within the
// bound of their median.
func checkRSS(t *testing.T, s []rssSample) {
	if len(s) < 5 || s[0].rss < 0 {
		t.Logf("%d RSS samples: too few (or no /proc) to judge", len(s))
		return
	}
	after := s[len(s)/5:]
	rss := make([]int64, len(after))
	for i, x := range after {
		rss[i] = x.rss
	}
	slices.Sort(rss)
	steady := rss[len(rss)/2]
	lo, hi := rss[0], rss[len(rss)-1]
	t.Logf("RSS after warm-up: steady %.1f MiB, range %.1f–%.1f MiB (bound ±%d MiB)", float64(steady)/(1<<20), float64(lo)/(1<<20), float64(hi)/(1<<20), mixedSoakRSSBound>>20)
	if hi-steady > mixedSoakRSSBound || steady-lo > mixedSoakRSSBound {
		t.Errorf("RSS after warm-up ranged %.1f–%.1f MiB, more than %d MiB from its steady %.1f MiB",
			float64(lo)/(1<<20), float64(hi)/(1<<20), mixedSoakRSSBound>>20, float64(steady)/(1<<20))
	}
}

// checkIdle waits for the engine to hold no KV block and for goroutines
// and heap to settle to their idle levels.
func checkIdle(t *testing.T, eng *engine.Engine, idleG int, idleHeap uint64) {
	for end := time.Now().Add(10 * time.Second); ; {
		st := eng.Stats()
		if st.KV.Used == 0 && st.KV.Seqs == 0 {
			break
		}
		if time.Now().After(end) {
			t.Errorf("idle engine still holds %d KV blocks of %d sequences", st.KV.Used, st.KV.Seqs)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	g, heap := soakSettle(idleG, idleHeap)
	if g > idleG+soakGoroutineSlack {
		t.Errorf("goroutines: %d idle before the load, %d after it", idleG, g)
	}
	if heap > idleHeap+soakHeapSlack {
		t.Errorf("HeapInuse: %.1f MiB idle before the load, %.1f MiB after it", float64(idleHeap)/(1<<20), float64(heap)/(1<<20))
	}
}
