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
