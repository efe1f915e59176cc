package main

import (
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"pagoda/model"
	"pagoda/ring"
	"pagoda/testutil"
	"pagoda/tokenizer"
)

// longPrompt is a prompt of about n tokens of the model at path (a story
// repeated with the sentence count in it, so no two stretches are the
// same), and its length.
func longPrompt(t *testing.T, path string, n int) (string, int) {
	t.Helper()
	m, err := model.Open(path, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	words := []string{"one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"}
	var b strings.Builder
	b.WriteString("Once upon a time")
	tok := m.Tokenizer()
	for i := 0; ; i++ {
		ids := tok.Encode(b.String(), tokenizer.Options{AddSpecial: true, ParseSpecial: true})
		if len(ids) >= n {
			return b.String(), len(ids)
		}
		b.WriteString(", there was a little girl named Lily and she had " + words[i%len(words)] + " cats")
	}
}

// TestRunSequenceParallel: `run --sequence-parallel 2` and `3` (worker
// processes on 127.0.0.1, each holding its zigzag share of the prompt's
// keys and values) print what one process prints, greedy, on stories260K
// (a 480-token prompt: 240 / 160 per rank) and the golden GQA llama (900
// tokens: 450 / 300 per rank, GQA 4:1); and for a one-token prompt,
// which leaves rank 1 without rows in the prefill (it still passes its
// blocks around the ring). A 4000-token prompt over 4 ranks (1000 each)
// runs on a synthetic f32 llama (2 layers, GQA 2:1) with a 4200-token
// context.
func TestRunSequenceParallel(t *testing.T) {
	long := filepath.Join(t.TempDir(), "tiny4k.gguf")
	if code, _, stderr := pagoda(t, "synth", "-o", long, "-preset", "tiny", "-ctx", "4200", "-type", "f32"); code != 0 {
		t.Fatalf("synth: %s", stderr)
	}
	for _, c := range []struct {
		path string
		n    int
		ps   []string
	}{
		{filepath.Join(testutil.Shared(t, "models/gguf"), "stories260K.gguf"), 480, []string{"2", "3"}},
		{filepath.Join(testutil.Shared(t, "golden/models"), "g-llama-gqa.F32.gguf"), 900, []string{"2", "3"}},
		{long, 4000, []string{"4"}},
	} {
		prompt, n := longPrompt(t, c.path, c.n)
		for _, p := range []string{prompt, ""} {
			args := []string{"run", "-m", c.path, "-p", p, "-n", "24", "--temp", "0", "--ignore-eos"}
			code, want, stderr := pagoda(t, args...)
			if code != 0 || len(want) <= len(p)+1 {
				t.Fatalf("run: exit %d, printed %q: %s", code, want, stderr)
			}
			for _, P := range c.ps {
				start := time.Now()
				code, got, stderr := pagoda(t, append(args, "--sequence-parallel", P, "--threads", "2")...)
				if code != 0 || got != want {
					t.Errorf("%s, %d-token prompt, --sequence-parallel %s: exit %d, printed\n%q\nwant\n%q\n%s",
						filepath.Base(c.path), n, P, code, tail(got, 200), tail(want, 200), stderr)
				}
				// The prompt went to the ranks in zigzag shares.
				split := zigzagShares(n, P)
				if p == "" {
					split = zigzagShares(1, P)
				}
				if line := "sequence parallel: " + P + " ranks, 1 sequences in 24 steps, the last one's prompt rows by rank " + split; !strings.Contains(stderr, line) {
					t.Errorf("--sequence-parallel %s: stderr lacks %q:\n%s", P, line, stderr)
				}
				t.Logf("%s, %d-token prompt (or one token: %v), --sequence-parallel %s: %v", filepath.Base(c.path), n, p == "", P, time.Since(start).Round(time.Millisecond))
			}
		}
	}
}

// TestServeSequenceParallel: `serve --sequence-parallel 2` answers greedy
// completions as the single-process server does — a 900-token prompt,
// then a short one (the ranks forget the first sequence) — and two
// requests sent at once are served one after the other (the ring holds
// one sequence), both right.
func TestServeSequenceParallel(t *testing.T) {
	if testing.Short() {
		t.Skip("starts four processes")
	}
	path := filepath.Join(testutil.Shared(t, "golden/models"), "g-llama-gqa.F32.gguf")
	long, _ := longPrompt(t, path, 900)
	common := []string{"serve", "-m", path, "--port", "0", "--kv-cache-memory", "8MiB", "--threads", "2"}
	single := startProc(t, servingRe, common...)
	ring := startProc(t, servingRe, append(common, "--sequence-parallel", "2")...)
	prompts := []string{long, "The dog", "Once upon a time"}
	want := make([]string, len(prompts))
	for i, p := range prompts {
		want[i] = complete(t, single, p, 16)
		if got := complete(t, ring, p, 16); got != want[i] {
			t.Errorf("prompt %d: %q, want %q", i, got, want[i])
		}
	}
	var wg sync.WaitGroup
	got := make([]string, 2)
	for i := range got {
		wg.Go(func() { got[i] = complete(t, ring, prompts[1+i], 16) })
	}
	wg.Wait()
	for i, g := range got {
		if g != want[1+i] {
			t.Errorf("concurrent request %d: %q, want %q", i, g, want[1+i])
		}
	}
}

// TestSequenceParallelRefusals: what a sequence-parallel group cannot run
// is refused before serving, naming the reason.
func TestSequenceParallelRefusals(t *testing.T) {
	path := filepath.Join(testutil.Shared(t, "models/gguf"), "stories260K.gguf")
	mla := filepath.Join(testutil.Shared(t, "golden/models"), "g-deepseek2.Q8_0.gguf")
	run := []string{"run", "-m", path, "-p", "Hi", "-n", "4", "--sequence-parallel", "2"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{append(run, "--tensor-parallel", "2"), "does not combine with --tensor-parallel or --pipeline-parallel"},
		{append(run, "--pipeline-parallel", "2"), "does not combine with --tensor-parallel or --pipeline-parallel"},
		{append(run, "--kv-dtype", "q8_0"), "--kv-dtype q8_0: the ranks keep their keys and values in f32"},
		{append(run, "--kv-policy", "h2o:256"), "KV policies are not supported"},
		{append(run, "--spec", "ngram"), "speculative decoding (--spec/--draft) is not supported"},
		{append(run, "--wire-dtype", "f16"), "a sequence-parallel ring passes f32 keys and values only"},
		{append(run, "--workers", "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"), "--sequence-parallel 2 but 3 --workers"},
		{[]string{"run", "-m", path, "-p", "Hi", "--sequence-parallel", "0"}, "--sequence-parallel 0 out of range"},
		{[]string{"run", "-m", mla, "-p", "Hi", "--sequence-parallel", "2"}, "MLA models attend through their latent cache"},
		{[]string{"serve", "-m", path, "--port", "0", "--sequence-parallel", "2", "--kv-dtype", "f16"}, "--kv-dtype f16: the ranks keep their keys and values in f32"},
		{[]string{"serve", "-m", path, "--port", "0", "--sequence-parallel", "2", "--kv-policy", "h2o:256"}, "KV policies are not supported"},
	} {
		code, _, stderr := pagoda(t, c.args...)
		if code == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("pagoda %v: exit %d, stderr %q (want %q)", c.args, code, tail(stderr, 400), c.want)
		}
	}
}

// zigzagShares is ring.Zigzag's rows per rank of T rows over P ranks
// ("2" or "3"), as the coordinator prints them.
func zigzagShares(T int, P string) string {
	n := int(P[0] - '0')
	var out []string
	for r := range n {
		z := ring.Zigzag(T, n, r)
		out = append(out, strconv.Itoa(z[0][1]-z[0][0]+z[1][1]-z[1][0]))
	}
	return "[" + strings.Join(out, " ") + "]"
}
