package hf

import (
	"bytes"
	"strings"
	"testing"

	"pagoda/arch"
	"pagoda/quant"
	"pagoda/testutil"
)

// The name map is the architecture's declaration: qwen2's biases map, and a
// qwen3 checkpoint's q/k norms do, but neither is in the other's map.
func TestConfigNames(t *testing.T) {
	parse := func(typ string) *Config {
		c, err := ParseConfig([]byte(`{"model_type": "` + typ + `", "hidden_size": 64, "num_attention_heads": 8}`))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	q2, q3 := parse("qwen2"), parse("qwen3")
	for _, c := range []struct {
		c      *Config
		hf, gg string
	}{
		{q2, "model.layers.3.self_attn.q_proj.bias", "blk.3.attn_q.bias"},
		{q2, "model.layers.3.mlp.down_proj.weight", "blk.3.ffn_down.weight"},
		{q3, "model.layers.12.self_attn.k_norm.weight", "blk.12.attn_k_norm.weight"},
		{q3, "lm_head.weight", "output.weight"},
	} {
		if got, ok := c.c.GGUFName(c.hf); !ok || got != c.gg {
			t.Errorf("%s GGUFName(%q) = %q, %v; want %q", c.c.Arch, c.hf, got, ok, c.gg)
		}
		if got, ok := c.c.HFName(c.gg); !ok || got != c.hf {
			t.Errorf("%s HFName(%q) = %q, %v; want %q", c.c.Arch, c.gg, got, ok, c.hf)
		}
	}
	if got, ok := q3.GGUFName("model.layers.3.self_attn.q_proj.bias"); ok {
		t.Errorf("qwen3 maps a q bias to %q", got)
	}
	if got, ok := q2.GGUFName("model.layers.3.self_attn.q_norm.weight"); ok {
		t.Errorf("qwen2 maps a q norm to %q", got)
	}
}

func TestUnpermute(t *testing.T) {
	// 2 heads of 4 rows, 2 bytes a row; row r holds {10r, 10r+1}. Each
	// head's rotate-half rows [x0 x1 y0 y1] become [x0 y0 x1 y1].
	in := []byte{0, 1, 10, 11, 20, 21, 30, 31, 40, 41, 50, 51, 60, 61, 70, 71}
	want := []byte{
		0, 1, 20, 21, 10, 11, 30, 31, // head 0: rows 0 2 1 3
		40, 41, 60, 61, 50, 51, 70, 71, // head 1: rows 4 6 5 7
	}
	got := Unpermute(in, 2, 8, 2)
	if !bytes.Equal(got, want) {
		t.Fatalf("Unpermute = %v\nwant %v", got, want)
	}
	if in[2] != 10 {
		t.Fatal("Unpermute changed its input")
	}
	// One head of 8 rows, 1 byte each: [x0..x3 y0..y3] → [x0 y0 x1 y1 …].
	got = Unpermute([]byte{0, 1, 2, 3, 4, 5, 6, 7}, 1, 8, 1)
	if want := []byte{0, 4, 1, 5, 2, 6, 3, 7}; !bytes.Equal(got, want) {
		t.Fatalf("one head: %v, want %v", got, want)
	}
	for _, c := range []struct {
		name                   string
		n, rowBytes, rows, hds int
	}{
		{"0 heads", 16, 2, 8, 0},
		{"-2 heads", 16, 2, 8, -2},
		{"3 heads", 18, 2, 9, 3}, // heads of 3 rows: odd
		{"rows not split", 16, 2, 8, 3},
		{"short data", 15, 2, 8, 2},
		{"0 rows", 0, 2, 0, 2},
		{"negative row size", 16, -2, 8, 2},
	} {
		if got := Unpermute(make([]byte, c.n), c.rowBytes, c.rows, c.hds); got != nil {
			t.Errorf("%s: got %d bytes, want nil", c.name, len(got))
		}
	}
}

func TestReadConfigStories(t *testing.T) {
	dir := testutil.Shared(t, "models/derived/stories260K-hf")
	c, err := ReadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		ModelType: "llama", Arch: "llama", Decl: arch.Lookup("llama"),
		VocabSize: 512, HiddenSize: 64, IntermediateSize: 172, NumLayers: 5, NumHeads: 8, NumKVHeads: 4,
		HeadDim: 8, MaxPositionEmbeddings: 512, RMSEps: 1e-5, RopeTheta: 10000,
		TieWordEmbeddings: true, HiddenAct: "silu",
	}
	if *c != want {
		t.Fatalf("config\n got %+v\nwant %+v", *c, want)
	}
	if h, ok := c.PermutedHeads("blk.2.attn_q.weight"); !ok || h != 8 {
		t.Errorf("q heads %d %v, want 8", h, ok)
	}
	if h, ok := c.PermutedHeads("blk.2.attn_k.weight"); !ok || h != 4 {
		t.Errorf("k heads %d %v, want 4", h, ok)
	}
	for _, n := range []string{"blk.2.attn_v.weight", "blk.2.attn_q.bias", "token_embd.weight"} {
		if _, ok := c.PermutedHeads(n); ok {
			t.Errorf("%s permuted", n)
		}
	}
	if _, err := ReadConfig(t.TempDir()); err == nil || !strings.Contains(err.Error(), "config.json") {
		t.Fatalf("missing config.json: %v", err)
	}
}

func TestParseConfig(t *testing.T) {
	parse := func(s string) (*Config, error) {
		return ParseConfig([]byte(`{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 8` + s + `}`))
	}
	c, err := parse("")
	if err != nil {
		t.Fatal(err)
	}
	// Defaults.
	if c.NumKVHeads != 8 || c.HeadDim != 8 || c.RopeTheta != 10000 || c.RMSEps != 1e-6 || c.SlidingWindow != 0 || c.RopeScaling.Kind != "" {
		t.Fatalf("defaults: %+v", *c)
	}

	c, err = ParseConfig([]byte(`{"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 8, "head_dim": 16,
		"sliding_window": 4096, "use_sliding_window": true, "rope_theta": 1e6, "attention_bias": true}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Arch != "qwen2" || !c.RopeNeox || c.SlidingWindow != 4096 || c.HeadDim != 16 || c.RopeTheta != 1e6 || !c.AttentionBias {
		t.Fatalf("qwen2: %+v", *c)
	}
	if _, ok := c.PermutedHeads("blk.0.attn_q.weight"); ok {
		t.Error("qwen2 q permuted")
	}
	for _, s := range []string{`, "sliding_window": 4096, "use_sliding_window": false`, `, "sliding_window": null`, `, "sliding_window": 0`, `, "sliding_window": "x"`} {
		if c, err := parse(s); err != nil || c.SlidingWindow != 0 {
			t.Errorf("%s: window %v, %v; want none", s, c, err)
		}
	}
	if c, err := parse(`, "sliding_window": 256`); err != nil || c.SlidingWindow != 256 {
		t.Errorf("sliding_window 256: %v, %v", c, err)
	}
	if c, err := ParseConfig([]byte(`{"model_type": "mistral", "hidden_act": "silu"}`)); err != nil || c.Arch != "llama" || c.RopeNeox {
		t.Errorf("mistral: %+v, %v", c, err)
	}
	if c, err := ParseConfig([]byte(`{"model_type": "qwen3"}`)); err != nil || c.Arch != "qwen3" || !c.RopeNeox {
		t.Errorf("qwen3: %+v, %v", c, err)
	}

	c, err = parse(`, "rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 8192}`)
	if err != nil {
		t.Fatal(err)
	}
	if want := (RopeScaling{Kind: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPos: 8192}); c.RopeScaling != want {
		t.Fatalf("llama3 rope_scaling %+v, want %+v", c.RopeScaling, want)
	}
	for s, want := range map[string]RopeScaling{
		`{"type": "linear", "factor": 2}`:                      {Kind: "linear", Factor: 2},
		`{"rope_type": "default"}`:                             {},
		`{"type": "linear", "rope_type": "default"}`:           {},
		`{"rope_type": "linear", "type": "yarn", "factor": 3}`: {Kind: "linear", Factor: 3},
	} {
		c, err := parse(`, "rope_scaling": ` + s)
		if err != nil || c.RopeScaling != want {
			t.Errorf("rope_scaling %s: %+v, %v; want %+v", s, c, err, want)
		}
	}

	for _, c := range []struct{ json, want string }{
		{`{"model_type": "gpt2"}`, `config.json: model_type "gpt2" not supported`},
		{`{}`, `config.json: model_type "" not supported`},
		{`{"model_type": 7}`, "config.json: json: cannot unmarshal number"},
		{`{"model_type": "llama", "hidden_act": "gelu"}`, `config.json: hidden_act "gelu" not supported`},
		{`{"model_type": "llama", "rope_scaling": {"type": "yarn", "factor": 4}}`, `config.json: rope_scaling type "yarn" not supported`},
		{`{"model_type": "llama", "num_hidden_layers": 5.5}`, "num_hidden_layers"},
		{`{"model_type": "llama", "head_dim": -4, "rope_scaling": {"rope_type": "llama3", "factor": 8}}`, `config.json: head_dim -4 out of range for rope_scaling type "llama3"`},
		{`{"model_type": "llama", "head_dim": 1099511627776, "rope_scaling": {"rope_type": "llama3", "factor": 8}}`, "head_dim 1099511627776 out of range"},
		{`[1, 2]`, "config.json: "},
		{``, "config.json: "},
	} {
		_, err := ParseConfig([]byte(c.json))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", c.json, err, c.want)
		}
	}
}

func TestTensorType(t *testing.T) {
	for dt, want := range map[string]quant.Type{"F32": quant.F32, "F16": quant.F16, "BF16": quant.BF16} {
		if got, ok := TensorType(dt); !ok || got != want {
			t.Errorf("%s: %v %v", dt, got, ok)
		}
	}
	for _, dt := range []string{"F64", "I8", "F8_E4M3", "bf16", ""} {
		if _, ok := TensorType(dt); ok {
			t.Errorf("%s accepted", dt)
		}
	}
}
