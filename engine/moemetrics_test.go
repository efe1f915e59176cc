package engine

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

type fakeExperts struct{ load [][]uint64 }

func (f fakeExperts) ExpertLoad() [][]uint64  { return f.load }
func (f fakeExperts) ExpertBytesRead() uint64 { return 4096 }

func TestExpertCollector(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewExpertCollector(fakeExperts{load: [][]uint64{nil, {3, 0, 7}}}, "m"))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, mt := range mf.GetMetric() {
			key := mf.GetName()
			for _, lp := range mt.GetLabel() {
				key += " " + lp.GetName() + "=" + lp.GetValue()
			}
			got[key] = mt.GetCounter().GetValue()
		}
	}
	want := map[string]float64{
		"pagoda:moe_expert_bytes_read_total model_name=m":              4096,
		"pagoda:moe_expert_tokens_total expert=0 layer=1 model_name=m": 3,
		"pagoda:moe_expert_tokens_total expert=1 layer=1 model_name=m": 0,
		"pagoda:moe_expert_tokens_total expert=2 layer=1 model_name=m": 7,
	}
	if len(got) != len(want) {
		t.Errorf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v, %v; want %v", k, g, ok, v)
		}
	}
}
