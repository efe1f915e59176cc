package synth

import (
	"bytes"
	"io"
	"math"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"pagoda/gguf"
	"pagoda/model"
	"pagoda/quant"
	"pagoda/testutil"
)

func build(t testing.TB, o Options) *gguf.File {
	t.Helper()
	var b bytes.Buffer
	n, err := WriteTo(&b, o)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(b.Len()) {
		t.Fatalf("WriteTo returned %d, wrote %d", n, b.Len())
	}
	f, err := gguf.Parse(b.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func dequant(t testing.TB, ti *gguf.TensorInfo) []float32 {
	t.Helper()
	out := make([]float32, ti.Elements())
	if err := quant.Dequantize(ti.Type, ti.Data, out); err != nil {
		t.Fatalf("%s: %v", ti.Name, err)
	}
	return out
}

func stats(x []float32) (mean, std float64) {
	for _, v := range x {
		mean += float64(v)
	}
	mean /= float64(len(x))
	for _, v := range x {
		std += (float64(v) - mean) * (float64(v) - mean)
	}
	return mean, math.Sqrt(std / float64(len(x)))
}

var weightTypes = []quant.Type{quant.F32, quant.F16, quant.BF16, quant.Q4_0, quant.Q4_1, quant.Q5_0,
	quant.Q5_1, quant.Q8_0, quant.Q2_K, quant.Q3_K, quant.Q4_K, quant.Q5_K, quant.Q6_K}

// The tiny preset in every type: right metadata, tensor directory and
// vocabulary, and it survives a gguf rewrite unchanged.
func TestTinyEveryType(t *testing.T) {
	shape, err := Preset("")
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range weightTypes {
		t.Run(typ.String(), func(t *testing.T) {
			f := build(t, Options{Shape: shape, Type: typ, Seed: 7})
			want := map[string]uint64{
				"llama.context_length": 2048, "llama.embedding_length": 64, "llama.block_count": 2,
				"llama.feed_forward_length": 172, "llama.attention.head_count": 4, "llama.attention.head_count_kv": 2,
				"llama.attention.key_length": 16, "llama.attention.value_length": 16, "llama.rope.dimension_count": 16,
				"llama.vocab_size": 512, "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
				"tokenizer.ggml.unknown_token_id": 0, "general.file_type": uint64(fileTypes[typ]),
			}
			for k, w := range want {
				if got, ok := f.Uint(k); !ok || got != w {
					t.Errorf("%s = %d (%v), want %d", k, got, ok, w)
				}
			}
			if v, _ := f.Get("llama.block_count"); v.Type != gguf.Uint32 {
				t.Errorf("block_count stored as %s, llama.cpp wants uint32", v.Type)
			}
			if a, _ := f.String("general.architecture"); a != "llama" {
				t.Errorf("arch %q", a)
			}
			if th, _ := f.Float("llama.rope.freq_base"); th != 10000 {
				t.Errorf("theta %v", th)
			}
			if eps, _ := f.Float("llama.attention.layer_norm_rms_epsilon"); float32(eps) != 1e-5 {
				t.Errorf("eps %v", eps)
			}
			if m, _ := f.String("tokenizer.ggml.model"); m != "llama" {
				t.Errorf("tokenizer model %q", m)
			}
			if b, ok := f.Bool("tokenizer.ggml.add_bos_token"); !ok || !b {
				t.Error("add_bos_token")
			}
			toks, _ := f.Strings("tokenizer.ggml.tokens")
			scores, _ := f.Float32s("tokenizer.ggml.scores")
			types, _ := f.Int32s("tokenizer.ggml.token_type")
			if len(toks) != 512 || len(scores) != 512 || len(types) != 512 {
				t.Fatalf("vocab sizes %d %d %d", len(toks), len(scores), len(types))
			}
			if len(f.Tensors) != 21 {
				t.Errorf("%d tensors, want 21", len(f.Tensors))
			}
			for _, ti := range f.Tensors {
				switch len(ti.Dims) {
				case 1:
					if ti.Type != quant.F32 || ti.Dims[0] != 64 {
						t.Errorf("%s: %s %v", ti.Name, ti.Type, ti.Dims)
					}
					for _, v := range dequant(t, ti) {
						if v != 1 {
							t.Fatalf("%s: norm weight %v", ti.Name, v)
						}
					}
				case 2:
					if want := storageType(typ, int(ti.Dims[0])); ti.Type != want || ti.Dims[0]%uint64(want.BlockSize()) != 0 {
						t.Errorf("%s: %s, want %s", ti.Name, ti.Type, want)
					}
				}
			}
			for name, dims := range map[string][]uint64{
				"token_embd.weight": {64, 512}, "output.weight": {64, 512}, "blk.1.attn_k.weight": {64, 32},
				"blk.1.attn_output.weight": {64, 64}, "blk.0.ffn_down.weight": {172, 64}, "blk.0.ffn_up.weight": {64, 172},
			} {
				if ti := f.Tensor(name); ti == nil || !reflect.DeepEqual(ti.Dims, dims) {
					t.Errorf("%s: %+v", name, ti)
				}
			}
			// Rewriting through gguf reproduces the bytes.
			var a, b bytes.Buffer
			WriteTo(&a, Options{Shape: shape, Type: typ, Seed: 7})
			w := gguf.NewWriter()
			for _, kv := range f.KV {
				w.Set(kv.Key, kv.Value)
			}
			for _, ti := range f.Tensors {
				if err := w.AddTensor(ti.Name, ti.Type, ti.Dims, ti.Data); err != nil {
					t.Fatal(err)
				}
			}
			w.WriteTo(&b)
			if !bytes.Equal(a.Bytes(), b.Bytes()) {
				t.Error("gguf rewrite differs")
			}
		})
	}
}

// kShape has rows that are whole K-quant blocks, so no type falls back.
var kShape = Shape{Arch: "llama", Layers: 1, Dim: 256, Heads: 4, KVHeads: 2, FFN: 512, Vocab: 300}

// The same seed gives the same float weights in every type: each quantized
// file is close to the F32 one, as close as its bits allow.
func TestQuantizedMatchesF32(t *testing.T) {
	ref := build(t, Options{Shape: kShape, Seed: 3, Std: 0.5})
	emb := dequant(t, ref.Tensor("token_embd.weight"))
	mean, std := stats(emb)
	if math.Abs(mean) > 0.01 || math.Abs(std-0.5) > 0.01 {
		t.Errorf("token_embd mean %v std %v, want 0, 0.5", mean, std)
	}
	maxRel := map[quant.Type]float64{
		quant.F16: 0.001, quant.BF16: 0.005, quant.Q8_0: 0.01, quant.Q6_K: 0.03, quant.Q5_0: 0.06, quant.Q5_1: 0.06,
		quant.Q5_K: 0.05, quant.Q4_0: 0.12, quant.Q4_1: 0.12, quant.Q4_K: 0.1, quant.Q3_K: 0.25, quant.Q2_K: 0.5,
	}
	for typ, bound := range maxRel {
		f := build(t, Options{Shape: kShape, Type: typ, Seed: 3, Std: 0.5})
		for _, ti := range f.Tensors {
			if len(ti.Dims) != 2 {
				continue
			}
			if ti.Type != typ {
				t.Fatalf("%s %s: stored as %s", typ, ti.Name, ti.Type)
			}
			a, b := dequant(t, ref.Tensor(ti.Name)), dequant(t, ti)
			var se, ss float64
			for i := range a {
				d := float64(a[i] - b[i])
				se += d * d
				ss += float64(a[i]) * float64(a[i])
			}
			if rel := math.Sqrt(se / ss); rel > bound || rel == 0 && typ != quant.F32 {
				t.Errorf("%s %s: relative RMS error %.4f, bound %.4f", typ, ti.Name, rel, bound)
			}
		}
	}
}

func TestDeterministic(t *testing.T) {
	o := Options{Shape: kShape, Type: quant.Q4_K, Seed: 42}
	var a, b, c bytes.Buffer
	WriteTo(&a, o)
	prev := runtime.GOMAXPROCS(1)
	WriteTo(&b, o)
	runtime.GOMAXPROCS(prev)
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("output depends on GOMAXPROCS")
	}
	o.Seed = 43
	WriteTo(&c, o)
	if bytes.Equal(a.Bytes(), c.Bytes()) || a.Len() != c.Len() {
		t.Error("different seeds gave the same file")
	}
	// Different tensors get different streams.
	f := build(t, Options{Shape: kShape, Seed: 1})
	if bytes.Equal(f.Tensor("blk.0.ffn_gate.weight").Data, f.Tensor("blk.0.ffn_up.weight").Data) {
		t.Error("ffn_gate == ffn_up")
	}
	p := filepath.Join(t.TempDir(), "m.gguf")
	if err := Write(p, Options{Shape: kShape, Type: quant.Q4_K, Seed: 42}); err != nil {
		t.Fatal(err)
	}
	g, err := gguf.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if int(g.Tensors[len(g.Tensors)-1].Offset) == 0 || g.Tensor("blk.0.attn_q.weight").Type != quant.Q4_K {
		t.Error("file written by Write")
	}
}

func TestArchitectures(t *testing.T) {
	for _, arch := range []string{"qwen2", "qwen3"} {
		s := kShape
		s.Arch, s.Tied, s.HeadDim, s.RopeTheta, s.RMSEps = arch, true, 128, 1e6, 1e-6
		f := build(t, Options{Shape: s, Type: quant.Q8_0})
		if a, _ := f.String("general.architecture"); a != arch {
			t.Errorf("arch %q", a)
		}
		if th, _ := f.Float(arch + ".rope.freq_base"); th != 1e6 {
			t.Errorf("%s theta %v", arch, th)
		}
		if kl, _ := f.Uint(arch + ".attention.key_length"); kl != 128 {
			t.Errorf("%s key_length %d", arch, kl)
		}
		if f.Tensor("output.weight") != nil {
			t.Errorf("%s: tied model has output.weight", arch)
		}
		if q := f.Tensor("blk.0.attn_q.weight"); !reflect.DeepEqual(q.Dims, []uint64{256, 512}) {
			t.Errorf("%s attn_q dims %v (q width 512 ≠ d)", arch, q.Dims)
		}
		if o := f.Tensor("blk.0.attn_output.weight"); !reflect.DeepEqual(o.Dims, []uint64{512, 256}) {
			t.Errorf("%s attn_output dims %v", arch, o.Dims)
		}
		switch arch {
		case "qwen2":
			for _, n := range []string{"attn_q.bias", "attn_k.bias", "attn_v.bias"} {
				b := f.Tensor("blk.0." + n)
				if b == nil || b.Type != quant.F32 {
					t.Fatalf("qwen2 %s: %+v", n, b)
				}
				if _, std := stats(dequant(t, b)); std < 0.01 || std > 0.03 {
					t.Errorf("qwen2 %s std %v", n, std)
				}
			}
			if b := f.Tensor("blk.0.attn_k.bias"); b.Dims[0] != 256 {
				t.Errorf("k bias dims %v", b.Dims)
			}
		case "qwen3":
			for _, n := range []string{"attn_q_norm.weight", "attn_k_norm.weight"} {
				if b := f.Tensor("blk.0." + n); b == nil || b.Dims[0] != 128 {
					t.Errorf("qwen3 %s: %+v", n, b)
				}
			}
		}
	}
}

func TestPresets(t *testing.T) {
	want := map[string]int64{
		"tiny":           2*(64*64+2*64*32+64*64+3*64*172+2*64) + 2*512*64 + 64,
		"tinyllama-1.1b": 1100048384, // TinyLlama-1.1B's published count
		"llama3.2-1b":    1235814400, // Llama-3.2-1B's published count
		"qwen2.5-0.5b":   24*(896*896+2*896*128+896*896+3*896*4864+2*896) + 32000*896 + 896,
		// Attention, dense layer, 26 MoE layers (router, 64 experts, 2
		// shared), embeddings: DeepSeek-V2-Lite's published 15.7 B.
		"deepseek-v2-lite": 2*102400*2048 + 2048 + 27*(2048+2048*16*192+2048*576+512+2*128*512*16+2048*2048) +
			(2048 + 3*2048*10944) + 26*(2048+2048*64+3*2048*1408*64+3*2048*2816),
		// OLMoE-1B-7B: 6.9 B in all.
		"olmoe-1b-7b": 2*50304*2048 + 2048 + 16*(2048+4*2048*2048+2*2048+2048+2048*64+3*2048*1024*64),
	}
	for name, n := range want {
		s, err := Preset(name)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.Params(); got != n {
			t.Errorf("%s: %d params, want %d", name, got, n)
		}
	}
	if !reflect.DeepEqual(Presets(), []string{"deepseek-v2-lite", "llama3.2-1b", "olmoe-1b-7b", "qwen1.5-moe-a2.7b", "qwen2.5-0.5b", "tiny", "tinyllama-1.1b"}) {
		t.Errorf("presets %v", Presets())
	}
	s, _ := Preset("TinyLlama-1.1B")
	if s.Layers != 22 || s.KVHeads != 4 || s.Tied || s.Vocab != 32000 {
		t.Errorf("tinyllama %+v", s)
	}
	s, _ = Preset("llama3.2-1b")
	if s.RopeTheta != 500000 || !s.Tied || s.Vocab != 128256 || s.KVHeads != 8 {
		t.Errorf("llama3.2 %+v", s)
	}
	s, _ = Preset("qwen2.5-0.5b")
	if s.RMSEps != 1e-6 || s.RopeTheta != 1e6 || s.Heads != 14 || s.Arch != "llama" || storageType(quant.Q4_K, s.Dim) != quant.Q5_0 {
		t.Errorf("qwen2.5 %+v", s)
	}
}

func TestErrors(t *testing.T) {
	if _, err := Preset("gpt5"); err == nil || !strings.Contains(err.Error(), "tiny") {
		t.Errorf("unknown preset: %v", err)
	}
	tiny, _ := Preset("tiny")
	bad := func(mod func(*Options)) Options {
		o := Options{Shape: tiny}
		mod(&o)
		return o
	}
	for _, c := range []struct {
		o    Options
		want string
	}{
		{bad(func(o *Options) { o.Type = quant.IQ2_XS }), "IQ2_XS"},
		{bad(func(o *Options) { o.Type = quant.Q8_K }), "Q8_K"},
		{bad(func(o *Options) { o.OutputType = quant.Q8_1 }), "Q8_1"},
		{bad(func(o *Options) { o.Shape.Vocab = 100 }), "smaller"},
		{bad(func(o *Options) { o.Shape.KVHeads = 3 }), "multiple"},
		{bad(func(o *Options) { o.Shape.Arch = "gpt2" }), "gpt2"},
		{bad(func(o *Options) { o.Shape.Layers = 0 }), "layers"},
		{bad(func(o *Options) { o.Shape.HeadDim = 15 }), "odd"},
		{bad(func(o *Options) { o.Std = -1 }), "std"},
		{bad(func(o *Options) { o.VocabFrom = "/nonexistent/tokenizer.bin" }), "nonexistent"},
	} {
		if _, err := WriteTo(io.Discard, c.o); err == nil || !strings.HasPrefix(err.Error(), "synth: ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("error %v, want %q", err, c.want)
		}
	}
	if err := Write(filepath.Join(t.TempDir(), "no", "such", "dir.gguf"), Options{Shape: tiny}); err == nil {
		t.Error("write into a missing folder succeeded")
	}
}

func TestVocabFrom(t *testing.T) {
	stories := testutil.Shared(t, "models/gguf/stories260K.gguf")
	g, err := gguf.Open(stories)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	want, _ := g.Strings("tokenizer.ggml.tokens")
	tiny, _ := Preset("tiny")
	for _, src := range []string{stories, testutil.Shared(t, "models/llama2.c/tok512.bin")} {
		o := Options{Shape: tiny, VocabFrom: src}
		o.Shape.Vocab = 1000 // overridden by the source
		f := build(t, o)
		toks, _ := f.Strings("tokenizer.ggml.tokens")
		types, _ := f.Int32s("tokenizer.ggml.token_type")
		if !reflect.DeepEqual(toks, want) || types[1] != typeControl || types[3] != typeByte {
			t.Errorf("%s: vocabulary not copied", filepath.Base(src))
		}
		if te := f.Tensor("token_embd.weight"); te.Dims[1] != 512 {
			t.Errorf("%s: token_embd dims %v", filepath.Base(src), te.Dims)
		}
		if n, _ := f.Uint("llama.vocab_size"); n != 512 {
			t.Errorf("vocab_size %d", n)
		}
	}
	// A BPE vocabulary brings its merges and pre-tokenizer along.
	o := Options{Shape: tiny, VocabFrom: testutil.Shared(t, "models/llama.cpp-vocab/ggml-vocab-gpt-2.gguf")}
	f := build(t, o)
	if m, _ := f.String("tokenizer.ggml.model"); m != "gpt2" {
		t.Errorf("model %q", m)
	}
	if merges, _ := f.Strings("tokenizer.ggml.merges"); len(merges) != 50000 {
		t.Errorf("%d merges", len(merges))
	}
	if te := f.Tensor("output.weight"); te.Dims[1] != 50257 {
		t.Errorf("output dims %v", te.Dims)
	}
}

func TestBuiltinVocab(t *testing.T) {
	for _, n := range []int{259, 260, 512, 32000} {
		v := builtinVocab(n)
		var toks []string
		var scores []float32
		var types []int32
		for _, kv := range v.kv {
			switch kv.Key {
			case "tokenizer.ggml.tokens":
				toks = kv.Value.V.([]string)
			case "tokenizer.ggml.scores":
				scores = kv.Value.V.([]float32)
			case "tokenizer.ggml.token_type":
				types = kv.Value.V.([]int32)
			}
		}
		if v.size != n || len(toks) != n || len(scores) != n || len(types) != n {
			t.Fatalf("n=%d: sizes %d %d %d %d", n, v.size, len(toks), len(scores), len(types))
		}
		seen := map[string]bool{}
		for i, tok := range toks {
			if seen[tok] {
				t.Fatalf("n=%d: duplicate token %q", n, tok)
			}
			seen[tok] = true
			if i > 259 && scores[i] >= scores[i-1] {
				t.Fatalf("n=%d: scores not descending at %d", n, i)
			}
		}
		if toks[0] != "<unk>" || toks[2] != "</s>" || toks[3] != "<0x00>" || toks[258] != "<0xFF>" || types[258] != typeByte {
			t.Errorf("n=%d: specials %v", n, toks[:4])
		}
		if n >= 512 && (!seen["▁the"] || !seen["e"] || !seen["▁"]) {
			t.Errorf("n=%d: common pieces missing", n)
		}
		if n == 32000 && !seen["▁Once"] {
			t.Error("▁Once missing")
		}
	}
}

func TestFillNormal(t *testing.T) {
	f := make([]float32, 1<<20)
	fillNormal(f, 12345, 2)
	mean, std := stats(f)
	if math.Abs(mean) > 0.01 || math.Abs(std-2) > 0.01 {
		t.Errorf("mean %v std %v", mean, std)
	}
	var within float64
	for _, v := range f {
		if math.Abs(float64(v)) < 2 {
			within++
		}
	}
	// A normal has 68.3% of its mass within one σ; Irwin–Hall(4) 66.7%.
	if frac := within / float64(len(f)); frac < 0.66 || frac > 0.69 {
		t.Errorf("%.3f within 1σ", frac)
	}
}

// BenchmarkTinyLlamaQ4_0 generates the whole 1.1B-parameter model (to
// io.Discard); run with -benchtime=1x.
func BenchmarkTinyLlamaQ4_0(b *testing.B) {
	s, _ := Preset("tinyllama-1.1b")
	for i := 0; i < b.N; i++ {
		n, err := WriteTo(io.Discard, Options{Shape: s, Type: quant.Q4_0, Seed: 1})
		if err != nil {
			b.Fatal(err)
		}
		b.SetBytes(n)
	}
}

// Small MoE and MLA shapes of every such architecture write files the
// model package loads and runs, with the metadata llama.cpp's converter
// writes (expert widths, deepseek2's MLA keys).
func TestMoEShapesLoad(t *testing.T) {
	moe := Shape{Layers: 2, Dim: 64, Heads: 4, KVHeads: 2, HeadDim: 16, FFN: 96, Vocab: 300, Context: 64,
		Experts: 4, ExpertsUsed: 2, ExpertFFN: 32}
	for _, tc := range []struct {
		arch string
		edit func(*Shape)
	}{
		{"llama", nil}, {"qwen3moe", nil}, {"olmoe", nil},
		{"qwen2moe", func(s *Shape) { s.SharedFFN = 48 }},
		{"deepseek2", func(s *Shape) {
			s.SharedFFN, s.DenseLead, s.QLoRA, s.KVLoRA, s.QKNope, s.QKRope, s.VHead = 64, 1, 24, 32, 16, 8, 16
			s.ExpertWeightsNorm, s.ExpertWeightsScale = true, 2
		}},
		{"deepseek2", func(s *Shape) { s.DenseLead, s.KVLoRA, s.QKNope, s.QKRope, s.VHead = 1, 32, 16, 8, 16 }},
		{"deepseek2", func(s *Shape) {
			s.DenseLead, s.KVLoRA, s.QKNope, s.QKRope, s.VHead, s.MLACombined = 1, 32, 16, 8, 16, true
		}},
	} {
		s := moe
		s.Arch = tc.arch
		if tc.edit != nil {
			tc.edit(&s)
		}
		path := filepath.Join(t.TempDir(), tc.arch+".gguf")
		if err := Write(path, Options{Shape: s, Type: quant.Q8_0, Std: 0.1}); err != nil {
			t.Fatalf("%s: %v", tc.arch, err)
		}
		m, err := model.Open(path, model.Options{Threads: 1})
		if err != nil {
			t.Fatalf("%s: %v", tc.arch, err)
		}
		c := m.Config
		if c.NExpert != 4 || c.NExpertUsed != 2 || c.ExpertFFN != 32 || c.SharedFFN != s.SharedFFN || c.NDenseLead != s.DenseLead {
			t.Errorf("%s: config %+v", tc.arch, c)
		}
		if tc.arch == "deepseek2" && (!c.MLA || c.KVLoRA != 32 || c.QKNope != 16 || c.QKRope != 8 || c.VHeadDim != 16 ||
			c.QLoRA != s.QLoRA || c.HeadDim != 40 || c.ExpertNorm != s.ExpertWeightsNorm || c.ExpertScale != float32(s.ExpertWeightsScale)) {
			t.Errorf("deepseek2: config %+v", c)
		}
		if c.KVBCombined != s.MLACombined {
			t.Errorf("%s: attn_kv_b combined %v, written %v", tc.arch, c.KVBCombined, s.MLACombined)
		}
		if got := c.Params(); got != s.Params() {
			t.Errorf("%s: %d params loaded, %d declared", tc.arch, got, s.Params())
		}
		b := &model.Batch{Tokens: []int32{1, 2, 3}, Pos: []int32{0, 1, 2}, Seq: []int32{0, 0, 0}}
		if _, err := m.Forward(b, m.NewFlatCache(1, 8)); err != nil {
			t.Errorf("%s: %v", tc.arch, err)
		}
		m.Close()
	}
}
