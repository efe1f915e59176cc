package main

import (
	"bufio"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"pagoda/synth"
)

// TestEmbedCommand runs `pagoda embed` on a synthetic BERT and reads its
// JSON lines: one per text, unit length unless --no-normalize.
func TestEmbedCommand(t *testing.T) {
	p := filepath.Join(t.TempDir(), "bert.gguf")
	if err := synth.WriteBERT(p, synth.BERT{Layers: 1, Embd: 32, Heads: 2, FFN: 64, Positions: 32, Pooling: 2, Seed: 3}); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) []float64 {
		t.Helper()
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		old := os.Stdout
		os.Stdout = w
		err = runEmbed(args)
		os.Stdout = old
		w.Close()
		if err != nil {
			t.Fatal(err)
		}
		var norms []float64
		sc := bufio.NewScanner(r)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var line struct {
				Index     int       `json:"index"`
				Tokens    int       `json:"tokens"`
				Embedding []float64 `json:"embedding"`
			}
			if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
				t.Fatal(err)
			}
			if line.Index != len(norms) || line.Tokens < 3 || len(line.Embedding) != 32 {
				t.Fatalf("line %s", sc.Bytes())
			}
			var s float64
			for _, x := range line.Embedding {
				s += x * x
			}
			norms = append(norms, math.Sqrt(s))
		}
		return norms
	}
	n := run("-m", p, "--threads", "1", "the cat sat", "she was happy")
	if len(n) != 2 || math.Abs(n[0]-1) > 1e-5 || math.Abs(n[1]-1) > 1e-5 {
		t.Fatalf("norms %v", n)
	}
	if n := run("-m", p, "--threads", "1", "--no-normalize", "--pooling", "mean", "the cat sat"); len(n) != 1 || math.Abs(n[0]-1) < 1e-3 {
		t.Fatalf("--no-normalize norms %v", n)
	}
	if err := runEmbed([]string{"-m", p, "--pooling", "none", "x"}); err == nil {
		t.Fatal("--pooling none accepted")
	}
}
