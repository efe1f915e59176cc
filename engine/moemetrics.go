package engine

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// ExpertCounter is what a mixture-of-experts model offers the metrics
// (*model.Model): tokens routed to each expert per layer (nil rows for
// dense layers) and the routed experts' weight bytes read, both since load.
type ExpertCounter interface {
	ExpertLoad() [][]uint64
	ExpertBytesRead() uint64
}

// ExpertCollector exports an MoE model's expert load as
// pagoda:moe_expert_tokens_total{layer, expert} and the expert weight bytes
// read as pagoda:moe_expert_bytes_read_total, read from the model at each
// scrape (the model counts with atomics; nothing is kept here).
type ExpertCollector struct {
	src          ExpertCounter
	tokens, read *prometheus.Desc
}

// NewExpertCollector exports src's counters under the model_name label.
func NewExpertCollector(src ExpertCounter, modelName string) *ExpertCollector {
	cl := prometheus.Labels{"model_name": modelName}
	return &ExpertCollector{src: src,
		tokens: prometheus.NewDesc("pagoda:moe_expert_tokens_total",
			"Tokens routed to each expert of each mixture-of-experts layer since the model was loaded.", []string{"layer", "expert"}, cl),
		read: prometheus.NewDesc("pagoda:moe_expert_bytes_read_total",
			"Routed experts' weight bytes read by forward passes (each active expert once per pass).", nil, cl),
	}
}

// Describe implements prometheus.Collector.
func (c *ExpertCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.tokens
	ch <- c.read
}

// Collect implements prometheus.Collector.
func (c *ExpertCollector) Collect(ch chan<- prometheus.Metric) {
	for l, row := range c.src.ExpertLoad() {
		for e, n := range row {
			ch <- prometheus.MustNewConstMetric(c.tokens, prometheus.CounterValue, float64(n), strconv.Itoa(l), strconv.Itoa(e))
		}
	}
	ch <- prometheus.MustNewConstMetric(c.read, prometheus.CounterValue, float64(c.src.ExpertBytesRead()))
}
