package model_test

// Fuzz targets for model.Open on arbitrary bytes. Seeds are small valid
// checkpoints (built here, and kept in testdata/fuzz with any input that
// once failed); `go test` replays them, `go test -fuzz=FuzzOpenGGUF`
// explores.
//
// Refresh the stored seeds after changing the builders:
//   PAGODA_WRITE_FUZZ_SEEDS=1 go test ./model -run TestWriteFuzzSeeds

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"pagoda/model"
	"pagoda/quant"
	"pagoda/synth"
)

// fuzzShapes are the smallest models of each architecture synth can write:
// the 259 byte and special tokens, 8-wide embeddings, one layer.
var fuzzShapes = []synth.Shape{
	{Arch: "llama", Layers: 1, Dim: 8, Heads: 2, KVHeads: 1, HeadDim: 4, FFN: 16, Vocab: 259, Context: 16, Tied: true},
	{Arch: "qwen2", Layers: 1, Dim: 8, Heads: 2, KVHeads: 2, HeadDim: 4, FFN: 16, Vocab: 259, Context: 16, Tied: true},
	{Arch: "qwen3", Layers: 1, Dim: 8, Heads: 2, KVHeads: 1, HeadDim: 4, FFN: 16, Vocab: 259, Context: 16, Tied: true},
}

func ggufSeeds(t testing.TB) [][]byte {
	var out [][]byte
	for i, s := range fuzzShapes {
		typ := quant.F16
		if i == 2 {
			typ = quant.F32
		}
		var buf bytes.Buffer
		if _, err := synth.WriteTo(&buf, synth.Options{Shape: s, Type: typ, Seed: int64(i)}); err != nil {
			t.Fatal(err)
		}
		out = append(out, buf.Bytes())
	}
	return out
}

// l2cConfig is a llama2.c checkpoint to build.
type l2cConfig struct {
	dim, hidden, layers, heads, kvHeads, vocab, seqLen int
	shared                                             bool
	version, groupSize                                 int
}

// buildLlama2C writes a checkpoint in the layout llama2c reads: version 0
// (legacy run.c), 1 (export.py float32) or 2 (runq.c int8 + group scales).
// Weights are small deterministic values; norms are ones.
func buildLlama2C(c l2cConfig) []byte {
	le := binary.LittleEndian
	var b []byte
	vocab := int32(c.vocab)
	if c.version == 0 {
		if !c.shared {
			vocab = -vocab
		}
		for _, v := range []int32{int32(c.dim), int32(c.hidden), int32(c.layers), int32(c.heads), int32(c.kvHeads), vocab, int32(c.seqLen)} {
			b = le.AppendUint32(b, uint32(v))
		}
	} else {
		h := make([]byte, 256)
		le.PutUint32(h, 0x616b3432)
		le.PutUint32(h[4:], uint32(c.version))
		for i, v := range []int{c.dim, c.hidden, c.layers, c.heads, c.kvHeads, c.vocab, c.seqLen} {
			le.PutUint32(h[8+4*i:], uint32(v))
		}
		if c.shared {
			h[36] = 1
		}
		le.PutUint32(h[37:], uint32(c.groupSize))
		b = h
	}
	state := uint32(12345)
	rnd := func() float32 {
		state = state*1664525 + 1013904223
		return float32(int32(state>>8)%2001-1000) / 8000 // within ±0.125
	}
	f32 := func(n int, one bool) {
		for i := 0; i < n; i++ {
			v := float32(1)
			if !one {
				v = rnd()
			}
			b = le.AppendUint32(b, math.Float32bits(v))
		}
	}
	q8 := func(n int) {
		for i := 0; i < n; i++ {
			b = append(b, byte(int8(rnd()*1000)))
		}
		for i := 0; i < n/c.groupSize; i++ {
			b = le.AppendUint32(b, math.Float32bits(1.0/1024)) // exact in float16
		}
	}
	d, h, v, L := c.dim, c.hidden, c.vocab, c.layers
	kv := d / c.heads * c.kvHeads
	mats := [][2]int{{v, d}}
	for _, m := range [][2]int{{d, d}, {kv, d}, {kv, d}, {d, d}, {h, d}, {d, h}, {h, d}} {
		for l := 0; l < L; l++ {
			mats = append(mats, m)
		}
	}
	if !c.shared {
		mats = append(mats, [2]int{v, d})
	}
	switch c.version {
	case 0:
		f32(v*d, false)
		f32(L*d, true)
		f32(L*d*d, false)
		f32(L*kv*d, false)
		f32(L*kv*d, false)
		f32(L*d*d, false)
		f32(L*d, true)
		f32(L*h*d, false)
		f32(L*d*h, false)
		f32(L*h*d, false)
		f32(d, true)
		f32(2*c.seqLen*(d/c.heads/2), false)
		if !c.shared {
			f32(v*d, false)
		}
	case 1:
		f32(2*L*d+d, true)
		for _, m := range mats {
			f32(m[0]*m[1], false)
		}
	case 2:
		f32(2*L*d+d, true)
		for _, m := range mats {
			q8(m[0] * m[1])
		}
	}
	return b
}

func llama2cSeeds() [][]byte {
	return [][]byte{
		buildLlama2C(l2cConfig{dim: 8, hidden: 16, layers: 1, heads: 2, kvHeads: 1, vocab: 16, seqLen: 4, shared: true}),
		buildLlama2C(l2cConfig{dim: 8, hidden: 16, layers: 2, heads: 2, kvHeads: 2, vocab: 16, seqLen: 4}),
		buildLlama2C(l2cConfig{dim: 8, hidden: 16, layers: 1, heads: 2, kvHeads: 1, vocab: 16, seqLen: 4, shared: true, version: 1}),
		buildLlama2C(l2cConfig{dim: 8, hidden: 16, layers: 1, heads: 2, kvHeads: 1, vocab: 16, seqLen: 4, version: 2, groupSize: 8}),
		buildLlama2C(l2cConfig{dim: 32, hidden: 64, layers: 1, heads: 4, kvHeads: 2, vocab: 8, seqLen: 4, shared: true, version: 2, groupSize: 32}),
	}
}

// TestFuzzSeedsLoad keeps the builders honest: every seed is a valid model
// (a seed that fails to load would leave the fuzzer exploring only error
// paths) and decodes one token to finite logits.
func TestFuzzSeedsLoad(t *testing.T) {
	dir := t.TempDir()
	for i, b := range ggufSeeds(t) {
		expectOpenOK(t, fmt.Sprintf("gguf seed %d", i), writeBytes(t, filepath.Join(dir, "seed.gguf"), b), model.Options{Threads: 1})
	}
	for i, b := range llama2cSeeds() {
		expectOpenOK(t, fmt.Sprintf("llama2.c seed %d", i), writeBytes(t, filepath.Join(dir, "seed.bin"), b), model.Options{Threads: 1})
	}
}

// TestWriteFuzzSeeds stores the seeds in testdata/fuzz (on request only).
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("PAGODA_WRITE_FUZZ_SEEDS") == "" {
		t.Skip("set PAGODA_WRITE_FUZZ_SEEDS=1 to rewrite testdata/fuzz seeds")
	}
	write := func(target string, seeds [][]byte) {
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, b := range seeds {
			body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", b)
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%d", i)), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	write("FuzzOpenGGUF", ggufSeeds(t))
	write("FuzzOpenLlama2C", llama2cSeeds())
}

// fuzzOpen is the body of both targets.
func fuzzOpen(t *testing.T, path string, data []byte) {
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	fd0 := countFDs()
	m, err, p := openCatch(path, model.Options{Threads: 1})
	if p != "" {
		t.Fatalf("model.Open panicked: %s", p)
	}
	if err != nil {
		msg := err.Error()
		if strings.ContainsAny(msg, "\n\r") {
			t.Fatalf("error is not one line: %q", msg)
		}
		if len(msg) > maxMessage {
			t.Fatalf("error is %d bytes long: %q", len(msg), msg)
		}
		if !strings.Contains(msg, path) {
			t.Fatalf("error does not name the file: %q", msg)
		}
	} else {
		msg := forwardOne(m)
		m.Close()
		if msg != "" && !strings.HasPrefix(msg, "BUG") {
			t.Fatal(msg)
		}
	}
	if fd := countFDs(); fd > fd0 {
		t.Fatalf("open files %d → %d", fd0, fd)
	}
	if n := mappingsUnder(filepath.Dir(path)); n > 0 {
		t.Fatalf("%d mappings of %s remain", n, path)
	}
}

func FuzzOpenGGUF(f *testing.F) {
	for _, b := range ggufSeeds(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzOpen(t, filepath.Join(t.TempDir(), "m.gguf"), data)
	})
}

func FuzzOpenLlama2C(f *testing.F) {
	for _, b := range llama2cSeeds() {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzOpen(t, filepath.Join(t.TempDir(), "m.bin"), data)
	})
}
