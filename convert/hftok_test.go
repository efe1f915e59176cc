package convert

import (
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"pagoda/gguf"
	"pagoda/testutil"
	"pagoda/tokenizer"
)

// TestHFTokenizerKV converts real tokenizer.json files to GGUF metadata
// and wants the GGUF-loaded tokenizer to give llama.cpp's ids for its
// test strings.
func TestHFTokenizerKV(t *testing.T) {
	for _, c := range []struct{ json, vocab, pre string }{
		{"tokenizers/llama3/tokenizer.json", "llama-bpe", "llama-bpe"},
		{"tokenizers/qwen3/tokenizer.json", "qwen2", "qwen2"},
	} {
		t.Run(c.vocab, func(t *testing.T) {
			tj := testutil.Shared(t, "models/"+c.json)
			inp := testutil.Shared(t, "models/llama.cpp-vocab/ggml-vocab-"+c.vocab+".gguf.inp")
			outp := testutil.Shared(t, "models/llama.cpp-vocab/ggml-vocab-"+c.vocab+".gguf.out")
			kv, err := tokenizerKV(tj)
			if err != nil {
				t.Fatal(err)
			}
			w := gguf.NewWriter()
			for _, e := range kv {
				if err := w.Set(e.Key, e.Value); err != nil {
					t.Fatal(err)
				}
			}
			p := filepath.Join(t.TempDir(), "vocab.gguf")
			if err := w.WriteFile(p); err != nil {
				t.Fatal(err)
			}
			f := readGGUF(t, p)
			if pre, _ := f.String("tokenizer.ggml.pre"); pre != c.pre {
				t.Errorf("tokenizer.ggml.pre %q, want %q", pre, c.pre)
			}
			tok, err := tokenizer.FromGGUF(f)
			if err != nil {
				t.Fatal(err)
			}
			ib, _ := os.ReadFile(inp)
			ob, _ := os.ReadFile(outp)
			texts := strings.Split(string(ib), "\n__ggml_vocab_test__\n")
			lines := strings.Split(string(ob), "\n")
			n, bad := 0, 0
			for i, text := range texts {
				if i == len(texts)-1 && text == "" {
					break
				}
				var want []int32
				for _, s := range strings.Fields(lines[i]) {
					v, _ := strconv.Atoi(s)
					want = append(want, int32(v))
				}
				got := tok.Encode(text, tokenizer.Options{})
				n++
				if !reflect.DeepEqual(got, want) && !(len(got) == 0 && len(want) == 0) {
					bad++
					if bad <= 3 {
						t.Errorf("%q: %v, want %v", text, got, want)
					}
				}
			}
			if n < 40 || bad > 0 {
				t.Errorf("%d of %d strings differ", bad, n)
			}
		})
	}
}

// TestToGGUFHFTokenizer: an HF directory's own tokenizer.json is converted
// when it is byte-level BPE, and left out with a warning otherwise.
func TestToGGUFHFTokenizer(t *testing.T) {
	hf := testutil.Shared(t, "models/derived/stories260K-hf")
	for _, c := range []struct {
		tok   string
		model string // "" = no tokenizer metadata, one warning
	}{
		{"tokenizers/llama3/tokenizer.json", "gpt2"},
		{"tokenizers/mistral-7b/tokenizer.json", ""},
	} {
		t.Run(c.tok, func(t *testing.T) {
			dir := t.TempDir()
			for _, name := range []string{"config.json", "model.safetensors"} {
				if err := os.Symlink(filepath.Join(hf, name), filepath.Join(dir, name)); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Symlink(testutil.Shared(t, "models/"+c.tok), filepath.Join(dir, "tokenizer.json")); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "m.gguf")
			var warned []string
			if err := ToGGUF(dir, out, ConvertOptions{Warn: func(s string) { warned = append(warned, s) }}); err != nil {
				t.Fatal(err)
			}
			f := readGGUF(t, out)
			got, _ := f.String("tokenizer.ggml.model")
			if got != c.model {
				t.Errorf("tokenizer.ggml.model %q, want %q", got, c.model)
			}
			if (c.model == "") != (len(warned) == 1) || len(warned) > 1 {
				t.Errorf("warnings %q", warned)
			}
			if c.model != "" {
				if toks, _ := f.Strings("tokenizer.ggml.tokens"); len(toks) != 128256 {
					t.Errorf("%d tokens, want 128256", len(toks))
				}
				if m, _ := f.Strings("tokenizer.ggml.merges"); len(m) != 280147 {
					t.Errorf("%d merges, want 280147", len(m))
				}
			}
		})
	}
}
