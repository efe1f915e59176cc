package main

import (
	"encoding/json"
	"encoding/xml"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestEvalCommand: pagoda eval on the built-in model prints the table and
// JSON whose exact configuration is lossless, writes the CSV, and refuses
// bad configurations naming the flag.
func TestEvalCommand(t *testing.T) {
	text := "--text=Once upon a time, there was a little girl named Lily. She loved to play outside in the sun."
	code, stdout, stderr := pagoda(t, "eval", "--threads", "1", text, "--kv", "f32,kivi2:r=0", "--kv", "bf16", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var rep struct {
		Tokens  int
		Results []struct {
			Name    string
			KLMean  float64 `json:"kl_mean"`
			Top1    float64
			PPL     float64
			BytesPT float64 `json:"bytes_per_token"`
		}
	}
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("%v\n%s", err, stdout)
	}
	if len(rep.Results) != 3 || rep.Results[0].Name != "f32" || rep.Results[0].KLMean != 0 || rep.Results[0].Top1 != 1 ||
		rep.Results[1].Name != "kivi2:r=0" || rep.Results[2].Name != "bf16" || rep.Results[2].BytesPT*2 != rep.Results[0].BytesPT {
		t.Errorf("results: %+v", rep.Results)
	}
	csvPath := filepath.Join(t.TempDir(), "out.csv")
	code, stdout, stderr = pagoda(t, "eval", "--threads", "1", text, "--kv", "f16", "--csv", csvPath)
	if code != 0 || !strings.Contains(stdout, "KL mean") || !strings.Contains(stdout, "f16") {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	if b, err := os.ReadFile(csvPath); err != nil || !strings.HasPrefix(string(b), "config,k_format") || strings.Count(string(b), "\n") != 2 {
		t.Errorf("csv: %q %v", b, err)
	}
	for _, c := range []struct{ kv, want string }{
		{"q9_0", "--kv q9_0"},
		{"kivi2:r=40", "not a multiple of the group"},
		{"q8_0", "--kv q8_0: kvcache: q8_0 needs head dims that are multiples of 32, not 8"},
	} {
		code, _, stderr := pagoda(t, "eval", text, "--kv", c.kv)
		if code != 1 || !strings.Contains(stderr, c.want) {
			t.Errorf("--kv %s: exit %d, stderr %q", c.kv, code, stderr)
		}
	}
}

// TestKVDTypeFlags: score on a paged f32 cache gives the flat cache's
// perplexity, a 2-bit KIVI cache a different one; bench runs at a depth
// on a quantized cache; a format the model cannot store is refused
// naming the flag.
func TestKVDTypeFlags(t *testing.T) {
	text := "--text=Once upon a time, there was a little girl named Lily. She loved to play outside in the sun. One day, she saw a big dog."
	ppl := func(args ...string) string {
		t.Helper()
		code, stdout, stderr := pagoda(t, append([]string{"score", "--threads", "1", text}, args...)...)
		if code != 0 {
			t.Fatalf("score %v: exit %d: %s", args, code, stderr)
		}
		i := strings.LastIndex(stdout, "perplexity ")
		if i < 0 {
			t.Fatalf("no perplexity in %q", stdout)
		}
		return strings.TrimSpace(stdout[i:])
	}
	flat, paged, kivi := ppl(), ppl("--kv-dtype", "f32"), ppl("--kv-dtype", "kivi2:g=16,r=0")
	if flat != paged || kivi == flat {
		t.Errorf("flat %s, paged f32 %s, kivi2 %s", flat, paged, kivi)
	}
	code, _, stderr := pagoda(t, "score", text, "--kv-dtype-k", "q4_0")
	if code != 1 || !strings.Contains(stderr, "--kv-dtype K q4_0 V f16: kvcache: q4_0 needs head dims that are multiples of 32") {
		t.Errorf("q4_0 keys on head dim 8: exit %d, %s", code, stderr)
	}
	m := filepath.Join(t.TempDir(), "m.gguf")
	if code, _, stderr := pagoda(t, "synth", "-o", m, "-preset", "tiny"); code != 0 {
		t.Skipf("synth: %s", stderr)
	}
	code, stdout, stderr := pagoda(t, "bench", "-m", m, "-t", "1", "-r", "1", "-p", "0", "-n", "4", "-d", "64", "--kv-dtype", "kivi4:g=16,r=16", "--json")
	if code != 0 || !strings.Contains(stdout, `"test": "tg4 @ d64"`) {
		t.Errorf("bench at depth: exit %d\n%s\n%s", code, stdout, stderr)
	}
}

// TestEvalPlots: a prompt pass reaches SnapKV (the full cache is exact,
// a small capacity loses something), and every plot and the Markdown
// table are written; a prompt that leaves nothing to measure is refused.
func TestEvalPlots(t *testing.T) {
	text := "--text=Once upon a time, there was a little girl named Lily. She loved to play outside in the sun. One day, she saw a big dog in the park."
	dir := t.TempDir()
	file := func(name string) string { return filepath.Join(dir, name) }
	code, stdout, stderr := pagoda(t, "eval", "--threads", "1", text, "--prefill", "24", "--sink-mass", "4",
		"--kv", "f32,snapkv:capacity=8,window=4,snapkv:capacity=64", "--json",
		"--svg-budget", file("b.svg"), "--svg-saved", file("s.svg"), "--curve", file("c.svg"), "--curve-bin", "4", "--md", file("t.md"))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var rep struct {
		Prefill int
		Sinks   struct{ Mass []float64 }
		Results []struct {
			Name   string
			KLMean float64 `json:"kl_mean"`
			Budget int
		}
	}
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("%v\n%s", err, stdout)
	}
	if rep.Prefill != 24 || len(rep.Sinks.Mass) == 0 || len(rep.Results) != 3 || rep.Results[0].KLMean != 0 ||
		!(rep.Results[1].KLMean > 0) || rep.Results[1].Budget != 8 || rep.Results[2].KLMean != 0 {
		t.Errorf("report: %+v", rep)
	}
	for _, f := range []string{"b.svg", "s.svg", "c.svg"} {
		b, err := os.ReadFile(file(f))
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			G []struct{} `xml:"g"`
		}
		if err := xml.Unmarshal(b, &doc); err != nil || len(doc.G) == 0 {
			t.Errorf("%s: %v, %d series", f, err, len(doc.G))
		}
	}
	if b, err := os.ReadFile(file("t.md")); err != nil || !strings.Contains(string(b), "| snapkv:capacity=8,window=4 |") || !strings.Contains(string(b), "saved %") {
		t.Errorf("markdown: %q %v", b, err)
	}
	code, _, stderr = pagoda(t, "eval", text, "--kv", "f16", "--prefill", "500")
	if code != 1 || !strings.Contains(stderr, "leaves nothing to measure") {
		t.Errorf("--prefill 500: exit %d, %q", code, stderr)
	}
}

// TestEvalHardening (issue 24, item 4): the default run works on the
// built-in model, skipping with a note the default formats its head width
// 8 cannot store; input and flag checks come before the model and before
// any output file; --segment 1, two inputs, a configuration that sets a
// format twice or is listed twice are refused; a configuration of two
// items with settings is not cut at a comma inside it; a bad KIVI setting
// is named; a CSV path that cannot be written fails before the model
// loads, and a failed run leaves no CSV behind.
func TestEvalHardening(t *testing.T) {
	text := "--text=Once upon a time, there was a little girl named Lily."
	code, stdout, stderr := pagoda(t, "eval", "--threads", "1", text)
	if code != 0 || !strings.Contains(stdout, "kivi2") || !strings.Contains(stderr, "skipping q8_0 of the default list") ||
		strings.Contains(stdout, "q8_0") {
		t.Errorf("default run: exit %d\n%s\n%s", code, stdout, stderr)
	}
	dir := t.TempDir()
	txt := filepath.Join(dir, "in.txt")
	if err := os.WriteFile(txt, []byte("Once upon a time"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "give --text, -f or --tokens"},
		{[]string{"--kv", "q8_0"}, "give --text, -f or --tokens"},
		{[]string{text, "--segment", "1"}, "--segment 1: a one-token segment predicts nothing"},
		{[]string{text, "-f", txt}, "--text and -f: give only one"},
		{[]string{"--tokens", "1,403,407", "-f", txt}, "--tokens and -f: give only one"},
		{[]string{text, "--kv", "f16+f32"}, `"f16+f32": f32 sets the K and V formats, which f16 already set`},
		{[]string{text, "--kv", "f16,q4_1", "--kv", "F16"}, `configuration "F16" given twice (also as "f16")`},
		{[]string{text, "--kv", "kivi2:r=-1"}, `r="-1" must be a whole number in [0, 1048576] (recent tokens kept in f16)`},
		{[]string{text, "--kv", "f16", "--csv", filepath.Join(dir, "no", "such", "dir.csv")}, "no such file or directory"},
	} {
		code, stdout, stderr := pagoda(t, append([]string{"eval", "--threads", "1"}, c.args...)...)
		if code != 1 || !strings.Contains(stderr, c.want) || stdout != "" || strings.Contains(stderr, "built-in") {
			t.Errorf("eval %q: exit %d, want 1 with %q before the model loads\nstdout %q\nstderr %q", c.args, code, c.want, stdout, stderr)
		}
	}
	csvPath := filepath.Join(dir, "out.csv")
	if code, _, stderr := pagoda(t, "eval", "--threads", "1", text, "--kv", "q8_0", "--csv", csvPath); code != 1 || !strings.Contains(stderr, "multiples of 32") {
		t.Errorf("q8_0 on head width 8: exit %d, %s", code, stderr)
	}
	if _, err := os.Stat(csvPath); !os.IsNotExist(err) {
		t.Errorf("a failed run left %s behind (%v)", csvPath, err)
	}
	code, stdout, stderr = pagoda(t, "eval", "--threads", "1", text, "--kv", "streaming:sinks=4,window=8+f16", "--json", "--csv", csvPath)
	var rep struct {
		Results []struct {
			Name    string
			KFormat string `json:"k_format"`
			Budget  int
			KLMean  float64 `json:"kl_mean"`
		}
	}
	if err := json.Unmarshal([]byte(stdout), &rep); code != 0 || err != nil {
		t.Fatalf("exit %d, %v\n%s\n%s", code, err, stdout, stderr)
	}
	if r := rep.Results; len(r) != 1 || r[0].Name != "streaming:sinks=4,window=8+f16" || r[0].KFormat != "f16" || r[0].Budget != 12 || !(r[0].KLMean > 0) {
		t.Errorf("results: %+v", r)
	}
	if b, err := os.ReadFile(csvPath); err != nil || !strings.Contains(string(b), `"streaming:sinks=4,window=8+f16",f16,f16`) {
		t.Errorf("csv: %q %v", b, err)
	}
}

// TestEvalBOSSegments: --bos lays the tokens out as segments that each
// start with BOS (a leading BOS not doubled): the same report as those
// segments given explicitly.
func TestEvalBOSSegments(t *testing.T) {
	if got, want := bosSegments([]int32{1, 10, 11, 12, 13, 14, 15, 16}, 1, 4), []int32{1, 10, 11, 12, 1, 13, 14, 15, 1, 16}; !slices.Equal(got, want) {
		t.Fatalf("bosSegments: %v, want %v", got, want)
	}
	type report struct {
		Tokens, Segments int
		Results          []struct{ PPL float64 }
	}
	run := func(args ...string) report {
		t.Helper()
		code, stdout, stderr := pagoda(t, append([]string{"eval", "--threads", "1", "--kv", "f32", "--json", "--segment", "4"}, args...)...)
		if code != 0 {
			t.Fatalf("eval %v: exit %d: %s", args, code, stderr)
		}
		var r report
		if err := json.Unmarshal([]byte(stdout), &r); err != nil {
			t.Fatalf("%v\n%s", err, stdout)
		}
		return r
	}
	got := run("--tokens", "1,403,407,261,300,351,280,290", "--bos")
	want := run("--tokens", "1,403,407,261,1,300,351,280,1,290")
	if got.Tokens != 10 || got.Segments != 3 || len(got.Results) == 0 || got.Results[0].PPL != want.Results[0].PPL {
		t.Errorf("--bos: %+v; the explicit BOS segments: %+v", got, want)
	}
	if plain := run("--tokens", "1,403,407,261,300,351,280,290"); plain.Results[0].PPL == got.Results[0].PPL {
		t.Errorf("--bos changed nothing: ppl %v both ways", plain.Results[0].PPL)
	}
}
