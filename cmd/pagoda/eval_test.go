package main

import (
	"encoding/json"
	"os"
	"path/filepath"
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
