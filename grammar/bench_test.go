package grammar

import (
	"fmt"
	"testing"

	"pagoda/model"
	"pagoda/testutil"
	"pagoda/tokenizer"
)

// benchStates are document prefixes of testSchemas["person"]: the states
// a step starts from. "string" is the worst case for the trie walk (almost
// every token can continue a string, so little is pruned).
var benchStates = []struct{ name, prefix string }{
	{"start", ``},
	{"key", `{"name":"Bo",`},
	{"string", `{"name":"B`},
	{"number", `{"name":"Bo","age":1`},
	{"enum", `{"name":"Bo","age":1,"tags":[`},
}

func benchVocabs(b *testing.B) []struct {
	name string
	v    *Vocab
} {
	var out []struct {
		name string
		v    *Vocab
	}
	add := func(name string, tok tokenizer.Tokenizer) {
		out = append(out, struct {
			name string
			v    *Vocab
		}{fmt.Sprintf("%s-%d", name, tok.Vocab().Size()), NewVocab(tok)})
	}
	m, err := model.Open(testutil.Shared(b, "models/gguf/stories260K.gguf"), model.Options{Threads: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	add("stories260K", m.Tokenizer())
	if tok, err := tokenizer.Load(testutil.Shared(b, "models/llama.cpp-vocab/ggml-vocab-llama-spm.gguf")); err == nil {
		add("llama-spm", tok)
	} else {
		b.Fatal(err)
	}
	if tok, err := tokenizer.LoadHF(testutil.Shared(b, "models/tokenizers/qwen3/tokenizer.json")); err == nil {
		add("qwen3", tok)
	} else {
		b.Fatal(err)
	}
	return out
}

// BenchmarkMask is the cost of one masked step, applying the mask to the
// logits included: cold walks the whole vocabulary trie (a state never seen
// before), lex takes the lexeme's cached mask and walks only the tokens
// that may end the lexeme (a known lexeme state over a new stack), warm
// takes the parser state's cached mask.
func BenchmarkMask(b *testing.B) {
	g, err := CompileSchema([]byte(testSchemas["person"]))
	if err != nil {
		b.Fatal(err)
	}
	for _, bv := range benchVocabs(b) {
		for _, st := range benchStates {
			for _, mode := range []string{"cold", "lex", "warm"} {
				b.Run(bv.name+"/"+st.name+"/"+mode, func(b *testing.B) {
					c := New(g, bv.v)
					c.noState = mode != "warm"
					c.noLex = mode == "cold"
					m := c.Matcher()
					if st.prefix != "" {
						if err := m.AcceptBytes([]byte(st.prefix)); err != nil {
							b.Fatal(err)
						}
					}
					logits := make([]float32, bv.v.Size())
					allowed := 0
					for b.Loop() {
						if err := m.Mask(logits); err != nil {
							b.Fatal(err)
						}
					}
					for _, w := range m.Allowed() {
						for ; w != 0; w &= w - 1 {
							allowed++
						}
					}
					b.ReportMetric(float64(allowed), "allowed")
					b.ReportMetric(float64(len(bv.v.nodes)), "trie-nodes")
				})
			}
		}
	}
}

// BenchmarkNewVocab is the one-time cost of indexing a 151k vocabulary
// (the server pays it on its first constrained request).
func BenchmarkNewVocab(b *testing.B) {
	tok, err := tokenizer.LoadHF(testutil.Shared(b, "models/tokenizers/qwen3/tokenizer.json"))
	if err != nil {
		b.Fatal(err)
	}
	var v *Vocab
	for b.Loop() {
		v = NewVocab(tok)
	}
	b.ReportMetric(float64(len(v.nodes)), "trie-nodes")
}
