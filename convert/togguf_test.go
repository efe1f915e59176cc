package convert

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"pagoda/model"
	"pagoda/quant"
	"pagoda/testutil"
	"pagoda/tokenizer"
)

type storiesRef struct {
	Greedy struct {
		Tokens []int32 `json:"tokens"`
	} `json:"greedy"`
	Encode []struct {
		Text   string  `json:"text"`
		BOS    bool    `json:"bos"`
		Tokens []int32 `json:"tokens"`
	} `json:"encode"`
}

func loadStoriesRef(t *testing.T) *storiesRef {
	b, err := os.ReadFile(testutil.Shared(t, "models/llama2.c/stories260K.reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var r storiesRef
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return &r
}

// greedy decodes steps tokens after BOS on a flat cache.
func greedy(t *testing.T, m *model.Model, steps int) []int32 {
	t.Helper()
	cache := model.NewFlatCache(&m.Config, 1, steps+1)
	out := []int32{1}
	for s := 0; s < steps; s++ {
		pos := int32(len(out) - 1)
		logits, err := m.Forward(&model.Batch{Tokens: out[len(out)-1:], Pos: []int32{pos}, Seq: []int32{0}}, cache)
		if err != nil {
			t.Fatal(err)
		}
		best := 0
		for i, v := range logits {
			if v > logits[best] {
				best = i
			}
		}
		out = append(out, int32(best))
	}
	return out
}

// checkStories loads a converted stories260K and wants the reference greedy
// tokens and tokenizations from its own (embedded) tokenizer.
func checkStories(t *testing.T, path string, ref *storiesRef, steps int) {
	t.Helper()
	m, err := model.Open(path, model.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	got := greedy(t, m, steps)
	for i := range got {
		if got[i] != ref.Greedy.Tokens[i] {
			t.Fatalf("greedy token %d: got %d, want %d (got %v)", i, got[i], ref.Greedy.Tokens[i], got[:i+1])
		}
	}
	tok := m.Tokenizer()
	if tok == nil {
		t.Fatal("converted file has no tokenizer")
	}
	if len(ref.Encode) == 0 {
		t.Fatal("reference has no tokenizations")
	}
	for _, e := range ref.Encode {
		ids := tok.Encode(e.Text, tokenizer.Options{AddSpecial: e.BOS})
		if !reflect.DeepEqual(ids, e.Tokens) {
			t.Errorf("encode %q: %v, want %v", e.Text, ids, e.Tokens)
		}
	}
}

func TestToGGUFStories(t *testing.T) {
	ref := loadStoriesRef(t)
	tok := testutil.Shared(t, "models/llama2.c/tok512.bin")
	dir := t.TempDir()
	for _, c := range []struct{ name, in string }{
		{"llama2c", testutil.Shared(t, "models/llama2.c/stories260K.bin")},
		{"hf", testutil.Shared(t, "models/derived/stories260K-hf")},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := filepath.Join(dir, c.name+".gguf")
			if err := ToGGUF(c.in, out, ConvertOptions{Tokenizer: tok}); err != nil {
				t.Fatal(err)
			}
			f := readGGUF(t, out)
			if ft, _ := f.Uint("general.file_type"); ft != 0 {
				t.Errorf("general.file_type %d, want 0 (all F32)", ft)
			}
			for _, tt := range f.Tensors {
				if tt.Type != quant.F32 {
					t.Errorf("tensor %s is %s, want F32 as stored", tt.Name, tt.Type)
				}
			}
			if f.Tensor("output.weight") != nil {
				t.Error("tied model got an output.weight")
			}
			checkStories(t, out, ref, 32)
		})
	}
}

// TestQuantizeFromOtherFormats quantizes llama2.c and HF inputs straight to
// Q8_0, the tokenizer coming from tok512.bin.
func TestQuantizeFromOtherFormats(t *testing.T) {
	ref := loadStoriesRef(t)
	tok := testutil.Shared(t, "models/llama2.c/tok512.bin")
	dir := t.TempDir()
	for _, c := range []struct{ name, in string }{
		{"llama2c", testutil.Shared(t, "models/llama2.c/stories260K.bin")},
		{"hf", testutil.Shared(t, "models/derived/stories260K-hf")},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := filepath.Join(dir, c.name+".gguf")
			var warned []string
			err := Quantize(c.in, out, QuantizeOptions{Type: quant.Q8_0, Tokenizer: tok, Warn: func(s string) { warned = append(warned, s) }})
			if err != nil {
				t.Fatal(err)
			}
			f := readGGUF(t, out)
			for _, tt := range f.Tensors {
				want := quant.Q8_0
				switch {
				case len(tt.Dims) == 1:
					want = quant.F32
				case tt.Dims[0] == 172:
					// Rows of 172 fit no block type: F16.
					want = quant.F16
				}
				if tt.Type != want {
					t.Errorf("%s %v: %s, want %s", tt.Name, tt.Dims, tt.Type, want)
				}
			}
			if len(warned) != 1 {
				t.Errorf("warnings %q, want one about the ffn_down fallback", warned)
			}
			checkStories(t, out, ref, 32)
		})
	}
}
