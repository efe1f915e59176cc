package tokenizer

import (
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// tinyWordPiece is a small BERT vocabulary in llama.cpp's GGUF spelling.
func tinyWordPiece(t testing.TB) *WordPiece {
	t.Helper()
	toks := []string{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "▁hello", "▁world", "▁un", "aff", "able", "▁!", "▁,", "▁中", "▁e", "▁cafe", "ing", "▁play"}
	types := make([]int32, len(toks))
	for i := range types {
		types[i] = TypeNormal
		if i < 4 {
			types[i] = TypeControl
		}
	}
	v := &Vocab{Model: "bert", Tokens: toks, Types: types, BOS: 2, EOS: 3, UNK: 1, PAD: 0, EOT: -1, AddBOS: true, AddEOS: true}
	tok, err := NewWordPiece(v)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestWordPieceBasic(t *testing.T) {
	tok := tinyWordPiece(t)
	cases := []struct {
		text string
		o    Options
		want []int32
	}{
		{"Hello, WORLD!", Options{}, []int32{4, 10, 5, 9}},
		{"unaffable", Options{AddSpecial: true}, []int32{2, 6, 7, 8, 3}},
		// Accents are stripped, CJK characters are words of their own.
		{"Café中playing", Options{}, []int32{13, 11, 15, 14}},
		// A word with an uncovered part is one [UNK].
		{"unaffablex hello", Options{}, []int32{1, 4}},
		{"[CLS] hello", Options{ParseSpecial: true}, []int32{2, 4}},
		{"\x00\u200b  \t", Options{}, nil},
		{strings.Repeat("e", 101), Options{}, []int32{1}},
	}
	for _, c := range cases {
		if got := tok.Encode(c.text, c.o); !slices.Equal(got, c.want) {
			t.Errorf("Encode(%q) = %v, want %v", c.text, got, c.want)
		}
	}
	if got := tok.Decode([]int32{2, 6, 7, 8, 10, 5, 3}); got != "unaffable , world" {
		t.Errorf("Decode = %q", got)
	}
}

func FuzzWordPieceEncode(f *testing.F) {
	for _, s := range []string{"", "Hello, world!", "Café中playing", "\xff", "[CLS]x"} {
		f.Add(s)
	}
	tok := tinyWordPiece(f)
	f.Fuzz(func(t *testing.T, text string) {
		ids := tok.Encode(text, Options{AddSpecial: true, ParseSpecial: true})
		for _, id := range ids {
			if id < 0 || int(id) >= tok.Vocab().Size() {
				t.Fatalf("id %d out of range", id)
			}
		}
		if s := tok.Decode(ids); !utf8.ValidString(s) {
			t.Fatalf("invalid UTF-8 %q", s)
		}
	})
}

func BenchmarkWordPieceEncode1MB(b *testing.B) {
	tok, ok := loadGGUFTB(b, "ggml-vocab-bert-bge.gguf")
	if !ok {
		return
	}
	text := strings.ToValidUTF8(warAndPeace(b)[:1<<20], "")
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		tok.Encode(text, Options{})
	}
}
