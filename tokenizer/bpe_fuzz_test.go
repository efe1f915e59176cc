package tokenizer

import (
	"testing"

	"pagoda/testutil"
)

func fuzzBPETokenizer(f *testing.F, name string) *BPE {
	p := testutil.Shared(f, "models/llama.cpp-vocab/ggml-vocab-"+name+".gguf")
	v, merges := bpeVocabFromGGUF(&testing.T{}, p)
	if v == nil {
		f.Skip("not a gpt2 vocabulary")
	}
	tok, err := NewBPE(v, merges)
	if err != nil {
		f.Fatal(err)
	}
	return tok
}

// FuzzBPEEncode: byte-level BPE must give back any input, valid UTF-8 or
// not, and special-looking text must survive when ParseSpecial is off.
func FuzzBPEEncode(f *testing.F) {
	gpt2 := fuzzBPETokenizer(f, "gpt-2")
	coder := fuzzBPETokenizer(f, "deepseek-coder")
	for _, s := range preSeeds {
		f.Add(s)
	}
	f.Add("<|endoftext|> hi")
	f.Fuzz(func(t *testing.T, s string) {
		for _, tok := range []*BPE{gpt2, coder} {
			ids := tok.Encode(s, Options{})
			// Vocabularies may lack bytes that never occur in UTF-8
			// (deepseek-coder has no 0xC0, 0xF5..0xFF); those are dropped.
			representable := true
			for i := 0; i < len(s); i++ {
				if tok.byteTok[s[i]] < 0 {
					representable = false
				}
			}
			if got := tok.Decode(ids); representable && got != s {
				t.Fatalf("pre %q: %q -> %v -> %q", tok.v.Pre, s, ids, got)
			}
			for _, id := range tok.Encode(s, Options{ParseSpecial: true, AddSpecial: true}) {
				if id < 0 || int(id) >= len(tok.v.Tokens) {
					t.Fatalf("id %d out of range", id)
				}
			}
		}
	})
}
