package convert

import (
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"pagoda/arch"
	"pagoda/model"
	"pagoda/quant"
	"pagoda/synth"
)

// synthShape: 8 layers so that use_more_bits picks layers 0, 3, 6, 7;
// 8 heads over 2 KV heads (GQA 4, which Q2_K and IQ4_NL look at).
var synthShape = synth.Shape{Arch: "llama", Layers: 8, Dim: 256, Heads: 8, KVHeads: 2, HeadDim: 32,
	FFN: 256, Vocab: 512, Context: 256}

func writeSynth(t *testing.T, name string, s synth.Shape) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name+".gguf")
	if err := synth.Write(p, synth.Options{Shape: s, Seed: 7}); err != nil {
		t.Fatal(err)
	}
	return p
}

// want is llama.cpp's choice for one tensor of the 8-layer model, written
// out from llama_tensor_get_type_impl case by case.
type want struct {
	base, output, embd quant.Type
	attnV, ffnDown     func(layer int) quant.Type
	attnOut            quant.Type // 0 = base
}

var moreBits = map[int]bool{0: true, 3: true, 6: true, 7: true}

func ifLayers(set func(int) bool, yes, no quant.Type) func(int) quant.Type {
	return func(l int) quant.Type {
		if set(l) {
			return yes
		}
		return no
	}
}

func always(t quant.Type) func(int) quant.Type { return func(int) quant.Type { return t } }

func inMoreBits(l int) bool { return moreBits[l] }

var mixCases = map[string]want{
	"Q4_K_M": {base: quant.Q4_K, output: quant.Q6_K, embd: quant.Q4_K,
		attnV: ifLayers(inMoreBits, quant.Q6_K, quant.Q4_K), ffnDown: ifLayers(inMoreBits, quant.Q6_K, quant.Q4_K)},
	"Q4_K_S": {base: quant.Q4_K, output: quant.Q6_K, embd: quant.Q4_K,
		attnV:   ifLayers(func(l int) bool { return l < 4 }, quant.Q5_K, quant.Q4_K),
		ffnDown: ifLayers(func(l int) bool { return l < 1 }, quant.Q5_K, quant.Q4_K)},
	"Q5_K_M": {base: quant.Q5_K, output: quant.Q6_K, embd: quant.Q5_K,
		attnV: ifLayers(inMoreBits, quant.Q6_K, quant.Q5_K), ffnDown: ifLayers(inMoreBits, quant.Q6_K, quant.Q5_K)},
	"Q5_K_S": {base: quant.Q5_K, output: quant.Q6_K, embd: quant.Q5_K, attnV: always(quant.Q5_K), ffnDown: always(quant.Q5_K)},
	"Q3_K_S": {base: quant.Q3_K, output: quant.Q6_K, embd: quant.Q3_K, attnV: always(quant.Q3_K), ffnDown: always(quant.Q3_K)},
	"Q3_K_M": {base: quant.Q3_K, output: quant.Q6_K, embd: quant.Q3_K,
		attnV:   ifLayers(func(l int) bool { return l < 2 }, quant.Q5_K, quant.Q4_K),
		ffnDown: always(quant.Q4_K), attnOut: quant.Q4_K},
	"Q3_K_L": {base: quant.Q3_K, output: quant.Q6_K, embd: quant.Q3_K, attnV: always(quant.Q5_K),
		ffnDown: always(quant.Q5_K), attnOut: quant.Q5_K},
	"Q2_K": {base: quant.Q2_K, output: quant.Q6_K, embd: quant.Q2_K, attnV: always(quant.Q4_K),
		ffnDown: always(quant.Q3_K), attnOut: quant.Q3_K},
	"Q6_K": {base: quant.Q6_K, output: quant.Q6_K, embd: quant.Q6_K, attnV: always(quant.Q6_K), ffnDown: always(quant.Q6_K)},
	"Q8_0": {base: quant.Q8_0, output: quant.Q8_0, embd: quant.Q8_0, attnV: always(quant.Q8_0), ffnDown: always(quant.Q8_0)},
	"Q4_0": {base: quant.Q4_0, output: quant.Q6_K, embd: quant.Q4_0, attnV: always(quant.Q4_0), ffnDown: always(quant.Q4_0)},
	"Q5_1": {base: quant.Q5_1, output: quant.Q6_K, embd: quant.Q5_1, attnV: always(quant.Q5_1), ffnDown: always(quant.Q5_1)},
	"IQ4_NL": {base: quant.IQ4_NL, output: quant.Q6_K, embd: quant.IQ4_NL, attnV: always(quant.Q5_K),
		ffnDown: ifLayers(func(l int) bool { return l < 1 }, quant.Q5_K, quant.IQ4_NL)},
	"F16":  {base: quant.F16, output: quant.F16, embd: quant.F16, attnV: always(quant.F16), ffnDown: always(quant.F16)},
	"BF16": {base: quant.BF16, output: quant.BF16, embd: quant.BF16, attnV: always(quant.BF16), ffnDown: always(quant.BF16)},
}

func (w want) typeOf(name string) quant.Type {
	l := layerOf(name)
	switch {
	case name == "output.weight":
		return w.output
	case name == "token_embd.weight":
		return w.embd
	case strings.HasSuffix(name, "_norm.weight"):
		return quant.F32
	case strings.HasSuffix(name, "attn_v.weight"):
		return w.attnV(l)
	case strings.HasSuffix(name, "ffn_down.weight"):
		return w.ffnDown(l)
	case strings.HasSuffix(name, "attn_output.weight") && w.attnOut != 0:
		return w.attnOut
	}
	return w.base
}

func TestDefaultMixes(t *testing.T) {
	in := writeSynth(t, "mix", synthShape)
	for name, w := range mixCases {
		t.Run(name, func(t *testing.T) {
			typ, mix, err := ParseFileType(name)
			if err != nil {
				t.Fatal(err)
			}
			plan, err := Plan(in, QuantizeOptions{Type: typ, Mix: mix, Warn: func(m string) { t.Error("unexpected warning:", m) }})
			if err != nil {
				t.Fatal(err)
			}
			if len(plan) != 3+9*8 {
				t.Fatalf("%d tensors", len(plan))
			}
			for _, p := range plan {
				if e := w.typeOf(p.Name); p.To != e {
					t.Errorf("%s: %s, want %s", p.Name, p.To, e)
				}
			}
		})
	}
}

func TestMixVariants(t *testing.T) {
	tied := synthShape
	tied.Tied = true
	odd := synthShape
	odd.FFN = 288 // a multiple of 32 but not of 256
	tiedIn, oddIn := writeSynth(t, "tied", tied), writeSynth(t, "odd", odd)
	plain := writeSynth(t, "plain", synthShape)

	types := func(in string, o QuantizeOptions) map[string]quant.Type {
		t.Helper()
		plan, err := Plan(in, o)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]quant.Type{}
		for _, p := range plan {
			m[p.Name] = p.To
		}
		return m
	}
	// Tied: token_embd doubles as the output and gets the output's type.
	if got := types(tiedIn, QuantizeOptions{Type: quant.Q4_K})["token_embd.weight"]; got != quant.Q6_K {
		t.Errorf("tied Q4_K_M token_embd: %s, want Q6_K", got)
	}
	if got := types(tiedIn, QuantizeOptions{Type: quant.Q8_0})["token_embd.weight"]; got != quant.Q8_0 {
		t.Errorf("tied Q8_0 token_embd: %s, want Q8_0", got)
	}
	// Overrides.
	m := types(plain, QuantizeOptions{Type: quant.Q4_K, OutputType: quant.Q8_0, EmbeddingType: quant.Q4_0})
	if m["output.weight"] != quant.Q8_0 || m["token_embd.weight"] != quant.Q4_0 {
		t.Errorf("overrides: output %s, token_embd %s; want Q8_0, Q4_0", m["output.weight"], m["token_embd.weight"])
	}
	// Pure ignores the mix but keeps 1-D tensors F32.
	for n, typ := range types(plain, QuantizeOptions{Type: quant.Q4_K, Mix: "pure"}) {
		want := quant.Q4_K
		if strings.HasSuffix(n, "_norm.weight") {
			want = quant.F32
		}
		if typ != want {
			t.Errorf("pure: %s is %s, want %s", n, typ, want)
		}
	}
	// Rows of 288: Q4_K falls back to Q5_0, Q6_K to Q8_0, Q2_K/Q3_K to
	// Q4_0, Q5_K to Q5_1 (tensor_type_fallback).
	var warned []string
	m = types(oddIn, QuantizeOptions{Type: quant.Q4_K, Warn: func(s string) { warned = append(warned, s) }})
	for l := 0; l < 8; l++ {
		want := quant.Q5_0
		if moreBits[l] {
			want = quant.Q8_0
		}
		if got := m[fmt.Sprintf("blk.%d.ffn_down.weight", l)]; got != want {
			t.Errorf("Q4_K_M rows of 288, layer %d ffn_down: %s, want %s", l, got, want)
		}
	}
	if len(warned) != 1 {
		t.Errorf("warnings %q, want one about fallbacks", warned)
	}
	for typ, want := range map[quant.Type]quant.Type{quant.Q2_K: quant.Q4_0, quant.Q3_K: quant.Q4_0, quant.Q5_K: quant.Q5_1, quant.Q6_K: quant.Q8_0} {
		if got := types(oddIn, QuantizeOptions{Type: typ, Mix: "pure", Warn: func(string) {}})["blk.0.ffn_down.weight"]; got != want {
			t.Errorf("pure %s, rows of 288: %s, want %s", typ, got, want)
		}
	}
}

// TestQuantizeSynthRuns quantizes a whole model with the default Q4_K mix and
// checks that the file holds the planned types and that the model it makes
// computes nearly the F32 model's logits.
func TestQuantizeSynthRuns(t *testing.T) {
	in := writeSynth(t, "run", synthShape)
	out := filepath.Join(t.TempDir(), "q4km.gguf")
	var prog []int
	if err := Quantize(in, out, QuantizeOptions{Type: quant.Q4_K, Threads: 2, Progress: func(d, n int) { prog = append(prog, d) }}); err != nil {
		t.Fatal(err)
	}
	if len(prog) != 75 || prog[74] != 75 {
		t.Errorf("progress calls %v", prog)
	}
	f := readGGUF(t, out)
	w := mixCases["Q4_K_M"]
	for _, tt := range f.Tensors {
		if e := w.typeOf(tt.Name); tt.Type != e {
			t.Errorf("%s: %s in the file, want %s", tt.Name, tt.Type, e)
		}
	}
	if ft, _ := f.Uint("general.file_type"); ft != 15 {
		t.Errorf("general.file_type %d, want 15 (MOSTLY_Q4_K_M)", ft)
	}
	if qv, _ := f.Uint("general.quantization_version"); qv != 2 {
		t.Errorf("general.quantization_version %d, want 2", qv)
	}
	logits := func(path string) []float32 {
		m, err := model.Open(path, model.Options{Threads: 2})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		toks := []int32{1, 300, 301, 302}
		cache := model.NewFlatCache(&m.Config, 1, len(toks))
		b := &model.Batch{Tokens: toks, Pos: []int32{0, 1, 2, 3}, Seq: make([]int32, 4)}
		l, err := m.Forward(b, cache)
		if err != nil {
			t.Fatal(err)
		}
		return append([]float32(nil), l...)
	}
	ref := logits(in)
	relErr := func(path string) float64 {
		got := logits(path)
		var num, den float64
		for i := range ref {
			d := float64(ref[i] - got[i])
			num += d * d
			den += float64(ref[i]) * float64(ref[i])
		}
		return math.Sqrt(num / den)
	}
	other := func(typ quant.Type, mix string) string {
		p := filepath.Join(t.TempDir(), "x.gguf")
		if err := Quantize(in, p, QuantizeOptions{Type: typ, Mix: mix, Threads: 2}); err != nil {
			t.Fatal(err)
		}
		return p
	}
	km, pure, q8 := relErr(out), relErr(other(quant.Q4_K, "pure")), relErr(other(quant.Q8_0, ""))
	t.Logf("logits vs F32, relative RMS: Q8_0 %.4f, Q4_K_M %.4f, Q4_K pure %.4f", q8, km, pure)
	// Random weights compound errors through 8 layers; what must hold is
	// that the files compute the model (small Q8_0 error) and that the mix's
	// extra bits help.
	if !(q8 < 0.04) || !(km < pure) || !(km < 0.25) {
		t.Errorf("relative RMS logit errors Q8_0 %.4f (want < 0.04), Q4_K_M %.4f (want < pure %.4f and < 0.25)", q8, km, pure)
	}
}

// Declared tensors get their quantization category from their role; for
// every architecture Pagoda runs that must be what llama.cpp's name
// fragments give, or files would quantize differently from llama-quantize.
func TestRoleCategoryMatchesFragments(t *testing.T) {
	d := arch.Dims{Embd: 8, Heads: 2, KVHeads: 1, HeadDim: 4, FFN: 16, Vocab: 10, Bias: true}
	seen := map[category]bool{}
	for _, name := range arch.Names() {
		for _, tt := range arch.Lookup(name).Tensors(d, 2) {
			c := tensorCategory(tt.Name)
			if f := fragmentCategory(tt.Name); c != f {
				t.Errorf("%s %s: role category %d, fragment category %d", name, tt.Name, c, f)
			}
			seen[c] = true
		}
	}
	for _, c := range []category{catTokenEmbd, catOutput, catAttnQ, catAttnK, catAttnV, catAttnOutput, catFFNGate, catFFNUp, catFFNDown, catOther} {
		if !seen[c] {
			t.Errorf("no declared tensor has category %d", c)
		}
	}
}
