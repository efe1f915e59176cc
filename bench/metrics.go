package bench

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// RequestOutput is what one benchmark request measured. Times are offsets
// from the start of the run.
type RequestOutput struct {
	Success      bool
	Error        string
	PromptLen    int             // prompt tokens (server usage when reported, else the dataset's count)
	OutputTokens int             // generated tokens (server usage when reported, else streamed chunks)
	Start        time.Duration   // request sent
	TTFT         time.Duration   // first streamed token − Start
	ITL          []time.Duration // gaps between streamed token chunks
	Latency      time.Duration   // last streamed token − Start (vLLM's "latency")
	End          time.Duration   // response fully read
	Text         string
}

// stats summarises one latency metric in milliseconds.
type stats struct {
	Mean, Median, Std, P99 float64
}

// Result is the outcome of a run, with vLLM `bench serve` field names in
// its JSON form.
type Result struct {
	Endpoint        string  `json:"endpoint"`
	Dataset         string  `json:"dataset"`
	Model           string  `json:"model_id"`
	NumPrompts      int     `json:"num_prompts"`
	RequestRate     float64 `json:"-"`
	RequestRateJSON any     `json:"request_rate"` // number or "inf"
	MaxConcurrency  int     `json:"max_concurrency"`
	InputLen        int     `json:"input_len"`
	OutputLen       int     `json:"output_len"`
	PrefixLen       int     `json:"prefix_len"`
	BaseURL         string  `json:"base_url"`

	// Provenance: when and where the client ran. Commit is for the caller
	// to fill (the binary's or the server's revision).
	Date      string `json:"date"`
	Host      string `json:"host"`
	NumCPU    int    `json:"num_cpus"`
	GoVersion string `json:"go_version"`
	Commit    string `json:"commit,omitempty"`

	Duration             float64 `json:"duration"` // seconds
	Completed            int     `json:"completed"`
	Failed               int     `json:"failed"`
	TotalInput           int     `json:"total_input_tokens"`
	TotalOutput          int     `json:"total_output_tokens"`
	RequestThroughput    float64 `json:"request_throughput"`
	InputThroughput      float64 `json:"input_throughput"`
	OutputThroughput     float64 `json:"output_throughput"`
	TotalTokenThroughput float64 `json:"total_token_throughput"`
	PeakOutputThroughput float64 `json:"max_output_tokens_per_s"`
	PeakConcurrent       int     `json:"max_concurrent_requests"`

	MeanTTFT   float64 `json:"mean_ttft_ms"`
	MedianTTFT float64 `json:"median_ttft_ms"`
	StdTTFT    float64 `json:"std_ttft_ms"`
	P99TTFT    float64 `json:"p99_ttft_ms"`
	MeanTPOT   float64 `json:"mean_tpot_ms"`
	MedianTPOT float64 `json:"median_tpot_ms"`
	StdTPOT    float64 `json:"std_tpot_ms"`
	P99TPOT    float64 `json:"p99_tpot_ms"`
	MeanITL    float64 `json:"mean_itl_ms"`
	MedianITL  float64 `json:"median_itl_ms"`
	StdITL     float64 `json:"std_itl_ms"`
	P99ITL     float64 `json:"p99_itl_ms"`
	MeanE2EL   float64 `json:"mean_e2el_ms"`
	MedianE2EL float64 `json:"median_e2el_ms"`
	StdE2EL    float64 `json:"std_e2el_ms"`
	P99E2EL    float64 `json:"p99_e2el_ms"`

	InputLens  []int       `json:"input_lens"`
	OutputLens []int       `json:"output_lens"`
	TTFTs      []float64   `json:"ttfts"` // seconds, per request (0 for failures)
	ITLs       [][]float64 `json:"itls"`  // seconds
	Errors     []string    `json:"errors"`

	// Server-side figures scraped from /metrics (nil when unavailable):
	// counters as the change over the run, gauges as read after it.
	PrefixCacheHitRate *float64 `json:"prefix_cache_hit_rate,omitempty"` // 0..1
	// KVWaste is the share of allocated KV slots that held no token,
	// averaged over the server's steps during the run (Pagoda servers).
	KVWaste *float64 `json:"kv_waste,omitempty"` // 0..1
	// Speculative decoding over the run (servers exporting vLLM's
	// spec_decode counters): accepted draft tokens per draft token, and
	// vLLM's acceptance length, 1 + accepted tokens per verification (the
	// tokens one target pass yields, the bonus or correction included).
	SpecAcceptanceRate   *float64           `json:"spec_decode_acceptance_rate,omitempty"` // 0..1
	SpecAcceptanceLength *float64           `json:"spec_decode_acceptance_length,omitempty"`
	SpecDrafts           float64            `json:"spec_decode_num_drafts,omitempty"`
	SpecDraftTokens      float64            `json:"spec_decode_num_draft_tokens,omitempty"`
	SpecAccepted         float64            `json:"spec_decode_num_accepted_tokens,omitempty"`
	ServerMetrics        map[string]float64 `json:"server_metrics,omitempty"`
}

// percentile is numpy's default (linear interpolation between closest
// ranks) over sorted xs.
func percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	r := p / 100 * float64(n-1)
	lo := int(math.Floor(r))
	hi := int(math.Ceil(r))
	return sorted[lo] + (sorted[hi]-sorted[lo])*(r-float64(lo))
}

func summarize(xs []float64) stats {
	if len(xs) == 0 {
		return stats{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	var sum float64
	for _, x := range s {
		sum += x
	}
	mean := sum / float64(len(s))
	var ss float64
	for _, x := range s {
		ss += (x - mean) * (x - mean)
	}
	return stats{Mean: mean, Median: percentile(s, 50), Std: math.Sqrt(ss / float64(len(s))), P99: percentile(s, 99)}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Compute turns per-request measurements into the run's metrics, with
// vLLM's definitions: TTFT and E2EL over successful requests, TPOT =
// (latency − TTFT)/(output tokens − 1) over those with more than one token,
// ITL over every gap of every request, throughputs over the wall duration.
func Compute(outs []RequestOutput, duration time.Duration) *Result {
	r := &Result{Duration: duration.Seconds()}
	var ttft, tpot, itl, e2el []float64
	var ok []RequestOutput
	for _, o := range outs {
		r.InputLens = append(r.InputLens, o.PromptLen)
		if !o.Success {
			r.Failed++
			r.OutputLens = append(r.OutputLens, 0)
			r.TTFTs = append(r.TTFTs, 0)
			r.ITLs = append(r.ITLs, []float64{})
			r.Errors = append(r.Errors, o.Error)
			continue
		}
		r.Completed++
		r.Errors = append(r.Errors, "")
		r.TotalInput += o.PromptLen
		r.TotalOutput += o.OutputTokens
		r.OutputLens = append(r.OutputLens, o.OutputTokens)
		r.TTFTs = append(r.TTFTs, o.TTFT.Seconds())
		ttft = append(ttft, ms(o.TTFT))
		e2el = append(e2el, ms(o.Latency))
		if o.OutputTokens > 1 {
			tpot = append(tpot, ms(o.Latency-o.TTFT)/float64(o.OutputTokens-1))
		}
		gaps := make([]float64, len(o.ITL))
		for i, g := range o.ITL {
			itl = append(itl, ms(g))
			gaps[i] = g.Seconds()
		}
		r.ITLs = append(r.ITLs, gaps)
		ok = append(ok, o)
	}
	if duration > 0 {
		sec := duration.Seconds()
		r.RequestThroughput = float64(r.Completed) / sec
		r.InputThroughput = float64(r.TotalInput) / sec
		r.OutputThroughput = float64(r.TotalOutput) / sec
		r.TotalTokenThroughput = float64(r.TotalInput+r.TotalOutput) / sec
	}
	r.PeakOutputThroughput, r.PeakConcurrent = peaks(ok)
	s := summarize(ttft)
	r.MeanTTFT, r.MedianTTFT, r.StdTTFT, r.P99TTFT = s.Mean, s.Median, s.Std, s.P99
	s = summarize(tpot)
	r.MeanTPOT, r.MedianTPOT, r.StdTPOT, r.P99TPOT = s.Mean, s.Median, s.Std, s.P99
	s = summarize(itl)
	r.MeanITL, r.MedianITL, r.StdITL, r.P99ITL = s.Mean, s.Median, s.Std, s.P99
	s = summarize(e2el)
	r.MeanE2EL, r.MedianE2EL, r.StdE2EL, r.P99E2EL = s.Mean, s.Median, s.Std, s.P99
	return r
}

// peaks is vLLM's per-second view: whole-second buckets from the first
// successful start; each streamed chunk counts one token in the bucket it
// arrived in, and a request counts as concurrent in every bucket from its
// start to its last token.
func peaks(ok []RequestOutput) (tokensPerSec float64, concurrent int) {
	if len(ok) == 0 {
		return 0, 0
	}
	minStart, maxEnd := ok[0].Start, ok[0].Start+ok[0].Latency
	for _, o := range ok {
		minStart = min(minStart, o.Start)
		maxEnd = max(maxEnd, o.Start+o.Latency)
	}
	nb := int(math.Ceil((maxEnd - minStart).Seconds())) + 1
	tokens := make([]int, nb)
	conc := make([]int, nb)
	bucket := func(t time.Duration) int { return int((t - minStart) / time.Second) }
	for _, o := range ok {
		t := o.Start + o.TTFT
		tokens[bucket(t)]++
		for _, g := range o.ITL {
			t += g
			if b := bucket(t); b < nb {
				tokens[b]++
			}
		}
		for b := bucket(o.Start); b <= bucket(o.Start+o.Latency) && b < nb; b++ {
			conc[b]++
		}
	}
	return float64(slices.Max(tokens)), slices.Max(conc)
}

// center is Python's '{s:{c}^{n}}' (the extra fill goes right).
func center(s string, n int, c byte) string {
	pad := n - len(s)
	if pad <= 0 {
		return s
	}
	l := pad / 2
	return strings.Repeat(string(c), l) + s + strings.Repeat(string(c), pad-l)
}

// Print writes the result as vLLM's `bench serve` table (same labels and
// widths, plus input throughput, an End-to-end Latency section and the
// server metrics).
func (r *Result) Print(w io.Writer) {
	row := func(label string, v any) {
		var s string
		switch x := v.(type) {
		case float64:
			s = fmt.Sprintf("%.2f", x)
		default:
			s = fmt.Sprint(x)
		}
		fmt.Fprintf(w, "%-40s %-10s\n", label, s)
	}
	fmt.Fprintln(w, center(" Serving Benchmark Result ", 50, '='))
	row("Successful requests:", r.Completed)
	row("Failed requests:", r.Failed)
	if r.MaxConcurrency > 0 {
		row("Maximum request concurrency:", r.MaxConcurrency)
	}
	if !math.IsInf(r.RequestRate, 1) && r.RequestRate > 0 {
		row("Request rate configured (RPS):", r.RequestRate)
	}
	row("Benchmark duration (s):", r.Duration)
	row("Total input tokens:", r.TotalInput)
	row("Total generated tokens:", r.TotalOutput)
	row("Request throughput (req/s):", r.RequestThroughput)
	row("Input token throughput (tok/s):", r.InputThroughput)
	row("Output token throughput (tok/s):", r.OutputThroughput)
	row("Peak output token throughput (tok/s):", r.PeakOutputThroughput)
	row("Peak concurrent requests:", float64(r.PeakConcurrent))
	row("Total token throughput (tok/s):", r.TotalTokenThroughput)
	section := func(title, short string, mean, median, p99 float64) {
		fmt.Fprintln(w, center(title, 50, '-'))
		row("Mean "+short+" (ms):", mean)
		row("Median "+short+" (ms):", median)
		row("P99 "+short+" (ms):", p99)
	}
	section("Time to First Token", "TTFT", r.MeanTTFT, r.MedianTTFT, r.P99TTFT)
	section("Time per Output Token (excl. 1st token)", "TPOT", r.MeanTPOT, r.MedianTPOT, r.P99TPOT)
	section("Inter-token Latency", "ITL", r.MeanITL, r.MedianITL, r.P99ITL)
	section("End-to-end Latency", "E2EL", r.MeanE2EL, r.MedianE2EL, r.P99E2EL)
	if r.SpecAcceptanceRate != nil {
		fmt.Fprintln(w, center("Speculative Decoding", 50, '-'))
		row("Acceptance rate (%):", *r.SpecAcceptanceRate*100)
		row("Acceptance length:", *r.SpecAcceptanceLength)
		row("Mean accepted drafts per verification:", *r.SpecAcceptanceLength-1)
		row("Drafts:", int64(r.SpecDrafts))
		row("Draft tokens:", int64(r.SpecDraftTokens))
		row("Accepted tokens:", int64(r.SpecAccepted))
	}
	if r.PrefixCacheHitRate != nil || r.KVWaste != nil || len(r.ServerMetrics) > 0 {
		fmt.Fprintln(w, center("Server Metrics", 50, '-'))
		if r.PrefixCacheHitRate != nil {
			row("Prefix cache hit rate (%):", *r.PrefixCacheHitRate*100)
		}
		if r.KVWaste != nil {
			row("KV-cache waste (%):", *r.KVWaste*100)
		}
		names := make([]string, 0, len(r.ServerMetrics))
		for k := range r.ServerMetrics {
			names = append(names, k)
		}
		slices.Sort(names)
		for _, k := range names {
			row(k+":", r.ServerMetrics[k])
		}
	}
	fmt.Fprintln(w, strings.Repeat("=", 50))
}
