package bench

import (
	"bytes"
	"strings"
	"testing"
)

// TestSpecFromCounters: the acceptance rate and length come from the
// change of vLLM's spec_decode counters over the run, and print.
func TestSpecFromCounters(t *testing.T) {
	before := map[string]float64{"vllm:spec_decode_num_drafts": 10, "vllm:spec_decode_num_draft_tokens": 40, "vllm:spec_decode_num_accepted_tokens": 20}
	after := map[string]float64{"vllm:spec_decode_num_drafts": 30, "vllm:spec_decode_num_draft_tokens": 120, "vllm:spec_decode_num_accepted_tokens": 80}
	var r Result
	r.serverExtras(before, after)
	if r.SpecAcceptanceRate == nil || *r.SpecAcceptanceRate != 0.75 || *r.SpecAcceptanceLength != 4 {
		t.Fatalf("rate %v length %v", r.SpecAcceptanceRate, r.SpecAcceptanceLength)
	}
	var b bytes.Buffer
	r.Print(&b)
	for _, want := range []string{"Acceptance rate (%):", "75.00", "Acceptance length:", "Accepted tokens:"} {
		if !strings.Contains(b.String(), want) {
			t.Fatalf("no %q in\n%s", want, b.String())
		}
	}
	var none Result
	none.serverExtras(map[string]float64{}, map[string]float64{"vllm:prefix_cache_hits_total": 1})
	if none.SpecAcceptanceRate != nil {
		t.Fatal("acceptance without spec counters")
	}
}
