package encoder

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"pagoda/gguf"
	"pagoda/kernels"
	"pagoda/synth"
	"pagoda/tokenizer"
)

func tinyBERT(t testing.TB, pooling int) []byte {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := synth.WriteBERT(p, synth.BERT{Layers: 2, Embd: 16, Heads: 2, FFN: 32, Positions: 16, Pooling: pooling, Seed: 9}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// rewrite copies a GGUF, letting edit change its metadata and drop
// tensors (return false).
func rewrite(t *testing.T, src []byte, setKV map[string]any, keep func(name string) bool) []byte {
	t.Helper()
	f, err := gguf.Parse(src)
	if err != nil {
		t.Fatal(err)
	}
	w := gguf.NewWriter()
	for _, kv := range f.KV {
		if kv.Key == gguf.KeyAlignment {
			continue
		}
		if err := w.Set(kv.Key, kv.Value); err != nil {
			t.Fatal(err)
		}
	}
	for k, v := range setKV {
		if err := w.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	for _, ti := range f.Tensors {
		if keep != nil && !keep(ti.Name) {
			continue
		}
		if err := w.AddTensor(ti.Name, ti.Type, ti.Dims, ti.Data); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func load(b []byte, pool *kernels.Pool) (*Model, error) {
	f, err := gguf.Parse(b)
	if err != nil {
		return nil, err
	}
	return FromGGUF(f, Options{Pool: pool})
}

func TestLoadErrors(t *testing.T) {
	src := tinyBERT(t, 1)
	pool := kernels.NewPool(1)
	defer pool.Close()
	m, err := load(src, pool)
	if err != nil {
		t.Fatal(err)
	}
	if m.Config.Pooling != PoolMean || m.Config.NLayer != 2 || m.Config.NEmbd != 16 || m.Config.ContextLen != 16 || m.Config.TokenTypes != 2 {
		t.Fatalf("config %+v", m.Config)
	}
	if m, err := load(tinyBERT(t, 0), pool); err != nil || m.Config.Pooling != PoolCLS {
		t.Fatalf("no pooling_type: %v, want CLS (llama.cpp's bert default): %v", m.Config.Pooling, err)
	}
	for _, c := range []struct {
		name string
		kv   map[string]any
		drop string
		want string
	}{
		{"decoder", map[string]any{"general.architecture": "llama"}, "", "not an encoder"},
		{"causal", map[string]any{"bert.attention.causal": true}, "", "causal"},
		{"heads", map[string]any{"bert.attention.head_count": uint32(3)}, "", "not divisible"},
		{"eps", map[string]any{"bert.attention.layer_norm_epsilon": float32(0)}, "", "layer_norm_epsilon"},
		{"pooling", map[string]any{"bert.pooling_type": uint32(9)}, "", "pooling_type 9"},
		{"layers", map[string]any{"bert.block_count": uint32(1 << 20)}, "", "block_count"},
		{"positions", map[string]any{"bert.context_length": uint32(32)}, "", "position_embd"},
		{"missing", nil, "blk.1.ffn_up.weight", `"blk.1.ffn_up.weight" missing`},
		{"no tokenizer", map[string]any{"tokenizer.ggml.model": "nope"}, "", "tokenizer"},
	} {
		b := rewrite(t, src, c.kv, func(n string) bool { return n != c.drop })
		_, err := load(b, pool)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
	// Without the optional biases and token types it still loads.
	b := rewrite(t, src, nil, func(n string) bool { return !strings.HasSuffix(n, "attn_q.bias") && n != "token_types.weight" })
	if _, err := load(b, pool); err != nil {
		t.Fatal(err)
	}
}

func TestHiddenErrorsAndPooling(t *testing.T) {
	pool := kernels.NewPool(1)
	defer pool.Close()
	m, err := load(tinyBERT(t, 1), pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range [][][]int32{nil, {{}}, {make([]int32, 17)}, {{2, 99999}}, {{-1}}} {
		if _, err := m.Hidden(in); err == nil {
			t.Errorf("%v accepted", in)
		}
	}
	ids := m.Tokenizer().Encode("the cat sat", tokenizer.Options{AddSpecial: true})
	hs, err := m.Hidden([][]int32{ids})
	if err != nil {
		t.Fatal(err)
	}
	d, n := m.Config.NEmbd, len(ids)
	h := hs[0]
	// Each row leaves the last layer's LayerNorm: with weights near 1 and
	// biases near 0, about zero mean and unit variance.
	for i := 0; i < n; i++ {
		var mean float64
		for _, v := range h[i*d : (i+1)*d] {
			mean += float64(v)
		}
		if math.Abs(mean/float64(d)) > 0.2 {
			t.Fatalf("row %d mean %v", i, mean/float64(d))
		}
	}
	for _, c := range []struct {
		p    Pooling
		want func(j int) float64
	}{
		{PoolCLS, func(j int) float64 { return float64(h[j]) }},
		{PoolLast, func(j int) float64 { return float64(h[(n-1)*d+j]) }},
		{PoolMean, func(j int) float64 {
			var s float64
			for i := 0; i < n; i++ {
				s += float64(h[i*d+j])
			}
			return s / float64(n)
		}},
	} {
		v, err := Pool(c.p, h, n, d)
		if err != nil {
			t.Fatal(err)
		}
		for j := range v {
			if math.Abs(float64(v[j])-c.want(j)) > 1e-6 {
				t.Fatalf("%s [%d] = %v, want %v", c.p, j, v[j], c.want(j))
			}
		}
	}
	if _, err := Pool(PoolNone, h, n, d); err == nil {
		t.Fatal("pooling none gave a vector")
	}
	v := []float32{3, 4}
	Normalize(v)
	if v[0] != 0.6 || v[1] != 0.8 {
		t.Fatalf("Normalize: %v", v)
	}
	for _, s := range []string{"mean", "cls", "last", "none"} {
		if p, err := ParsePooling(s); err != nil || p.String() != s {
			t.Fatalf("ParsePooling(%q) = %v, %v", s, p, err)
		}
	}
	if _, err := ParsePooling("max"); err == nil {
		t.Fatal("pooling max accepted")
	}
}

// FuzzLoad: whatever the bytes, loading and running an encoder gives a
// model or an error, never a panic.
func FuzzLoad(f *testing.F) {
	f.Add(tinyBERT(f, 1))
	pool := kernels.NewPool(1)
	defer pool.Close()
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := load(b, pool)
		if err != nil {
			return
		}
		ids := m.Tokenizer().Encode("the cat", tokenizer.Options{AddSpecial: true})
		if len(ids) > 0 && len(ids) <= m.Config.ContextLen {
			if hs, err := m.Hidden([][]int32{ids}); err == nil && len(hs[0]) != len(ids)*m.Config.NEmbd {
				t.Fatalf("%d hidden values for %d tokens", len(hs[0]), len(ids))
			}
		}
	})
}
