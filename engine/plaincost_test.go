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
// speculate, paid on every step.
//
//	go test ./engine -run '^$' -bench SpecPlainSteps -benchtime 3x
//	PAGODA_BENCH_MODEL=kjv go test ./engine -run '^$' -bench SpecPlainSteps -benchtime 3x
func BenchmarkSpecPlainSteps(b *testing.B) {
	m, path, ep, mp := plainCostModel(b)
	tok := m.Tokenizer()
	var prompts [][]int32
	for i := range 8 {
		p := tok.Encode(fmt.Sprintf("And it came to pass in the %d day, that the", i+1), tokenizer.Options{AddSpecial: true})
		prompts = append(prompts, p)
	}
	for _, kind := range []string{"none", "eagle", "medusa"} {
		b.Run(kind, func(b *testing.B) {
			var p spec.Proposer
			switch kind {
			case "eagle":
				d, err := eagle.Load(ep, m, path)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(d.Close)
				p = d.Proposer(eagle.ProposerOptions{})
			case "medusa":
				h, err := medusa.Load(mp, m, path)
				if err != nil {
					b.Fatal(err)
				}
				p = h.Proposer(medusa.ProposerOptions{})
			}
			cfg := modelConfig(m)
			cfg.KVBlocks = 256
			cfg.Spec = SpecConfig{Proposer: p, Tokens: 4}
			var toks, cpu float64
			for range b.N {
				e, err := New(m, tok, cfg)
				if err != nil {
					b.Fatal(err)
				}
				if p != nil {
					e.ctl = newSpecCtl(cfg.Spec.Control, ladderFor(p, e.trees, e.specMax), e.specMax)
					e.ctl.probes = 1 << 40 // no trials: every step plain
				}
				e.Start()
				var reqs []*Request
				for i, pr := range prompts {
					reqs = append(reqs, &Request{ID: fmt.Sprint(i), Prompt: pr, MaxTokens: 160, IgnoreEOS: true})
				}
				c0 := cpuSeconds()
				got := runAllB(b, e, reqs)
				cpu += cpuSeconds() - c0
				e.Stop(context.Background())
				for _, g := range got {
					toks += float64(len(g))
				}
				if e.specSteps != 0 {
					b.Fatalf("%d speculative steps", e.specSteps)
				}
			}
			b.ReportMetric(cpu/toks*1e6, "cpu-us/tok")
		})
	}
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
