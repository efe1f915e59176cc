package main

import (
	"bytes"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"pagoda/bench"
)

func TestSummarize(t *testing.T) {
	if s := summarize([]float64{3, 1, 2}); s != (stat{2, 1, 3}) {
		t.Fatalf("odd: %+v", s)
	}
	if s := summarize([]float64{4, 1, 2, 3}); s != (stat{2.5, 1, 4}) {
		t.Fatalf("even: %+v", s)
	}
}

func TestReport(t *testing.T) {
	o := options{models: []string{"/x/tl.gguf"}, concs: []int{8}, prompts: 4, in: 16, out: 16, threads: 2, rounds: 2}
	res := map[cell][]*bench.Result{
		{"/x/tl.gguf", 8, "llama-server"}: {{OutputThroughput: 40, MeanTTFT: 900, MeanTPOT: 100, Failed: 1}, {OutputThroughput: 60, MeanTTFT: 700, MeanTPOT: 80}},
		{"/x/tl.gguf", 8, "pagoda"}:       {{OutputThroughput: 150, MeanTTFT: 300, MeanTPOT: 40}, {OutputThroughput: 150, MeanTTFT: 500, MeanTPOT: 50}},
	}
	gens := map[cell][]float64{
		{"/x/tl.gguf", 8, "llama-server"}: {50, 60},
		{"/x/tl.gguf", 8, "pagoda"}:       {150, 150},
	}
	var b bytes.Buffer
	report(&b, o, res, gens)
	for _, want := range []string{
		"| tl.gguf | 8 | llama-server | 50.0 [40.0–60.0] | 800.0 [700.0–900.0] | 90.0 [80.0–100.0] | 1 |  | 55.0 [50.0–60.0] |  |",
		"| tl.gguf | 8 | pagoda | 150.0 [150.0–150.0] | 400.0 [300.0–500.0] | 45.0 [40.0–50.0] | 0 | 3.00 | 150.0 [150.0–150.0] | 2.73 |",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("missing %q in\n%s", want, b.String())
		}
	}
}

func TestBadArgs(t *testing.T) {
	fake := filepath.Join(t.TempDir(), "llama-server")
	os.WriteFile(fake, []byte("#!/bin/sh\n"), 0o755)
	for _, args := range [][]string{
		{},
		{"-llama", fake},
		{"-llama", fake, "-m", "a.gguf", "-c", "0"},
		{"-llama", fake, "-m", "a.gguf", "-c", "x"},
		{"-llama", fake, "-m", "a.gguf", "-ctx", "100"},
		{"-llama", "/nonexistent", "-m", "a.gguf"},
	} {
		if err := run(args, io.Discard, io.Discard); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}

// TestReportUnknownGenerated: a run whose generated count is unknown (NaN)
// leaves the column and its ratio empty.
func TestReportUnknownGenerated(t *testing.T) {
	o := options{models: []string{"/x/tl.gguf"}, concs: []int{8}, prompts: 4, in: 16, out: 16, threads: 2, rounds: 1}
	res := map[cell][]*bench.Result{
		{"/x/tl.gguf", 8, "llama-server"}: {{OutputThroughput: 40, Failed: 2}},
		{"/x/tl.gguf", 8, "pagoda"}:       {{OutputThroughput: 150}},
	}
	gens := map[cell][]float64{{"/x/tl.gguf", 8, "llama-server"}: {math.NaN()}, {"/x/tl.gguf", 8, "pagoda"}: {150}}
	var b bytes.Buffer
	report(&b, o, res, gens)
	if want := "| 0 | 3.75 | 150.0 [150.0–150.0] |  |"; !strings.Contains(b.String(), want) {
		t.Errorf("missing %q in\n%s", want, b.String())
	}
}

// TestLogGenerated: every stopped slot after the client's test request
// counts its generated tokens (n_tokens less the prompt, plus one), a
// request cut short as much as it got.
func TestLogGenerated(t *testing.T) {
	log := filepath.Join(t.TempDir(), "l.log")
	os.WriteFile(log, []byte(`0.01.000.000 I slot release: id 0 | task 0 | stop processing: n_tokens = 20, truncated = 0
0.02.000.000 W common_chat_peg_parse: unparsed Content-only output: abc\xff
0.03.000.000 I slot release: id 1 | task 2 | stop processing: n_tokens = 255, truncated = 0
0.03.100.000 I slot release: id 2 | task 3 | stop processing: n_tokens = 139, truncated = 0
`), 0o644)
	n, err := logGenerated(log, 128)
	if err != nil || n != 128+12 {
		t.Fatalf("%d tokens (%v), want 140", n, err)
	}
	os.WriteFile(log, []byte("no stops\n"), 0o644)
	if _, err := logGenerated(log, 128); err == nil {
		t.Error("a log without slot stops gave a count")
	}
}
