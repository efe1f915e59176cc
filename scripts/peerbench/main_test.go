package main

import (
	"bytes"
	"os"
	"os/exec"
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

// TestLoadLevels: each -load level runs with that many competing
// processes alive (the fake engines count them), their results are kept
// apart, and the share-of-quiet table compares each engine to itself.
func TestLoadLevels(t *testing.T) {
	if _, err := exec.LookPath("pgrep"); err != nil {
		t.Skip("pgrep (procps) is needed to count the competing processes")
	}
	dir := t.TempDir()
	log := filepath.Join(dir, "order")
	// Each fake reports tg64 = 40 quiet, 10 per competing shell loop fewer.
	script := func(name, json string) string {
		p := filepath.Join(dir, name)
		s := "#!/bin/sh\nn=$(pgrep -P $PPID -f 'while :; do :; done' | wc -l)\necho \"" + name + " $n\" >> " + log + "\n" +
			"v=$((40 - 10*n))\nprintf '" + json + "' $v $v\n"
		if err := os.WriteFile(p, []byte(s), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	lb := script("llama-bench", `[{"build_commit":"abc","n_prompt":0,"n_gen":64,"samples_ts":[%d,%d]}]`)
	pg := script("pagoda", `[{"test":"tg64","samples_ts":[%d,%d],"commit":"def"}]`)
	var out, errs bytes.Buffer
	if err := run([]string{"-llama", lb, "-pagoda", pg, "-m", filepath.Join(dir, "m.gguf"), "-p", "0", "-n", "64", "-rounds", "1", "-load", "0,2"}, &out, &errs); err != nil {
		t.Fatal(err, errs.String())
	}
	order, _ := os.ReadFile(log)
	if got := strings.Join(strings.Fields(string(order)), " "); got != "llama-bench 0 pagoda 0 llama-bench 2 pagoda 2" {
		t.Fatalf("competing processes per run: %q", got)
	}
	s := out.String()
	for _, want := range []string{"| m.gguf | tg64 load2 | 20.00", "| m.gguf | tg64 | 2 | 50 % | 50 % | 1.00 |"} {
		if !strings.Contains(s, want) {
			t.Errorf("report lacks %q:\n%s", want, s)
		}
	}
	if _, err := parseLoads("0,-1"); err == nil {
		t.Error("-load -1 accepted")
	}
	if _, err := parseLoads("1,1"); err == nil {
		t.Error("-load 1,1 accepted")
	}
}
