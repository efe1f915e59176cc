package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fake writes an executable that appends its name to log and prints out.
func fake(t *testing.T, dir, name, log, out string) string {
	p := filepath.Join(dir, name)
	script := "#!/bin/sh\necho " + name + " >> " + log + "\ncat <<'JSON'\n" + out + "\nJSON\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestInterleavedRatios(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "order")
	lb := fake(t, dir, "llama-bench", log, `[{"build_commit":"abc123","n_prompt":512,"n_gen":0,"samples_ts":[100,110]},
 {"build_commit":"abc123","n_prompt":0,"n_gen":128,"samples_ts":[20,22]}]`)
	pg := fake(t, dir, "pagoda", log, `[{"test":"pp512","samples_ts":[200,220],"commit":"def456"},
 {"test":"tg128","samples_ts":[30,33],"commit":"def456"}]`)
	model := filepath.Join(dir, "m.gguf")
	var out, errs bytes.Buffer
	if err := run([]string{"-llama", lb, "-pagoda", pg, "-m", model, "-rounds", "2"}, &out, &errs); err != nil {
		t.Fatal(err, errs.String())
	}
	order, _ := os.ReadFile(log)
	if got := strings.Fields(string(order)); strings.Join(got, " ") != "llama-bench pagoda pagoda llama-bench" {
		t.Fatalf("runs not interleaved: %v", got)
	}
	s := out.String()
	for _, want := range []string{"| m.gguf | pp512 | 105.00 [100.00–110.00] n=4 | 210.00 [200.00–220.00] n=4 | 2.00 |",
		"| m.gguf | tg128 | 21.00 [20.00–22.00] n=4 | 31.50 [30.00–33.00] n=4 | 1.50 |", "llama.cpp abc123, pagoda def456"} {
		if !strings.Contains(s, want) {
			t.Errorf("report lacks %q:\n%s", want, s)
		}
	}
}

func TestBadPeerOutput(t *testing.T) {
	dir := t.TempDir()
	lb := fake(t, dir, "llama-bench", filepath.Join(dir, "log"), `not json`)
	pg := fake(t, dir, "pagoda", filepath.Join(dir, "log"), `[]`)
	var out, errs bytes.Buffer
	err := run([]string{"-llama", lb, "-pagoda", pg, "-m", "x.gguf", "-rounds", "1"}, &out, &errs)
	if err == nil || !strings.Contains(err.Error(), "llama-bench's JSON") {
		t.Fatalf("got %v", err)
	}
	if err := run([]string{"-m", "x.gguf"}, &out, &errs); err == nil {
		t.Fatal("missing -llama accepted")
	}
}
