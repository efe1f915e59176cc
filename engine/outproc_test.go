package engine

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"pagoda/model"
	"pagoda/sample"
)

// slowModel is fakeModel taking at least d per step, so that how long
// the loop runs on is visible in tokens.
type slowModel struct {
	*fakeModel
	d time.Duration
}

func (m slowModel) Forward(b *model.Batch, kv model.KVCache) ([]float32, error) {
	time.Sleep(m.d)
	return m.fakeModel.Forward(b, kv)
}

// TestOutputProcessorStops: stop strings are matched by the output
// processor, off the loop. Each of n = 3 sampled completions gives exactly
// the tokens and text of the same request without stops, cut at the token
// that completes the first stop string (or run to max_tokens when its text
// has none), with FinishStop; usage counts exactly the tokens delivered
// although the loop ran on meanwhile; the loop stops a stopped completion
// long before max_tokens, also while the consumer reads nothing; nothing
// leaks.
func TestOutputProcessorStops(t *testing.T) {
	cfg := fakeConfig()
	cfg.KVBlocks = 64
	e := startEngine(t, &fakeModel{}, cfg)
	base := Request{Prompt: []int32{5, 9, 14, 3}, N: 3, MaxTokens: 60, IgnoreEOS: true,
		Sampling: sample.Params{Temperature: 1, Seed: 21, HasSeed: true}}
	full := run(t, e, &base)
	stop := full.text[1][20:23]
	r := base
	r.StopStrings = []string{stop, "\x00never"}
	got := run(t, e, &r)
	delivered := 0
	for i := range 3 {
		text, tokens, finish := full.text[i], full.tokens[i], FinishLength
		if k := strings.Index(text, stop); k >= 0 {
			n := 1
			for !strings.Contains(tokText(tokens[:n]), stop) {
				n++
			}
			text, tokens, finish = text[:k], tokens[:n], FinishStop
		}
		if got.text[i] != text || fmt.Sprint(got.tokens[i]) != fmt.Sprint(tokens) || got.finish[i] != finish {
			t.Errorf("completion %d: %q %v %s, want %q %v %s", i, got.text[i], got.tokens[i], got.finish[i], text, tokens, finish)
		}
		delivered += len(got.tokens[i])
	}
	if got.finish[1] != FinishStop {
		t.Fatal("the stop string was taken from completion 1 and did not stop it")
	}
	if got.usage.CompletionTokens != delivered {
		t.Errorf("usage counts %d completion tokens, %d delivered", got.usage.CompletionTokens, delivered)
	}
	settled(t, e)
	mustNoLeak(t, e)

	// A consumer that reads nothing for a while: the processor still
	// stops the loop, which would otherwise run 200 steps of 2 ms.
	es, err := New(slowModel{&fakeModel{}, 2 * time.Millisecond}, newFakeTok(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	es.Start()
	t.Cleanup(func() { es.Stop(context.Background()) })
	long := Request{Prompt: base.Prompt, MaxTokens: 200, IgnoreEOS: true, Sampling: base.Sampling}
	ref := run(t, es, &long)
	long.StopStrings = []string{ref.text[0][10:13]}
	before := es.Stats().GenerationTokens
	ch, err := es.Submit(context.Background(), &long)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond)
	res := collect(t, ch, 1)
	settled(t, es)
	ran := es.Stats().GenerationTokens - before
	n := len(res.tokens[0])
	t.Logf("stopped after %d tokens; the loop generated %d", n, ran)
	if res.finish[0] != FinishStop || res.usage.CompletionTokens != n || n > 20 {
		t.Fatalf("%d tokens (%s), usage %d", n, res.finish[0], res.usage.CompletionTokens)
	}
	if ran > uint64(n)+40 {
		t.Errorf("the loop generated %d tokens for a completion stopped after %d", ran, n)
	}
	mustNoLeak(t, es)
}
