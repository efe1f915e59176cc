package engine

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"pagoda/model"

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
	// The second forward pass waits until the engine holds the cancel, so
	// a busy machine cannot let the request run to its length limit first.
	gm := &gatedModel{gate: make(chan struct{})}
	e, err := New(gm, newFakeTok(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.Start()
	t.Cleanup(func() { e.Stop(context.Background()) })
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := e.Submit(ctx, &Request{Prompt: []int32{4, 5, 6}, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	<-ch
	cancel()
	// The loop may take the cancel before it starts the gated pass (then
	// the request ends without it), or while the pass waits (then the
	// cancel sits queued until the gate opens).
	ended := false
	for deadline := time.Now().Add(10 * time.Second); !ended; time.Sleep(time.Millisecond) {
		e.mu.Lock()
		queued := len(e.inCancel) > 0
		e.mu.Unlock()
		if queued {
			break
		}
		select {
		case _, ok := <-ch:
			ended = !ok
		default:
		}
		if !ended && time.Now().After(deadline) {
			t.Fatal("the cancel never reached the engine")
		}
	}
	close(gm.gate)
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

// gatedModel is fakeModel whose forward passes after the first wait for
// gate to close.
type gatedModel struct {
	fakeModel
	gate  chan struct{}
	calls atomic.Int32
}

func (g *gatedModel) Forward(b *model.Batch, kv model.KVCache) ([]float32, error) {
	if g.calls.Add(1) > 1 {
		<-g.gate
	}
	return g.fakeModel.Forward(b, kv)
}
