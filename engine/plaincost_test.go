package engine

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"testing"

	"pagoda/eagle"
	"pagoda/medusa"
	"pagoda/model"
	"pagoda/spec"
	"pagoda/testutil"
	"pagoda/tokenizer"
)

// cpuSeconds is the process's user+system CPU time.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime)
}

// plainCostModel opens the model BenchmarkSpecPlainSteps decodes with,
// one thread: the KJV model when PAGODA_BENCH_MODEL=kjv, else stories260K.
func plainCostModel(b *testing.B) (m *model.Model, path, eaglePath, medusaPath string) {
	path, eaglePath, medusaPath = testutil.Shared(b, "models/gguf/stories260K.gguf"), "../models/stories260K.eagle.gguf", "../models/stories260K.medusa.gguf"
	if os.Getenv("PAGODA_BENCH_MODEL") == "kjv" {
		path, eaglePath, medusaPath = "../models/kjv3m.q8_0.gguf", "../models/kjv3m.eagle.gguf", "../models/kjv3m.medusa.gguf"
	}
	m, err := model.Open(path, model.Options{Threads: 1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	return m, path, eaglePath, medusaPath
}

// BenchmarkSpecPlainSteps is the CPU a speculating engine spends per
// output token while its controller keeps every step plain (no trials),
// against an engine without a proposer: 8 greedy sequences in flight.
// What the speculating engine costs more is the price of being able to
// speculate, paid on every step. Each of the b.N repetitions runs the
// three engines back to back, and the ratios reported are the medians of
// each repetition's ratio to the engine without a proposer, so that what
// other jobs on the machine do to the CPU time drifts out.
//
//	go test ./engine -run '^$' -bench SpecPlainSteps -benchtime 20x
//	PAGODA_BENCH_MODEL=kjv go test ./engine -run '^$' -bench SpecPlainSteps -benchtime 20x
func BenchmarkSpecPlainSteps(b *testing.B) {
	m, path, ep, mp := plainCostModel(b)
	tok := m.Tokenizer()
	var prompts [][]int32
	for i := range 8 {
		prompts = append(prompts, tok.Encode(fmt.Sprintf("And it came to pass in the %d day, that the", i+1), tokenizer.Options{AddSpecial: true}))
	}
	d, err := eagle.Load(ep, m, path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(d.Close)
	h, err := medusa.Load(mp, m, path)
	if err != nil {
		b.Fatal(err)
	}
	kinds := []spec.Proposer{nil, d.Proposer(eagle.ProposerOptions{}), h.Proposer(medusa.ProposerOptions{})}
	var abs []float64
	ratios := make([][]float64, len(kinds))
	for range b.N {
		var cpt [3]float64
		for k, p := range kinds {
			cpt[k] = plainCPUPerToken(b, m, tok, p, prompts)
		}
		abs = append(abs, cpt[0])
		for k := range kinds {
			ratios[k] = append(ratios[k], cpt[k]/cpt[0])
		}
	}
	b.ReportMetric(median(abs)*1e6, "cpu-us/tok")
	b.ReportMetric(median(ratios[1]), "eagle/plain")
	b.ReportMetric(median(ratios[2]), "medusa/plain")
}

// plainCPUPerToken runs prompts to 160 tokens each on a fresh engine with
// proposer p (nil: none), its controller held on plain, and returns the
// process's CPU seconds per output token.
func plainCPUPerToken(b *testing.B, m *model.Model, tok tokenizer.Tokenizer, p spec.Proposer, prompts [][]int32) float64 {
	cfg := modelConfig(m)
	cfg.KVBlocks = 256
	cfg.Spec = SpecConfig{Proposer: p, Tokens: 4}
	e, err := New(m, tok, cfg)
	if err != nil {
		b.Fatal(err)
	}
	if p != nil {
		e.ctl = newSpecCtl(cfg.Spec.Control, ladderFor(p, e.trees, e.specMax), e.specMax)
		e.ctl.probes = 1 << 40 // no trials: every step plain
	}
	e.Start()
	defer e.Stop(context.Background())
	var reqs []*Request
	for i, pr := range prompts {
		reqs = append(reqs, &Request{ID: fmt.Sprint(i), Prompt: pr, MaxTokens: 160, IgnoreEOS: true})
	}
	c0 := cpuSeconds()
	got := runAllB(b, e, reqs)
	cpu := cpuSeconds() - c0
	toks := 0
	for _, g := range got {
		toks += len(g)
	}
	if e.specSteps != 0 {
		b.Fatalf("%d speculative steps", e.specSteps)
	}
	return cpu / float64(toks)
}

// runAllB submits reqs at once and returns each one's output tokens.
func runAllB(b *testing.B, e *Engine, reqs []*Request) [][]int32 {
	out := make([][]int32, len(reqs))
	done := make(chan int)
	for i, r := range reqs {
		ch, err := e.Submit(context.Background(), r)
		if err != nil {
			b.Fatal(err)
		}
		go func() {
			for ev := range ch {
				if !ev.Prompt {
					out[i] = append(out[i], ev.Tokens...)
				}
			}
			done <- i
		}()
	}
	for range reqs {
		<-done
	}
	return out
}
