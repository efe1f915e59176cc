package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const msec = time.Millisecond

func near(t *testing.T, name string, got, want float64) {
	t.Helper()
	if math.Abs(got-want) > 1e-9*math.Max(1, math.Abs(want)) {
		t.Errorf("%s = %.12g, want %.12g", name, got, want)
	}
}

func TestComputeExact(t *testing.T) {
	outs := []RequestOutput{
		{Success: true, PromptLen: 10, OutputTokens: 4, Start: 0, TTFT: 100 * msec,
			ITL: []time.Duration{10 * msec, 20 * msec, 30 * msec}, Latency: 160 * msec, End: 170 * msec},
		{Success: true, PromptLen: 20, OutputTokens: 1, Start: 50 * msec, TTFT: 200 * msec,
			Latency: 200 * msec, End: 260 * msec},
		{Success: false, PromptLen: 30, Error: "boom"},
		{Success: true, PromptLen: 5, OutputTokens: 3, Start: 1000 * msec, TTFT: 40 * msec,
			ITL: []time.Duration{5 * msec, 15 * msec}, Latency: 60 * msec, End: 1100 * msec},
	}
	r := Compute(outs, 2*time.Second)
	if r.Completed != 3 || r.Failed != 1 || r.TotalInput != 35 || r.TotalOutput != 8 {
		t.Fatalf("counts: %+v", r)
	}
	near(t, "duration", r.Duration, 2)
	near(t, "request throughput", r.RequestThroughput, 1.5)
	near(t, "input throughput", r.InputThroughput, 17.5)
	near(t, "output throughput", r.OutputThroughput, 4)
	near(t, "total throughput", r.TotalTokenThroughput, 21.5)
	near(t, "peak output", r.PeakOutputThroughput, 5)
	if r.PeakConcurrent != 2 {
		t.Errorf("peak concurrency %d", r.PeakConcurrent)
	}
	m := (100.0 + 200 + 40) / 3
	near(t, "mean ttft", r.MeanTTFT, m)
	near(t, "median ttft", r.MedianTTFT, 100)
	near(t, "p99 ttft", r.P99TTFT, 198) // numpy: 100 + 0.98·(200−100)
	near(t, "std ttft", r.StdTTFT, math.Sqrt(((100-m)*(100-m)+(200-m)*(200-m)+(40-m)*(40-m))/3))
	// TPOT: (160−100)/3 = 20 and (60−40)/2 = 10; the 1-token request has none.
	near(t, "mean tpot", r.MeanTPOT, 15)
	near(t, "median tpot", r.MedianTPOT, 15)
	near(t, "p99 tpot", r.P99TPOT, 19.9)
	near(t, "std tpot", r.StdTPOT, 5)
	// ITL pooled over requests: 5 10 15 20 30.
	near(t, "mean itl", r.MeanITL, 16)
	near(t, "median itl", r.MedianITL, 15)
	near(t, "p99 itl", r.P99ITL, 29.6)
	near(t, "mean e2el", r.MeanE2EL, 140)
	near(t, "median e2el", r.MedianE2EL, 160)
	near(t, "p99 e2el", r.P99E2EL, 199.2)
	if !reflect.DeepEqual(r.InputLens, []int{10, 20, 30, 5}) || !reflect.DeepEqual(r.OutputLens, []int{4, 1, 0, 3}) ||
		!reflect.DeepEqual(r.Errors, []string{"", "", "boom", ""}) || len(r.ITLs) != 4 || len(r.ITLs[0]) != 3 {
		t.Fatalf("per-request: %v %v %q %v", r.InputLens, r.OutputLens, r.Errors, r.ITLs)
	}
	// Nothing succeeded: zeros, not NaNs.
	z := Compute([]RequestOutput{{Error: "x"}}, time.Second)
	if z.MeanTTFT != 0 || z.P99ITL != 0 || z.Completed != 0 || z.Failed != 1 {
		t.Fatalf("empty: %+v", z)
	}
	if _, err := json.Marshal(z); err != nil {
		t.Fatal(err)
	}
}

// TestPeaks follows vLLM's per-second buckets across second boundaries.
func TestPeaks(t *testing.T) {
	outs := []RequestOutput{
		{Success: true, OutputTokens: 3, Start: 0, TTFT: 500 * msec, ITL: []time.Duration{time.Second, time.Second}, Latency: 2500 * msec},
		{Success: true, OutputTokens: 1, Start: 1200 * msec, TTFT: 50 * msec, Latency: 50 * msec},
		{Success: false, Start: 1300 * msec},
	}
	r := Compute(outs, 3*time.Second)
	if r.PeakOutputThroughput != 2 || r.PeakConcurrent != 2 {
		t.Fatalf("peak tokens %v (want 2: 1.5 s and 1.25 s), peak concurrency %d (want 2 in second 1)", r.PeakOutputThroughput, r.PeakConcurrent)
	}
	outs[1].Start = 3 * time.Second
	if r := Compute(outs, 4*time.Second); r.PeakOutputThroughput != 1 || r.PeakConcurrent != 1 {
		t.Fatalf("disjoint seconds: %v %d", r.PeakOutputThroughput, r.PeakConcurrent)
	}
}

func TestPercentileMatchesNumpy(t *testing.T) {
	xs := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	// numpy.percentile(range(1, 11), [50, 90, 99]) = 5.5, 9.1, 9.91
	for _, c := range [][2]float64{{50, 5.5}, {90, 9.1}, {99, 9.91}, {0, 1}, {100, 10}} {
		near(t, fmt.Sprint("p", c[0]), percentile(xs, c[0]), c[1])
	}
}

func TestPrintFormat(t *testing.T) {
	hit := 0.75
	r := &Result{Completed: 32, Failed: 1, MaxConcurrency: 4, RequestRate: math.Inf(1), Duration: 150.8712,
		TotalInput: 65536, TotalOutput: 65536, RequestThroughput: 0.2121, OutputThroughput: 434.4,
		TotalTokenThroughput: 868.8, MeanTTFT: 7279.5551, MedianTTFT: 7099.88, P99TTFT: 10999.46,
		MeanTPOT: 70.14, PrefixCacheHitRate: &hit, ServerMetrics: map[string]float64{"pagoda:kv_waste_ratio": 0.125}}
	var b bytes.Buffer
	r.Print(&b)
	out := b.String()
	for _, line := range []string{
		"============ Serving Benchmark Result ============\n",
		"Successful requests:                     32        \n",
		"Failed requests:                         1         \n",
		"Maximum request concurrency:             4         \n",
		"Peak concurrent requests:                0.00      \n",
		"Benchmark duration (s):                  150.87    \n",
		"Total input tokens:                      65536     \n",
		"Request throughput (req/s):              0.21      \n",
		"Output token throughput (tok/s):         434.40    \n",
		"Total token throughput (tok/s):          868.80    \n",
		"---------------Time to First Token----------------\n",
		"Mean TTFT (ms):                          7279.56   \n",
		"P99 TTFT (ms):                           10999.46  \n",
		"-----Time per Output Token (excl. 1st token)------\n",
		"---------------Inter-token Latency----------------\n",
		"----------------End-to-end Latency----------------\n",
		"Prefix cache hit rate (%):               75.00     \n",
		"pagoda:kv_waste_ratio:                   0.12      \n",
		"==================================================\n",
	} {
		if !strings.Contains(out, line) {
			t.Errorf("missing line %q in\n%s", line, out)
		}
	}
	if strings.Contains(out, "Request rate configured") {
		t.Errorf("vLLM omits the configured rate when it is inf")
	}
	r.RequestRate = 12.5
	b.Reset()
	r.Print(&b)
	if !strings.Contains(b.String(), "Request rate configured (RPS):           12.50     \n") {
		t.Errorf("rate line missing:\n%s", b.String())
	}
	if !strings.HasSuffix(out, strings.Repeat("=", 50)+"\n") {
		t.Errorf("table must end with the rule")
	}
}

// fakeSSE is an OpenAI-style completions server that streams `tokens`
// one-letter chunks, the first after ttft and the rest gap apart.
type fakeSSE struct {
	ttft, gap time.Duration
	tokens    int
	failOdd   bool

	mu      sync.Mutex
	bodies  []map[string]any
	live    atomic.Int32
	maxLive atomic.Int32
	n       atomic.Int32
}

func (f *fakeSSE) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/completions" || r.Header.Get("Authorization") != "Bearer k" {
		http.Error(w, "bad path or key", 400)
		return
	}
	k := f.n.Add(1)
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	f.mu.Lock()
	f.bodies = append(f.bodies, body)
	f.mu.Unlock()
	if f.failOdd && k%2 == 0 {
		http.Error(w, `{"error":{"message":"nope"}}`, 500)
		return
	}
	cur := f.live.Add(1)
	defer f.live.Add(-1)
	for {
		m := f.maxLive.Load()
		if cur <= m || f.maxLive.CompareAndSwap(m, cur) {
			break
		}
	}
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	nprompt := len(body["prompt"].([]any))
	time.Sleep(f.ttft)
	for i := range f.tokens {
		if i > 0 {
			time.Sleep(f.gap)
		}
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"text\":\"%c\",\"finish_reason\":null}],\"usage\":null}\n\n", 'a'+i)
		rc.Flush()
	}
	fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d}}\n\ndata: [DONE]\n\n", nprompt, f.tokens)
}

func TestRunTimingAndRequests(t *testing.T) {
	f := &fakeSSE{ttft: 30 * msec, gap: 10 * msec, tokens: 5}
	ts := httptest.NewServer(f)
	defer ts.Close()
	cfg := Config{BaseURL: ts.URL + "/v1", Model: "m", NumPrompts: 8, InputLen: 12, OutputLen: 5, VocabSize: 512,
		MinTokenID: 259, MaxConcurrency: 2, Seed: 7, IgnoreEOS: true, LogitBias: map[int]float64{0: -100, 258: -100}, APIKey: "k"}
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Completed != 8 || res.Failed != 0 || res.TotalOutput != 40 || res.TotalInput != 96 {
		t.Fatalf("counts: completed %d failed %d out %d in %d", res.Completed, res.Failed, res.TotalOutput, res.TotalInput)
	}
	if f.n.Load() != 9 {
		t.Fatalf("server saw %d requests, want 8 + the test request", f.n.Load())
	}
	// vLLM counts a request in every whole second it was active in, so the
	// peak may exceed the instantaneous cap.
	if m := f.maxLive.Load(); m > 2 || res.PeakConcurrent > 8 || res.PeakConcurrent < 2 {
		t.Fatalf("concurrency: server max %d, measured peak %d, cap 2", m, res.PeakConcurrent)
	}
	for i, g := range res.ITLs {
		if len(g) != 4 {
			t.Fatalf("request %d: %d ITL gaps, want 4", i, len(g))
		}
	}
	// Wall-clock figures: bounded below by the server's sleeps, above by slack.
	if res.MedianTTFT < 29 || res.MedianTTFT > 2000 {
		t.Errorf("median TTFT %.1f ms, server waits 30", res.MedianTTFT)
	}
	if res.MedianITL < 8 || res.MedianITL > 1000 || res.MeanTPOT < 8 || res.MeanTPOT > 1000 {
		t.Errorf("ITL %.1f / TPOT %.1f ms, server gap 10", res.MedianITL, res.MeanTPOT)
	}
	if res.MeanE2EL < res.MeanTTFT+4*8 {
		t.Errorf("E2EL %.1f < TTFT %.1f + 4 gaps", res.MeanE2EL, res.MeanTTFT)
	}
	// 8 requests × (30 + 4·10) ms at concurrency 2 take at least 4 × 70 ms.
	if res.Duration < 0.28 {
		t.Errorf("duration %.3f s too short for the concurrency cap", res.Duration)
	}
	f.mu.Lock()
	bodies := slices.Clone(f.bodies)
	f.mu.Unlock()
	for _, b := range bodies {
		ids := b["prompt"].([]any)
		if len(ids) != 12 {
			t.Fatalf("prompt of %d tokens, want 12", len(ids))
		}
		for _, id := range ids {
			if v := id.(float64); v < 259 || v >= 512 {
				t.Fatalf("token id %v outside [259, 512)", v)
			}
		}
		so, _ := b["stream_options"].(map[string]any)
		if b["stream"] != true || so["include_usage"] != true || b["max_tokens"] != 5.0 || b["ignore_eos"] != true ||
			b["temperature"] != 0.0 || b["model"] != "m" {
			t.Fatalf("request body %v", b)
		}
		if lb := b["logit_bias"].(map[string]any); lb["0"] != -100.0 || lb["258"] != -100.0 {
			t.Fatalf("logit_bias %v", lb)
		}
	}
	var buf bytes.Buffer
	res.Print(&buf)
	if !strings.Contains(buf.String(), "Successful requests:                     8 ") {
		t.Errorf("table:\n%s", buf.String())
	}
	if _, err := json.Marshal(res); err != nil {
		t.Fatal(err)
	}
}

func TestDatasets(t *testing.T) {
	cfg := Config{BaseURL: "http://x", NumPrompts: 6, InputLen: 4, OutputLen: 1, VocabSize: 100, Dataset: "shared-prefix",
		PrefixLen: 16, NumPrefixes: 2, Seed: 3}
	if err := cfg.defaults(); err != nil {
		t.Fatal(err)
	}
	ps, err := cfg.dataset(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range ps {
		if len(p.ids) != 20 || p.len != 20 {
			t.Fatalf("prompt %d: %d tokens", i, len(p.ids))
		}
		if !slices.Equal(p.ids[:16], ps[i%2].ids[:16]) {
			t.Fatalf("prompt %d does not share prefix %d", i, i%2)
		}
	}
	if slices.Equal(ps[0].ids[:16], ps[1].ids[:16]) || slices.Equal(ps[0].ids[16:], ps[2].ids[16:]) {
		t.Fatal("distinct prefixes/suffixes expected")
	}
	again, _ := cfg.dataset(context.Background())
	if !reflect.DeepEqual(again, ps) {
		t.Fatal("same seed must give the same prompts")
	}
	cfg.Seed = 4
	other, _ := cfg.dataset(context.Background())
	if reflect.DeepEqual(other, ps) {
		t.Fatal("another seed gave the same prompts")
	}
	cfg = Config{BaseURL: "http://x", NumPrompts: 200, InputLen: 100, RangeRatio: 0.5, OutputLen: 1, VocabSize: 10}
	cfg.defaults()
	ps, _ = cfg.dataset(context.Background())
	lo, hi := 1000, 0
	for _, p := range ps {
		lo, hi = min(lo, len(p.ids)), max(hi, len(p.ids))
	}
	if lo < 50 || hi > 150 || hi-lo < 50 {
		t.Fatalf("range ratio 0.5 of 100 gave lengths in [%d, %d]", lo, hi)
	}
}

func TestPoissonIntervals(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var sum time.Duration
	const n = 20000
	for range n {
		sum += interval(rng, 50)
	}
	if mean := sum.Seconds() / n; math.Abs(mean-0.02) > 0.02*0.03 {
		t.Fatalf("mean gap %.5f s, want 0.02 for 50 req/s", mean)
	}
}

func TestFailures(t *testing.T) {
	f := &fakeSSE{tokens: 2, failOdd: true}
	ts := httptest.NewServer(f)
	defer ts.Close()
	res, err := Run(context.Background(), Config{BaseURL: ts.URL, NumPrompts: 6, InputLen: 3, OutputLen: 2,
		VocabSize: 50, APIKey: "k", SkipTestRequest: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Completed != 3 || res.Failed != 3 || res.TotalOutput != 6 {
		t.Fatalf("completed %d failed %d output %d", res.Completed, res.Failed, res.TotalOutput)
	}
	nerr := 0
	for _, e := range res.Errors {
		if strings.Contains(e, "status 500") && strings.Contains(e, "nope") {
			nerr++
		}
	}
	if nerr != 3 {
		t.Fatalf("errors %q", res.Errors)
	}
	// A wrong key fails the test request up front.
	if _, err := Run(context.Background(), Config{BaseURL: ts.URL, NumPrompts: 1, InputLen: 1, OutputLen: 1,
		VocabSize: 5, APIKey: "bad"}); err == nil || !strings.Contains(err.Error(), "test request") {
		t.Fatalf("bad key: %v", err)
	}
	res, err = Run(context.Background(), Config{BaseURL: ts.URL, NumPrompts: 2, InputLen: 1, OutputLen: 1,
		VocabSize: 5, APIKey: "bad", SkipTestRequest: true})
	if err == nil || res == nil || res.Failed != 2 {
		t.Fatalf("all failed: %v %+v", err, res)
	}
}

func TestConfigErrors(t *testing.T) {
	base := Config{BaseURL: "http://x", NumPrompts: 1, InputLen: 1, OutputLen: 1, VocabSize: 10}
	for name, mod := range map[string]func(*Config){
		"no url":      func(c *Config) { c.BaseURL = "" },
		"endpoint":    func(c *Config) { c.Endpoint = "embeddings" },
		"dataset":     func(c *Config) { c.Dataset = "sharegpt" },
		"prompts":     func(c *Config) { c.NumPrompts = 0 },
		"input":       func(c *Config) { c.InputLen = 0 },
		"output":      func(c *Config) { c.OutputLen = -1 },
		"vocab":       func(c *Config) { c.VocabSize = 0 },
		"min id":      func(c *Config) { c.MinTokenID = 10 },
		"rate":        func(c *Config) { c.RequestRate = -1 },
		"range ratio": func(c *Config) { c.RangeRatio = 1 },
	} {
		c := base
		mod(&c)
		if _, err := Run(context.Background(), c); err == nil || !strings.HasPrefix(err.Error(), "bench: ") {
			t.Errorf("%s: err %v", name, err)
		}
	}
}

func TestParseMetrics(t *testing.T) {
	text := `# HELP vllm:prefix_cache_hits_total hits
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{model_name="m"} 30
vllm:prefix_cache_queries_total{model_name="m"} 40
vllm:num_preemptions_total{model_name="m"} 2
pagoda:kv_waste_ratio 0.25
pagoda:kv_blocks{state="free"} 10
pagoda:kv_blocks{state="used"} 6
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 7
other_metric 1e3
`
	m, err := parseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"vllm:prefix_cache_hits_total": 30, "vllm:prefix_cache_queries_total": 40,
		"vllm:num_preemptions_total": 2, "pagoda:kv_waste_ratio": 0.25, "pagoda:kv_blocks": 16,
		"vllm:e2e_request_latency_seconds_bucket": 7, "other_metric": 1000}
	if !reflect.DeepEqual(m, want) {
		t.Fatalf("%v", m)
	}
	var r Result
	r.serverExtras(map[string]float64{"vllm:prefix_cache_hits_total": 10, "vllm:prefix_cache_queries_total": 15}, m)
	if r.PrefixCacheHitRate == nil || *r.PrefixCacheHitRate != 20.0/25 {
		t.Fatalf("hit rate %v", r.PrefixCacheHitRate)
	}
	if r.ServerMetrics["pagoda:kv_waste_ratio"] != 0.25 || r.ServerMetrics["vllm:num_preemptions_total"] != 2 ||
		r.ServerMetrics["vllm:prefix_cache_hits_total"] != 20 || len(r.ServerMetrics) != 5 {
		t.Fatalf("extras %v", r.ServerMetrics)
	}
}

// tickClock advances one millisecond per reading, so a run's timings
// depend only on how many times the client looked at the clock.
type tickClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *tickClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(time.Millisecond)
	return c.t
}

// TestRunExactArithmetic runs the real HTTP path with a clock that ticks
// once per stream line read. Per request the client reads: start, then
// 5 token lines each followed by a blank line, the usage line, a blank, and
// [DONE], then the end. So TTFT = 1 ms, ITL = 2 ms ×4, latency = 9 ms,
// TPOT = (9−1)/(5−1) = 2 ms, and each request spans 14 ticks.
func TestRunExactArithmetic(t *testing.T) {
	f := &fakeSSE{tokens: 5}
	ts := httptest.NewServer(f)
	defer ts.Close()
	clk := &tickClock{t: time.Unix(0, 0)}
	res, err := Run(context.Background(), Config{BaseURL: ts.URL, NumPrompts: 3, InputLen: 4, OutputLen: 5, VocabSize: 50,
		MaxConcurrency: 1, APIKey: "k", SkipTestRequest: true, clock: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	// t0, 3 × (start + 13 lines + end), final reading.
	near(t, "duration", res.Duration, 0.046)
	// Peak concurrency 3: one after another, but all within second 0.
	if res.Completed != 3 || res.TotalOutput != 15 || res.TotalInput != 12 || res.PeakConcurrent != 3 {
		t.Fatalf("counts: %+v", res)
	}
	near(t, "mean ttft", res.MeanTTFT, 1)
	near(t, "p99 ttft", res.P99TTFT, 1)
	near(t, "std ttft", res.StdTTFT, 0)
	near(t, "mean itl", res.MeanITL, 2)
	near(t, "median itl", res.MedianITL, 2)
	near(t, "mean tpot", res.MeanTPOT, 2)
	near(t, "mean e2el", res.MeanE2EL, 9)
	near(t, "p99 e2el", res.P99E2EL, 9)
	near(t, "request throughput", res.RequestThroughput, 3/0.046)
	near(t, "input throughput", res.InputThroughput, 12/0.046)
	near(t, "output throughput", res.OutputThroughput, 15/0.046)
	near(t, "total throughput", res.TotalTokenThroughput, 27/0.046)
	near(t, "peak output", res.PeakOutputThroughput, 15)
	for i, g := range res.ITLs {
		if !reflect.DeepEqual(g, []float64{0.002, 0.002, 0.002, 0.002}) {
			t.Fatalf("request %d gaps %v", i, g)
		}
	}
}

// KV waste is the share of empty slots over the run: the change in the
// reserved counter over the change in both.
func TestKVWasteFromCounters(t *testing.T) {
	before := map[string]float64{"pagoda:kv_slots_filled_total": 1000, "pagoda:kv_slots_reserved_total": 100}
	after := map[string]float64{"pagoda:kv_slots_filled_total": 10600, "pagoda:kv_slots_reserved_total": 500}
	var r Result
	r.serverExtras(before, after)
	if r.KVWaste == nil || math.Abs(*r.KVWaste-400.0/10000) > 1e-12 {
		t.Fatalf("waste %v, want 0.04", r.KVWaste)
	}
	var buf strings.Builder
	r.Print(&buf)
	if !strings.Contains(buf.String(), "KV-cache waste (%):") || !strings.Contains(buf.String(), "4.00") {
		t.Fatalf("printout lacks the waste line:\n%s", buf.String())
	}
	var none Result
	none.serverExtras(map[string]float64{}, map[string]float64{"vllm:prefix_cache_hits_total": 1})
	if none.KVWaste != nil {
		t.Fatal("waste reported without Pagoda's counters")
	}
}

// TestDroppedKeepAlive: a server that closes a kept-alive connection as the
// next request arrives on it (without answering) costs no failed request.
func TestDroppedKeepAlive(t *testing.T) {
	f := &fakeSSE{tokens: 2}
	type connKey struct{}
	var mu sync.Mutex
	served := map[*int]int{} // requests answered per connection
	dropped := 0
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Context().Value(connKey{}).(*int)
		mu.Lock()
		n := served[id]
		served[id]++
		drop := n == 1 && dropped < 3
		if drop {
			dropped++
		}
		mu.Unlock()
		if drop {
			c, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				c.Close()
			}
			return
		}
		f.ServeHTTP(w, r)
	}))
	ts.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
		return context.WithValue(ctx, connKey{}, new(int))
	}
	ts.Start()
	defer ts.Close()
	res, err := Run(context.Background(), Config{BaseURL: ts.URL, NumPrompts: 6, InputLen: 3, OutputLen: 2,
		VocabSize: 50, APIKey: "k", MaxConcurrency: 1, SkipTestRequest: true})
	if err != nil {
		t.Fatal(err)
	}
	if dropped == 0 || res.Completed != 6 || res.Failed != 0 {
		t.Fatalf("dropped %d: completed %d failed %d %q", dropped, res.Completed, res.Failed, res.Errors)
	}
}
