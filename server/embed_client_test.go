package server

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestEmbedNodeClients runs the official openai and ollama npm clients'
// embedding calls against an encoder server. It needs node and both
// packages: set PAGODA_EMBED_NODE_MODULES to a node_modules folder holding
// them (default /tmp/embclient/node_modules, made by `npm install openai
// ollama` there).
func TestEmbedNodeClients(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not installed")
	}
	mods := os.Getenv("PAGODA_EMBED_NODE_MODULES")
	if mods == "" {
		mods = "/tmp/embclient/node_modules"
	}
	for _, p := range []string{"openai", "ollama"} {
		if _, err := os.Stat(filepath.Join(mods, p, "package.json")); err != nil {
			t.Skipf("%s npm package not in %s (npm install openai ollama there, or set PAGODA_EMBED_NODE_MODULES)", p, mods)
		}
	}
	ts, m, e := embedServer(t)
	script, err := filepath.Abs("testdata/embed_clients.js")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script, ts.URL, "bert")
	cmd.Env = append(os.Environ(), "NODE_PATH="+mods)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node clients: %v\n%s", err, out)
	}
	type vec struct {
		N     int       `json:"n"`
		Dim   int       `json:"dim"`
		Vec   []float64 `json:"vec"`
		Count int       `json:"count"`
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	type failure struct {
		Status  int    `json:"status"`
		Message string `json:"message"`
	}
	var r struct {
		Default vec     `json:"openai_default"`
		Dims    vec     `json:"openai_float_dims"`
		Empty   failure `json:"openai_empty"`
		Embed   vec     `json:"ollama_embed"`
		Legacy  vec     `json:"ollama_embeddings"`
		TooLong failure `json:"ollama_too_long"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	ids := m.Tokenizer().Encode("she was happy", tokOpts)
	want, err := e.Embed(context.Background(), [][]int32{ids})
	if err != nil {
		t.Fatal(err)
	}
	ref := want[0]
	norm := unitNorm(ref)
	close := func(name string, got []float64, n float64) {
		t.Helper()
		if len(got) != len(ref) {
			t.Errorf("%s: %d values, want %d", name, len(got), len(ref))
			return
		}
		for j := range got {
			if math.Abs(got[j]-float64(ref[j])/n) > 1e-6 {
				t.Errorf("%s [%d] = %v, want %v", name, j, got[j], float64(ref[j])/n)
				return
			}
		}
	}
	pass := 0
	check := func(ok bool, what string) {
		t.Helper()
		if ok {
			pass++
		} else {
			t.Errorf("%s: %s", what, out)
		}
	}
	check(r.Default.N == 2 && r.Default.Dim == 64 && r.Default.Usage.PromptTokens > 0, "openai default (base64) shape")
	close("openai default (base64)", r.Default.Vec, norm)
	check(r.Dims.Dim == 8, "openai dimensions 8")
	check(r.Empty.Status == 400 && strings.Contains(r.Empty.Message, "empty string"), "openai empty input")
	check(r.Embed.N == 2 && r.Embed.Dim == 64 && r.Embed.Count > 0, "ollama embed shape")
	close("ollama embed", r.Embed.Vec, norm)
	close("ollama embeddings (unnormalized)", r.Legacy.Vec, 1)
	check(r.TooLong.Status == 400 && strings.Contains(r.TooLong.Message, "maximum context length"), "ollama truncate false")
	t.Logf("node clients: %d/5 shape and error checks passed, 3 vectors compared", pass)
}
