package engine

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestCancelledRequestCounted checks that a cancelled request shows in
// vllm:request_success_total{finished_reason="abort"}, as in vLLM.
func TestCancelledRequestCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := fakeConfig()
	cfg.KVBlocks = 64
	cfg.Registry = reg
	cfg.ModelName = "fake"
	e := startEngine(t, &fakeModel{}, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := e.Submit(ctx, &Request{Prompt: []int32{4, 5, 6}, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	<-ch
	cancel()
	for range ch { // the engine closes it once it has seen the cancel
	}
	e.Stop(context.Background())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "vllm:request_success_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "finished_reason" {
					got[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	if got["abort"] != 1 || len(got) != 1 {
		t.Fatalf("request_success_total by finished_reason = %v, want abort=1 only", got)
	}
}
