package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"pagoda/testutil"
)

// bin is the pagoda binary TestMain builds once, so the tests see exit
// codes and output as a user does.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "pagoda-cli-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "pagoda")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building pagoda: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// pagoda runs the binary and returns its exit code, stdout and stderr.
func pagoda(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return pagodaEnv(t, nil, args...)
}

// pagodaEnv is pagoda with extra environment variables.
func pagodaEnv(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = t.TempDir() // a command that wrongly runs writes nothing here
	// No model is ever written to the user's cache by a test.
	cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+t.TempDir(), "HOME="+t.TempDir())
	cmd.Env = append(cmd.Env, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, stdout.String(), stderr.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), stdout.String(), stderr.String()
	}
	t.Fatalf("pagoda %v: %v", args, err)
	return 0, "", ""
}

func TestHelpExitsZero(t *testing.T) {
	names := []string{"bench serve"}
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		for _, h := range []string{"-h", "--help"} {
			args := append(strings.Fields(n), h)
			code, _, stderr := pagoda(t, args...)
			if code != 0 || !strings.Contains(stderr, "Usage of") || strings.Contains(stderr, "help requested") {
				t.Errorf("pagoda %s: exit %d, stderr:\n%s", strings.Join(args, " "), code, stderr)
			}
		}
	}
}

func TestFlagRanges(t *testing.T) {
	for _, c := range []struct {
		args string
		want string // in stderr
	}{
		{"run -n -5", "-n -5 is out of range: must be ≥ 0"},
		{"run --ctx -5", "-ctx -5 is out of range"},
		{"run --threads -4", "-threads -4 is out of range"},
		{"run --top-logprobs -3", "-top-logprobs -3 is out of range: must be 0 to 20"},
		{"run --top-k -1", "-top-k -1 is out of range"},
		{"serve -m x.gguf --max-num-seqs 0", "-max-num-seqs 0 is out of range: must be 1 to"},
		{"serve -m x.gguf --block-size 0", "-block-size 0 is out of range: must be 1 to 1024"},
		{"serve -m x.gguf --grace -5s", "-grace -5s is out of range: must be ≥ 0s"},
		{"serve -m x.gguf --port 70000", "-port 70000 is out of range: must be 0 to 65535"},
		{"serve -m x.gguf --kv-cache-fraction 0", "-kv-cache-fraction 0 is out of range"},
		{"serve -m x.gguf --max-num-batched-tokens -1", "-max-num-batched-tokens -1 is out of range"},
		{"quantize in out -type Q8_0 --threads -4", "-threads -4 is out of range"},
		{"bench -m x -r 0", "-r 0 is out of range"},
		{"bench serve --num-prompts 0", "-num-prompts 0 is out of range"},
		{"kv-size -shape llama-2-7b -batch 0", "-batch 0 is out of range: must be ≥ 1"},
		{"score -m x --threads -1", "-threads -1 is out of range"},
		{"synth -o x -layers -1", "-layers -1 is out of range"},
	} {
		code, _, stderr := pagoda(t, strings.Fields(c.args)...)
		if code != 1 || !strings.Contains(stderr, c.want) {
			t.Errorf("pagoda %s: exit %d, want 1 and %q in stderr:\n%s", c.args, code, c.want, stderr)
		}
	}
}

func TestFlagHelpShowsRange(t *testing.T) {
	_, _, stderr := pagoda(t, "serve", "-h")
	if !strings.Contains(stderr, "tokens per KV block (1 to 1024)") {
		t.Errorf("serve -h does not give the --block-size range:\n%s", stderr)
	}
}

func TestKVSizeOverflow(t *testing.T) {
	code, stdout, stderr := pagoda(t, "kv-size", "-shape", "llama-2-70b", "-batch", "999999999999", "-len", "999999999999")
	if code != 1 || !strings.Contains(stderr, "overflows") || strings.Contains(stdout, "-") {
		t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	code, stdout, _ = pagoda(t, "kv-size", "-shape", "llama-2-70b", "-batch", "8", "-len", "4096")
	if code != 0 || !strings.Contains(stdout, "10737418240 bytes") {
		t.Errorf("exit %d, stdout:\n%s", code, stdout)
	}
}

func TestServeKVBudgetOverMemory(t *testing.T) {
	if systemMemory() == 0 {
		t.Skip("no memory information on this system")
	}
	// Refused before the model is opened, so the model need not exist.
	code, _, stderr := pagoda(t, "serve", "-m", "missing.gguf", "--kv-cache-memory", "100TiB")
	if code != 1 || !strings.Contains(stderr, "--kv-cache-memory 100TiB") || !strings.Contains(stderr, "memory available") {
		t.Errorf("exit %d, stderr:\n%s", code, stderr)
	}
}

func TestRunPromptTooLongNotEchoed(t *testing.T) {
	shared := os.Getenv("PAGODA_SHARED")
	if shared == "" {
		t.Skip("PAGODA_SHARED not set")
	}
	m := filepath.Join(shared, "models/gguf/stories260K.gguf")
	if _, err := os.Stat(m); err != nil {
		t.Skip(err)
	}
	prompt := "Once upon a time there was a little girl named Lily"
	code, stdout, stderr := pagoda(t, "run", "-m", m, "--ctx", "4", "-p", prompt)
	if code != 1 || strings.Contains(stdout, "little girl") || !strings.Contains(stderr, "context of 4") {
		t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
}

// TestRunBuiltinModel: with no -m, run tells a story from the model built
// into the binary (stories260K's greedy continuation, as llama2.c gives it)
// and says which model that is and how to pick another.
func TestRunBuiltinModel(t *testing.T) {
	code, out, errOut := pagoda(t, "run", "-p", "Once upon a time", "-n", "24", "--temp", "0")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if want := "Once upon a time, there was a little girl named Lily. She loved to play"; !strings.HasPrefix(out, want) {
		t.Errorf("story %q, want it to start %q", out, want)
	}
	if !strings.Contains(errOut, "built-in stories260K") || !strings.Contains(errOut, "-m") {
		t.Errorf("stderr does not name the built-in model and -m: %q", errOut)
	}
}

// quantize reports on stderr in a few plain lines (stderr is no terminal
// here) ending in a summary with the size and time; stdout stays empty.
func TestQuantizeProgressSummary(t *testing.T) {
	in := testutil.Shared(t, "golden/models/g-llama-gqa.F32.gguf")
	out := filepath.Join(t.TempDir(), "out.gguf")
	code, stdout, stderr := pagoda(t, "quantize", in, out, "-type", "Q8_0")
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	if stdout != "" {
		t.Errorf("stdout %q, want nothing", stdout)
	}
	lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
	summary := regexp.MustCompile(`^quantized out\.gguf: \d+ tensors, [0-9.]+ [KM]iB in [0-9.]+m?s \([0-9.]+ [KMG]?i?B/s\)$`)
	if len(lines) < 2 || len(lines) > 5 || lines[0] != "quantizing out.gguf" || !summary.MatchString(lines[len(lines)-1]) {
		t.Errorf("stderr, want a start line, quarters and a summary:\n%s", stderr)
	}
	if strings.Contains(stderr, "\r") {
		t.Errorf("stderr redraws a line though it is no terminal: %q", stderr)
	}
}

// TestNotAModelFile checks that a file or folder that is none of the
// model formats is named as such, with the formats listed.
func TestNotAModelFile(t *testing.T) {
	text := filepath.Join(t.TempDir(), "notes.txt")
	if err := os.WriteFile(text, []byte("root:x:0:0:root:/root:/bin/bash\nthis is a text file, not a model\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ m, want string }{
		{text, text + " is not a model file: Pagoda reads GGUF files (.gguf), llama2.c checkpoints (.bin) and Hugging Face directories"},
		{t.TempDir(), "is not a model directory (no config.json)"},
	} {
		for _, cmd := range [][]string{{"run", "-m", c.m, "-p", "hi"}, {"serve", "-m", c.m, "--port", "0"}, {"inspect", c.m}} {
			code, _, stderr := pagoda(t, cmd...)
			if code != 1 || !strings.Contains(stderr, c.want) {
				t.Errorf("pagoda %v: exit %d, stderr:\n%s", cmd, code, stderr)
			}
		}
	}
}

// TestQuantizeRequantizeNamesFlag checks that quantizing the README's own
// synth output (already Q4_0) names quantize's flag, not a Go field or
// another tool's, and that the flag then works.
func TestQuantizeRequantizeNamesFlag(t *testing.T) {
	dir := t.TempDir()
	in, out := filepath.Join(dir, "tiny.gguf"), filepath.Join(dir, "tiny-q4k.gguf")
	if code, _, stderr := pagoda(t, "synth", "-preset", "tiny", "-type", "Q4_0", "-o", in); code != 0 {
		t.Fatalf("synth: %s", stderr)
	}
	code, _, stderr := pagoda(t, "quantize", in, out, "-type", "Q4_K")
	if code != 1 || !strings.Contains(stderr, "is already quantized") || !strings.Contains(stderr, "pass --allow-requantize") ||
		strings.Contains(stderr, "AllowRequantize") || strings.Contains(stderr, "llama-quantize") {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("a refused quantize left %s: %v", out, err)
	}
	if code, _, stderr := pagoda(t, "quantize", in, out, "-type", "Q4_K", "--allow-requantize"); code != 0 {
		t.Fatalf("with --allow-requantize: exit %d, %s", code, stderr)
	}
}

// TestSynthBERT checks that synth -preset bert writes an encoder that
// embed and serve take as one (the README's stand-in for bge-small.gguf).
func TestSynthBERT(t *testing.T) {
	p := filepath.Join(t.TempDir(), "bge-small.gguf")
	if code, _, stderr := pagoda(t, "synth", "-preset", "bert", "-o", p); code != 0 {
		t.Fatalf("synth: %s", stderr)
	}
	code, stdout, stderr := pagoda(t, "embed", "-m", p, "a text", "another")
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if code != 0 || len(lines) != 2 {
		t.Fatalf("embed: exit %d\n%s\n%s", code, stdout, stderr)
	}
	var e struct{ Embedding []float64 }
	if err := json.Unmarshal([]byte(lines[1]), &e); err != nil || len(e.Embedding) != 64 {
		t.Fatalf("%v: %s", err, lines[1])
	}
	var n float64
	for _, v := range e.Embedding {
		n += v * v
	}
	if math.Abs(n-1) > 1e-4 {
		t.Errorf("embedding's squared norm %v, want 1", n)
	}
}
