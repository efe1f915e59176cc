package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os/exec"
	"pagoda/scripts/internal/proc"
	"regexp"
	"strconv"
	"time"
)

// llamaKV reports whether llama.cpp has the KV-cache type kv ("" is its
// default, f16).
func llamaKV(kv string) bool {
	switch kv {
	case "", "f16", "f32", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl":
		return true
	}
	return false
}

func depthTest(tg, depth int, kv string) string {
	if kv == "" {
		kv = "f16"
	}
	return fmt.Sprintf("tg%d @ d%d kv=%s", tg, depth, kv)
}

// renameDepth labels pagoda bench's depth tests (and, with a KV format
// given, its pp tests) with the KV format.
func renameDepth(res map[string][]float64, kv string) map[string][]float64 {
	out := map[string][]float64{}
	for test, s := range res {
		var n, d int
		if _, err := fmt.Sscanf(test, "tg%d @ d%d", &n, &d); err == nil {
			test = depthTest(n, d, kv)
		} else if _, err := fmt.Sscanf(test, "pp%d", &n); err == nil && kv != "" {
			test = fmt.Sprintf("pp%d kv=%s", n, kv)
		}
		out[test] = append(out[test], s...)
	}
	return out
}

// llamaBenchKV measures llama.cpp with llama-bench itself: flash attention
// on, K and V cached as kv, and with depth > 0 the decode after depth
// tokens filled untimed (llama-bench -d, in llama.cpp since mid 2025).
// Its tests are named as pagoda's after renameDepth.
func llamaBenchKV(bin, model, kv string, pp, tg, depth, threads, reps int) (map[string][]float64, string, error) {
	if kv == "" {
		kv = "f16"
	}
	a := []string{"-m", model, "-p", strconv.Itoa(pp), "-n", strconv.Itoa(tg), "-t", strconv.Itoa(threads),
		"-r", strconv.Itoa(reps), "-fa", "1", "-ctk", kv, "-ctv", kv, "-o", "json"}
	if depth > 0 {
		a = append(a, "-d", strconv.Itoa(depth))
	}
	res, commit, err := command(exec.Command(bin, a...), parseLlama)
	if err != nil {
		return nil, "", err
	}
	out := map[string][]float64{}
	for test, s := range res {
		var n int
		if _, err := fmt.Sscanf(test, "tg%d", &n); err == nil && depth > 0 {
			test = depthTest(n, depth, kv)
		} else if _, err := fmt.Sscanf(test, "pp%d", &n); err == nil {
			test = fmt.Sprintf("pp%d kv=%s", n, kv)
		}
		out[test] = append(out[test], s...)
	}
	return out, commit, nil
}

// benchHasDepth reports whether llama-bench bin knows -d (--n-depth).
func benchHasDepth(bin string) bool {
	b, _ := exec.Command(bin, "--help").CombinedOutput()
	return bytes.Contains(b, []byte("--n-depth"))
}

// llamaServerDepth measures llama.cpp's decode at depth: llama-server with
// one slot, flash attention and the KV type kv, answers reps prompts of
// depth random tokens (prompt caching off, so each is a fresh fill), each
// generating tg tokens with EOS ignored; the sample is the server's own
// decode rate for the request (timings.predicted_per_second), which
// excludes the prompt.
func llamaServerDepth(bin, model, kv string, depth, tg, threads, reps, vocab int) (map[string][]float64, string, error) {
	port, err := proc.FreePort()
	if err != nil {
		return nil, "", err
	}
	if kv == "" {
		kv = "f16"
	}
	cmd := exec.Command(bin, "-m", model, "-t", strconv.Itoa(threads), "--port", strconv.Itoa(port),
		"-np", "1", "-c", strconv.Itoa(depth+tg+64), "-fa", "on", "-ctk", kv, "-ctv", kv)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	srv, err := proc.Start(cmd)
	if err != nil {
		return nil, "", err
	}
	defer srv.Stop()
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	if err := srv.WaitHealthy(base, 5*time.Minute); err != nil {
		return nil, "", fmt.Errorf("llama-server: %w: %s", err, tail(logs.String()))
	}
	rng := rand.New(rand.NewPCG(uint64(depth), uint64(tg)))
	var samples []float64
	for i := 0; i < reps; i++ {
		prompt := make([]int, depth)
		for j := range prompt {
			prompt[j] = 3 + rng.IntN(vocab-3)
		}
		body, _ := json.Marshal(map[string]any{"prompt": prompt, "n_predict": tg, "ignore_eos": true,
			"cache_prompt": false, "temperature": 0})
		resp, err := http.Post(base+"/completion", "application/json", bytes.NewReader(body))
		if err != nil {
			return nil, "", err
		}
		rate, err := parseTimings(resp.Body, tg)
		resp.Body.Close()
		if err != nil {
			return nil, "", err
		}
		samples = append(samples, rate)
	}
	commit := "unknown"
	if m := buildRe.FindStringSubmatch(logs.String()); m != nil {
		commit = m[1]
	}
	return map[string][]float64{depthTest(tg, depth, kv): samples}, commit, nil
}

// buildRe finds the commit in llama-server's start-up line "build: 4798 (c392e509)".
var buildRe = regexp.MustCompile(`build: \d+ \(([0-9a-f]+)\)`)

// parseTimings reads llama-server's /completion answer and returns its
// decode rate, checking that all tg tokens were generated.
func parseTimings(r io.Reader, tg int) (float64, error) {
	var out struct {
		Timings struct {
			PredictedN      int     `json:"predicted_n"`
			PredictedPerSec float64 `json:"predicted_per_second"`
		} `json:"timings"`
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.NewDecoder(r).Decode(&out); err != nil {
		return 0, fmt.Errorf("reading llama-server's answer: %w", err)
	}
	if out.Error != nil {
		return 0, fmt.Errorf("llama-server: %s", out.Error.Message)
	}
	if out.Timings.PredictedN != tg || out.Timings.PredictedPerSec <= 0 {
		return 0, fmt.Errorf("llama-server generated %d tokens at %v t/s, want %d", out.Timings.PredictedN, out.Timings.PredictedPerSec, tg)
	}
	return out.Timings.PredictedPerSec, nil
}

func tail(s string) string {
	if len(s) > 2000 {
		s = s[len(s)-2000:]
	}
	return s
}
