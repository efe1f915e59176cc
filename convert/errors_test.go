package convert

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"pagoda/gguf"
	"pagoda/quant"
	"pagoda/testutil"
)

func TestParseFileType(t *testing.T) {
	for _, c := range []struct {
		in  string
		typ quant.Type
		mix string
	}{
		{"Q4_K_M", quant.Q4_K, "M"}, {"q4_k", quant.Q4_K, "M"}, {"Q4_K_S", quant.Q4_K, "S"},
		{"Q3_K_L", quant.Q3_K, "L"}, {"Q5_K", quant.Q5_K, "M"}, {"Q2_K", quant.Q2_K, ""},
		{"Q8_0", quant.Q8_0, ""}, {"q4_0", quant.Q4_0, ""}, {"F16", quant.F16, ""}, {"bf16", quant.BF16, ""},
		{"F32", quant.F32, ""}, {"Q6_K", quant.Q6_K, ""}, {"IQ4_XS", quant.IQ4_XS, ""}, {"15", quant.Q4_K, "M"},
		{"7", quant.Q8_0, ""},
	} {
		typ, mix, err := ParseFileType(c.in)
		if err != nil || typ != c.typ || mix != c.mix {
			t.Errorf("ParseFileType(%q) = %s, %q, %v; want %s, %q", c.in, typ, mix, err, c.typ, c.mix)
		}
	}
	for _, bad := range []string{"", "Q4", "Q7_0", "Q4_K_L", "IQ2_XXS", "Q2_K_S", "99", "q8_k"} {
		if _, _, err := ParseFileType(bad); err == nil {
			t.Errorf("ParseFileType(%q) accepted", bad)
		}
	}
}

func TestQuantizeErrors(t *testing.T) {
	in := testutil.Shared(t, "golden/models/g-llama-gqa.F32.gguf")
	q8 := testutil.Shared(t, "golden/models/g-llama-gqa.Q8_0.gguf")
	dir := t.TempDir()
	out := filepath.Join(dir, "out.gguf")

	// Unsupported targets.
	for _, o := range []QuantizeOptions{
		{Type: quant.Q8_K}, {Type: quant.IQ2_XXS}, {Type: quant.TQ1_0}, {Type: quant.Type(77)},
		{Type: quant.Q4_K, Mix: "X"}, {Type: quant.Q8_0, Mix: "M"}, {Type: quant.Q2_K, Mix: "S"},
		{Type: quant.Q4_0, OutputType: quant.IQ2_XS},
	} {
		err := Quantize(in, out, o)
		if err == nil {
			t.Errorf("%+v: no error", o)
			continue
		}
		t.Logf("%s/%q: %v", o.Type, o.Mix, err)
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("a failed quantization left an output file")
	}

	// A truncated input.
	b, err := os.ReadFile(in)
	if err != nil {
		t.Fatal(err)
	}
	trunc := filepath.Join(dir, "trunc.gguf")
	if err := os.WriteFile(trunc, b[:len(b)*2/3], 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Quantize(trunc, out, QuantizeOptions{Type: quant.Q4_0}); err == nil {
		t.Error("truncated input: no error")
	} else {
		t.Log(err)
	}
	if err := Quantize(filepath.Join(dir, "missing.gguf"), out, QuantizeOptions{Type: quant.Q4_0}); err == nil {
		t.Error("missing input: no error")
	}

	// Requantizing needs permission, and names the tensor.
	err = Quantize(q8, out, QuantizeOptions{Type: quant.Q4_0})
	if err == nil || !strings.Contains(err.Error(), `"output.weight"`) || !strings.Contains(err.Error(), "AllowRequantize") {
		t.Errorf("requantize without permission: %v", err)
	}
	var warnings []string
	o := QuantizeOptions{Type: quant.Q4_0, AllowRequantize: true, Warn: func(s string) { warnings = append(warnings, s) }}
	if err := Quantize(q8, out, o); err != nil {
		t.Fatal(err)
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "requantizing") {
		t.Errorf("warnings %q, want one about requantizing", warnings)
	}
	// The same type is a copy, not a requantization.
	if err := Quantize(q8, out, QuantizeOptions{Type: quant.Q8_0, Mix: "pure", Warn: func(s string) { t.Error(s) }}); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(out)
	want, _ := os.ReadFile(q8)
	if string(got) != string(want) {
		t.Error("Q8_0 -> Q8_0 pure is not a byte copy")
	}

	// Non-finite weights fail with the tensor's name, and leave no file.
	w := gguf.NewWriter()
	w.Set("general.architecture", "llama")
	row := make([]float32, 64)
	row[5] = float32(math.NaN())
	if err := w.AddTensor("blk.0.attn_q.weight", quant.F32, []uint64{32, 2}, f32Bytes(row)); err != nil {
		t.Fatal(err)
	}
	nan := filepath.Join(dir, "nan.gguf")
	if err := w.WriteFile(nan); err != nil {
		t.Fatal(err)
	}
	nanOut := filepath.Join(dir, "nan-q.gguf")
	err = Quantize(nan, nanOut, QuantizeOptions{Type: quant.Q4_0, Mix: "pure"})
	if err == nil || !strings.Contains(err.Error(), `"blk.0.attn_q.weight"`) {
		t.Errorf("NaN weight: %v", err)
	} else {
		t.Log(err)
	}
	if _, err := os.Stat(nanOut); err == nil {
		t.Error("a failed quantization left an output file")
	}
}
