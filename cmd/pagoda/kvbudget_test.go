package main

import (
	"encoding/json"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

func TestSizedKVBudget(t *testing.T) {
	// The built-in model: 5 layers, 4 KV heads of width 8, f16 K and V =
	// 640 bytes a token, 10240 a 16-token block; 2048 tokens of context.
	z := kvSizing{BlockBytes: 10240, BlockSize: 16, Context: 2048, Seqs: 4, Avail: 8 << 30, Formats: "K f16 V f16"}
	b, err := sizedKVBudget(z)
	if err != nil || b.Blocks != 4*129 || b.Bytes != 4*129*10240 || !strings.Contains(b.Report, "516 blocks") {
		t.Fatalf("built-in model: %+v, %v", b, err)
	}
	// A model whose sequences would take more than the cap: 25% of the
	// memory, in whole blocks, the residual windows taken first.
	z = kvSizing{BlockBytes: 1 << 20, BlockSize: 16, Context: 131072, Seqs: 4, Residual: 1 << 20, Avail: 4 << 30}
	b, err = sizedKVBudget(z)
	if want := (1<<30 - 1<<20) / (1 << 20); err != nil || b.Blocks != want || !strings.Contains(b.Report, "capped at 25%") || !strings.Contains(b.Report, "at most") {
		t.Fatalf("capped: %+v (want %d blocks), %v", b, want, err)
	}
	// Unknown memory: no cap to apply.
	z.Avail = 0
	if b, err = sizedKVBudget(z); err != nil || b.Blocks != 4*(8192+1) {
		t.Fatalf("no memory information: %+v, %v", b, err)
	}
	z.Avail = 1 << 20
	if _, err = sizedKVBudget(z); err == nil || !strings.Contains(err.Error(), "--kv-cache-memory") {
		t.Fatalf("no room for a block: %v", err)
	}
}

// TestServeDefaultKVBudget starts the built-in model with no flags and
// checks the budget is sized from the model (one report line, 516 blocks)
// and that the engine view the web page draws has that many blocks.
func TestServeDefaultKVBudget(t *testing.T) {
	base, log := startServeLog(t)
	re := regexp.MustCompile(`KV cache K f16 V f16, blocks of 16 tokens \(10\.0 KiB each\): (\d+) blocks = 5\.0 MiB, sized for 4 sequences`)
	m := re.FindStringSubmatch(log())
	if m == nil || strings.Count(log(), "KV cache") != 1 {
		t.Fatalf("start-up log:\n%s", log())
	}
	resp, err := http.Get(base + "/api/engine?blocks=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct {
		KV     struct{ Blocks, BlockSize int } `json:"kv"`
		Blocks struct{ State string }          `json:"blocks"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(m[1])
	if n != 516 || v.KV.Blocks != n || len(v.Blocks.State) != n {
		t.Fatalf("%d blocks logged; engine view %+v, %d block states", n, v.KV, len(v.Blocks.State))
	}
}

// TestPS runs pagoda ps against a server of the built-in model, and
// against none.
func TestPS(t *testing.T) {
	base, _ := startServeLog(t)
	code, out, stderr := pagoda(t, "ps", "--host", base)
	re := regexp.MustCompile(`(?m)^stories260K\s+293K\s+F32\s+\d+\.\d MiB\s+2048\s+0/516 blocks of 16 tokens in use \(0%\), 0 cached\s+0 running, 0 waiting$`)
	if code != 0 || !strings.HasPrefix(out, "NAME") || !re.MatchString(out) {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, stderr)
	}
	code, _, stderr = pagoda(t, "ps", "--host", "127.0.0.1:1")
	if code != 1 || !strings.Contains(stderr, "no server answered at http://127.0.0.1:1") {
		t.Fatalf("no server: exit %d, %s", code, stderr)
	}
}
