package engine

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are vLLM's, by name, so dashboards built for vLLM read Pagoda.
// Prometheus allows ':' in metric names (it is reserved for recording
// rules by convention, which vLLM ignores; so do we, for compatibility).
type metrics struct {
	waiting, running, kvUsage                                       prometheus.Gauge
	promptTokens, genTokens, prefixQueries, prefixHits, preemptions prometheus.Counter
	success                                                         *prometheus.CounterVec
	ttft, itl, tpot, e2e                                            prometheus.Histogram

	// KV waste, Pagoda's own: slot counts summed over engine steps, so a
	// benchmark can take the time-averaged share of allocated slots that
	// hold no token (vLLM's "under 4%" claim) from two scrapes.
	slotsFilled, slotsReserved prometheus.Counter
	wasteRatio                 prometheus.Gauge
	blocks                     *prometheus.GaugeVec

	// Speculative decoding (vLLM's spec_decode metrics), registered only
	// when the engine speculates.
	specDrafts, specDraftTokens, specAccepted prometheus.Counter
	specAcceptedPerPos                        *prometheus.CounterVec
	specPos                                   []prometheus.Counter // specAcceptedPerPos by position
	// specAccLen is the acceptance length of each verification, accepted
	// drafts + 1 (vLLM's "mean acceptance length", 1 + accepted/drafts,
	// as a distribution).
	specAccLen prometheus.Histogram

	// The speculation controller (specctl.go), Pagoda's own: the arm it
	// exploits per load bucket (1 = speculate), its running estimate of
	// each arm's realised output tokens/s there, and the steps it measured
	// by arm, probe windows among them.
	specCtlArmVec, specCtlRateVec *prometheus.GaugeVec
	specCtlArm                    [ctlBuckets]prometheus.Gauge
	specCtlRate                   [ctlBuckets][2]prometheus.Gauge
	specCtlSteps                  [2]prometheus.Counter
	specCtlProbes                 prometheus.Counter
	// With a tree proposer: the tree budget exploited per load bucket,
	// its nodes and depth (0 while plain decoding is exploited there).
	specCtlTreeVec *prometheus.GaugeVec
	specCtlTree    [ctlBuckets][2]prometheus.Gauge
}

// abortLabel is vLLM's finished_reason for a request that was cancelled
// (client gone, drain deadline): such requests count in
// vllm:request_success_total as vLLM counts them, so dashboards see them.
const abortLabel = "abort"

func newMetrics(reg *prometheus.Registry, modelName string, speculate bool, specTokens int) (*metrics, error) {
	cl := prometheus.Labels{"model_name": modelName}
	g := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: cl})
	}
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: cl})
	}
	h := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, ConstLabels: cl, Buckets: buckets})
	}
	m := &metrics{
		waiting:       g("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
		running:       g("vllm:num_requests_running", "Number of requests in model execution batches."),
		kvUsage:       g("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
		promptTokens:  c("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		genTokens:     c("vllm:generation_tokens_total", "Number of generation tokens processed."),
		prefixQueries: c("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens."),
		prefixHits:    c("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
		preemptions:   c("vllm:num_preemptions_total", "Cumulative number of preemptions from the engine."),
		success: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vllm:request_success_total", Help: "Count of successfully processed requests.", ConstLabels: cl,
		}, []string{"finished_reason"}),
		ttft: h("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
			[]float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}),
		itl: h("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
			[]float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}),
		tpot: h("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.",
			[]float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}),
		e2e: h("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
			[]float64{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680}),
	}
	m.slotsFilled = c("pagoda:kv_slots_filled_total", "KV token slots holding a token, summed over engine steps.")
	m.slotsReserved = c("pagoda:kv_slots_reserved_total", "KV token slots allocated but empty (the unfilled tail of each sequence's last block), summed over engine steps.")
	m.wasteRatio = g("pagoda:kv_waste_ratio", "Share of allocated KV slots holding no token, now.")
	m.blocks = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pagoda:kv_blocks", Help: "KV blocks by state: used (referenced), free, cached (free but holding a reusable prefix).", ConstLabels: cl}, []string{"state"})
	m.specMetrics(cl, c, h, specTokens)
	if reg == nil {
		return m, nil
	}
	cols := []prometheus.Collector{m.waiting, m.running, m.kvUsage, m.promptTokens, m.genTokens,
		m.prefixQueries, m.prefixHits, m.preemptions, m.success, m.ttft, m.itl, m.tpot, m.e2e,
		m.slotsFilled, m.slotsReserved, m.wasteRatio, m.blocks}
	if speculate {
		cols = append(cols, m.specDrafts, m.specDraftTokens, m.specAccepted, m.specAcceptedPerPos,
			m.specAccLen, m.specCtlTreeVec, m.specCtlArmVec, m.specCtlRateVec, m.specCtlSteps[armPlain], m.specCtlSteps[armSpec], m.specCtlProbes)
	}
	for _, col := range cols {
		if err := reg.Register(col); err != nil {
			return nil, fmt.Errorf("engine: registering metrics: %w", err)
		}
	}
	return m, nil
}

// specMetrics makes the speculation metrics: vLLM's spec_decode_* and
// the controller's.
func (m *metrics) specMetrics(cl prometheus.Labels, c func(name, help string) prometheus.Counter,
	h func(name, help string, buckets []float64) prometheus.Histogram, specTokens int) {
	m.specDrafts = c("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.")
	m.specDraftTokens = c("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.")
	m.specAccepted = c("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.")
	m.specAcceptedPerPos = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vllm:spec_decode_num_accepted_tokens_per_pos", Help: "Accepted tokens per draft position.", ConstLabels: cl,
	}, []string{"position"})
	for i := range specTokens {
		m.specPos = append(m.specPos, m.specAcceptedPerPos.WithLabelValues(fmt.Sprint(i)))
	}
	m.specAccLen = h("pagoda:spec_decode_acceptance_length", "Tokens per verification of a sequence's drafts: accepted drafts + 1.",
		prometheus.LinearBuckets(1, 1, min(specTokens, MaxSpecTokens)+1))
	m.specCtlArmVec = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "pagoda:spec_ctl_arm", Help: "Speculation controller: the arm exploited at this load (decoding sequences per step), 1 = speculate, 0 = plain.", ConstLabels: cl,
	}, []string{"batch"})
	m.specCtlRateVec = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "pagoda:spec_ctl_tokens_per_second", Help: "Speculation controller: estimated output tokens per wall-clock second of whole engine iterations, by load and arm.", ConstLabels: cl,
	}, []string{"batch", "arm"})
	for i := range ctlBuckets {
		m.specCtlArm[i] = m.specCtlArmVec.WithLabelValues(ctlBucketName(i))
		m.specCtlArm[i].Set(armSpec) // without the controller, speculation is always on
		for a := range 2 {
			m.specCtlRate[i][a] = m.specCtlRateVec.WithLabelValues(ctlBucketName(i), armNames[a])
		}
	}
	m.specCtlTreeVec = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "pagoda:spec_ctl_tree", Help: "Speculation controller, tree proposers: the tree budget exploited at this load (decoding sequences per step), its most nodes and depth; 0 while plain decoding is exploited.", ConstLabels: cl,
	}, []string{"batch", "size"})
	for i := range ctlBuckets {
		for j, n := range []string{"nodes", "depth"} {
			m.specCtlTree[i][j] = m.specCtlTreeVec.WithLabelValues(ctlBucketName(i), n)
		}
	}
	m.specCtlSteps[armPlain] = c("pagoda:spec_ctl_plain_steps_total", "Speculation controller: measured steps run without speculation.")
	m.specCtlSteps[armSpec] = c("pagoda:spec_ctl_spec_steps_total", "Speculation controller: measured steps run with speculation.")
	m.specCtlProbes = c("pagoda:spec_ctl_probe_steps_total", "Speculation controller: measured steps of probe windows (the arm not exploited).")
}
