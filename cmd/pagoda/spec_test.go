package main

import (
	"path/filepath"
	"strings"
	"testing"

	"pagoda/testutil"
)

// TestRunSpeculative: run --spec ngram and --draft give the greedy story
// of plain run and report the acceptance; a draft with another vocabulary
// and a draft method without a draft are refused with clear errors.
func TestRunSpeculative(t *testing.T) {
	src := testutil.Shared(t, "models/gguf/stories260K.gguf")
	dir := t.TempDir()
	q4 := filepath.Join(dir, "q4.gguf")
	if code, _, errOut := pagoda(t, "quantize", src, q4, "-type", "Q4_0", "-pure"); code != 0 {
		t.Fatalf("quantize: %s", errOut)
	}
	base := []string{"run", "-m", src, "-p", "Once upon a time", "-n", "40", "--temp", "0"}
	code, want, errOut := pagoda(t, base...)
	if code != 0 {
		t.Fatalf("plain run: %s", errOut)
	}
	for _, extra := range [][]string{{"--spec", "ngram", "--spec-ngram-min", "1"}, {"--draft", q4}, {"--draft", q4, "--spec-tokens", "6", "--spec-fixed"}} {
		code, out, errOut := pagoda(t, append(base, extra...)...)
		if code != 0 || out != want {
			t.Fatalf("%v: exit %d\n%q\nwant %q\n%s", extra, code, out, want, errOut)
		}
		if !strings.Contains(errOut, "spec (") || !strings.Contains(errOut, "accepted") && !strings.Contains(errOut, "no drafts") {
			t.Errorf("%v: no acceptance summary: %q", extra, errOut)
		}
	}
	tiny := filepath.Join(dir, "tiny.gguf")
	if code, _, errOut := pagoda(t, "synth", "-preset", "tiny", "-o", tiny); code != 0 {
		t.Fatalf("synth: %s", errOut)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--draft", tiny}, "spec: draft"},
		{[]string{"--spec-method", "draft"}, "needs --draft"},
		{[]string{"--spec", "medusa"}, "needs --heads FILE"},
		{[]string{"--spec", "lookahead"}, "want ngram, draft, medusa or eagle"},
		{[]string{"--spec", "eagle", "--heads", "no-such-file.gguf"}, "--heads"},
	} {
		code, _, errOut := pagoda(t, append(base, c.args...)...)
		if code == 0 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q, want %q", c.args, code, errOut, c.want)
		}
	}
}

// TestSpecRefusals (issue 24, item 7): --spec-p-min outside [0, 1] and
// --spec-tokens past the maximum are refused naming the range; a draft
// of another vocabulary is refused from its vocabulary alone, before its
// weights load: a vocabulary-only GGUF (no weights at all) gets the
// vocabulary error, not a load error, as does a synthetic model.
func TestSpecRefusals(t *testing.T) {
	src := testutil.Shared(t, "models/gguf/stories260K.gguf")
	vocabOnly := testutil.Shared(t, "models/llama.cpp-vocab/ggml-vocab-llama-spm.gguf")
	tiny := filepath.Join(t.TempDir(), "tiny.gguf")
	if code, _, errOut := pagoda(t, "synth", "-preset", "tiny", "-o", tiny); code != 0 {
		t.Fatalf("synth: %s", errOut)
	}
	base := []string{"run", "-m", src, "-p", "Once upon a time", "-n", "4", "--temp", "0"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--spec-p-min", "5", "--draft", src}, "-spec-p-min 5 is out of range: must be 0 to 1"},
		{[]string{"--spec-p-min", "-1"}, "-spec-p-min -1 is out of range: must be 0 to 1"},
		{[]string{"--spec-tokens", "65", "--spec", "ngram"}, "-spec-tokens 65 is out of range: must be 1 to 64"},
		{[]string{"--draft", vocabOnly}, "differ by more than"},
		{[]string{"--draft", vocabOnly}, "checked from its vocabulary, before loading it"},
		{[]string{"--draft", tiny}, "checked from its vocabulary, before loading it"},
	} {
		code, out, errOut := pagoda(t, append(base, c.args...)...)
		if code != 1 || out != "" || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q, want %q", c.args, code, out, errOut, c.want)
		}
	}
}

// TestMetricsAuthNeedsKey: --metrics-auth without a key to require is
// refused at start, not a server that silently guards nothing.
func TestMetricsAuthNeedsKey(t *testing.T) {
	code, _, errOut := pagodaEnv(t, []string{"PAGODA_API_KEY="}, "serve", "--metrics-auth", "--port", "0")
	if code != 1 || !strings.Contains(errOut, "--metrics-auth needs --api-key") {
		t.Errorf("exit %d, %q", code, errOut)
	}
}
