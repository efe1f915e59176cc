package grammar

import (
	"math"
	"math/rand/v2"
	"testing"

	"pagoda/testutil"
	"pagoda/tokenizer"
)

// TestRealVocabularies samples documents token by token over real
// vocabularies (SentencePiece with ▁ and <0xNN> byte fallback, GPT-2
// byte-level BPE) and checks that the tokenizer's own Decode of the chosen
// ids is a valid document: the matcher reads token bytes as the
// detokenizer writes them.
func TestRealVocabularies(t *testing.T) {
	toks := map[string]func(t *testing.T) (tokenizer.Tokenizer, error){
		"llama-spm": func(t *testing.T) (tokenizer.Tokenizer, error) {
			return tokenizer.Load(testutil.Shared(t, "models/llama.cpp-vocab/ggml-vocab-llama-spm.gguf"))
		},
		"gpt-2": func(t *testing.T) (tokenizer.Tokenizer, error) {
			return tokenizer.Load(testutil.Shared(t, "models/llama.cpp-vocab/ggml-vocab-gpt-2.gguf"))
		},
		"qwen3": func(t *testing.T) (tokenizer.Tokenizer, error) {
			return tokenizer.LoadHF(testutil.Shared(t, "models/tokenizers/qwen3/tokenizer.json"))
		},
	}
	for name, load := range toks {
		t.Run(name, func(t *testing.T) {
			tok, err := load(t)
			if err != nil {
				t.Fatal(err)
			}
			v := NewVocab(tok)
			if len(v.eog) == 0 {
				t.Fatal("no end-of-generation token")
			}
			r := rand.New(rand.NewPCG(5, 9))
			for _, sname := range []string{"person", "refs", "union"} {
				g, err := CompileSchema([]byte(testSchemas[sname]))
				if err != nil {
					t.Fatal(err)
				}
				c := New(g, v)
				for range 2 {
					m := c.Matcher()
					logits := make([]float32, v.Size())
					var ids []int32
					for step := 0; ; step++ {
						if step == 3000 {
							t.Fatalf("%s: no end: %q", sname, tok.Decode(ids))
						}
						for i := range logits {
							logits[i] = float32(r.NormFloat64())
						}
						if err := m.Mask(logits); err != nil {
							t.Fatalf("after %q: %v", tok.Decode(ids), err)
						}
						// Mostly the best allowed token, sometimes EOG or a
						// closing token, so documents end.
						best := int32(-1)
						for i, l := range logits {
							if !math.IsInf(float64(l), -1) && (best < 0 || l > logits[best]) {
								best = int32(i)
							}
						}
						for _, id := range v.eog {
							if !math.IsInf(float64(logits[id]), -1) {
								best = id
							}
						}
						if err := m.Accept(best); err != nil {
							t.Fatal(err)
						}
						if m.Done() {
							break
						}
						ids = append(ids, best)
					}
					if err := parseAndValidate(tok.Decode(ids), []byte(testSchemas[sname])); err != nil {
						t.Errorf("%s: %v", sname, err)
					}
				}
			}
		})
	}
}
