package cluster

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	descGroupUp = prometheus.NewDesc("pagoda_worker_group_up",
		"1 while the worker group (tensor-parallel group or pipeline) serves, 0 while it is down and being reconnected.", nil, nil)
	descWorkerUp = prometheus.NewDesc("pagoda_worker_up",
		"Per worker: 0 while the group is down and this worker is the one blamed (it died, stalled, hung up, or a reconnect cannot reach it), else 1.",
		[]string{"worker", "name", "address"}, nil)
	descFailures = prometheus.NewDesc("pagoda_worker_group_failures_total",
		"Times the worker group broke (a step failed: a worker died, stalled past --worker-timeout or was cut off).", nil, nil)
	descReconnects = prometheus.NewDesc("pagoda_worker_group_reconnects_total",
		"Times a new worker group connected after a failure.", nil, nil)
	descAttempts = prometheus.NewDesc("pagoda_worker_group_reconnect_attempts_total",
		"Reconnect attempts, failed ones included.", nil, nil)
	descRestarts = prometheus.NewDesc("pagoda_worker_restarts_total",
		"Local worker processes started again after they exited.", nil, nil)
)

// Collector exposes the supervisor's state and counters to Prometheus.
func (s *Supervisor) Collector() prometheus.Collector { return supCollector{s} }

type supCollector struct{ s *Supervisor }

func (c supCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descGroupUp, descWorkerUp, descFailures, descReconnects, descAttempts, descRestarts} {
		ch <- d
	}
}

func (c supCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	s.mu.Lock()
	up := s.down == nil
	blamed := map[int]bool{}
	if s.down != nil {
		for _, w := range s.down.Workers {
			blamed[w.Worker] = true
		}
	}
	addrs := append([]string(nil), s.addrs...)
	n := s.counts
	s.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(descGroupUp, prometheus.GaugeValue, b2f(up))
	for i, a := range addrs {
		ch <- prometheus.MustNewConstMetric(descWorkerUp, prometheus.GaugeValue, b2f(!blamed[i]), strconv.Itoa(i), s.o.Name(i), a)
	}
	ch <- prometheus.MustNewConstMetric(descFailures, prometheus.CounterValue, float64(n.Failures))
	ch <- prometheus.MustNewConstMetric(descReconnects, prometheus.CounterValue, float64(n.Reconnects))
	ch <- prometheus.MustNewConstMetric(descAttempts, prometheus.CounterValue, float64(n.Attempts))
	ch <- prometheus.MustNewConstMetric(descRestarts, prometheus.CounterValue, float64(n.Restarts))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
