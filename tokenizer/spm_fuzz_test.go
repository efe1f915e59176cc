package tokenizer

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"pagoda/testutil"
)

// tinySPM is a small hand-made SentencePiece vocabulary: <unk>, <s>, </s>,
// the 256 byte tokens and a few merges, so tests and fuzzing work without
// the shared data.
func tinySPM(t testing.TB) *SPM {
	t.Helper()
	v := &Vocab{Model: "llama", BOS: 1, EOS: 2, UNK: 0, PAD: -1, EOT: -1, AddBOS: true, AddSpacePrefix: true}
	add := func(s string, score float32, typ int32) {
		v.Tokens = append(v.Tokens, s)
		v.Scores = append(v.Scores, score)
		v.Types = append(v.Types, typ)
	}
	add("<unk>", 0, TypeUnknown)
	add("<s>", 0, TypeControl)
	add("</s>", 0, TypeControl)
	for b := 0; b < 256; b++ {
		add(fmt.Sprintf("<0x%02X>", b), 0, TypeByte)
	}
	for i, s := range []string{"▁t", "he", "▁the", "nd", "▁a", "▁and", "<s", "s>", "▁", "t", "h", "e", "a", "n", "d", "é", "中", "<", "s", ">"} {
		add(s, -float32(i), TypeNormal)
	}
	tok, err := NewSPM(v)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestTinySPM(t *testing.T) {
	tok := tinySPM(t)
	id := func(s string) int32 { return int32(slices.Index(tok.Vocab().Tokens, s)) }
	cases := []struct {
		text string
		o    Options
		want []int32
	}{
		{"the and", Options{}, []int32{id("▁the"), id("▁and")}},
		{"the", Options{AddSpecial: true}, []int32{1, id("▁the")}},
		{"", Options{AddSpecial: true}, []int32{1}},
		{"", Options{}, nil},
		// "x" is not a token: byte fallback.
		{"x", Options{}, []int32{id("▁"), 3 + 'x'}},
		// Control tokens typed as text are not produced by merging ...
		{"<s>", Options{}, []int32{id("▁"), id("<s"), id(">")}},
		// ... but are recognised with ParseSpecial, and the text after a
		// special token gets the dummy prefix again.
		{"<s>the", Options{ParseSpecial: true}, []int32{1, id("▁the")}},
		{"a<s>", Options{ParseSpecial: true}, []int32{id("▁a"), 1}},
	}
	for _, c := range cases {
		got := tok.Encode(c.text, c.o)
		if !slices.Equal(got, c.want) {
			t.Errorf("Encode(%q, %+v) = %v, want %v", c.text, c.o, got, c.want)
		}
	}
	if got := tok.Decode([]int32{1, id("▁the"), id("▁and"), 2}); got != "the and" {
		t.Errorf("Decode = %q, want %q", got, "the and")
	}
}

func FuzzSPMEncode(f *testing.F) {
	for _, s := range []string{"", " ", "the and", "  x\n\t", "é中😀", "<s>the</s>", "\xff\xfe", "▁▁"} {
		f.Add(s, false)
		f.Add(s, true)
	}
	toks := []*SPM{tinySPM(f)}
	if d := testutil.SharedDir(); d != "" {
		if tok, err := LoadLlama2C(d + "/models/llama2.c/tokenizer.bin"); err == nil {
			toks = append(toks, tok)
		}
	}
	f.Fuzz(func(t *testing.T, text string, special bool) {
		for _, tok := range toks {
			ids := tok.Encode(text, Options{AddSpecial: special, ParseSpecial: special})
			for _, id := range ids {
				if id < 0 || int(id) >= tok.Vocab().Size() {
					t.Fatalf("Encode(%q) gave id %d out of range", text, id)
				}
			}
			dec := tok.Decode(ids)
			if !utf8.ValidString(dec) {
				t.Fatalf("Decode(Encode(%q)) = %q is not valid UTF-8", text, dec)
			}
			// A literal "▁" in the text decodes as a space, as in
			// SentencePiece itself.
			if !special && utf8.ValidString(text) && !strings.Contains(text, spaceMark) && dec != text {
				t.Fatalf("Decode(Encode(%q)) = %q", text, dec)
			}
		}
	})
}

// llama2cBytes writes a tokenizer.bin for tokens and scores.
func llama2cBytes(tokens []string, scores []float32) []byte {
	var buf bytes.Buffer
	maxLen := 0
	for _, s := range tokens {
		maxLen = max(maxLen, len(s))
	}
	binary.Write(&buf, binary.LittleEndian, int32(maxLen))
	for i, s := range tokens {
		binary.Write(&buf, binary.LittleEndian, scores[i])
		binary.Write(&buf, binary.LittleEndian, int32(len(s)))
		buf.WriteString(s)
	}
	return buf.Bytes()
}

func TestParseLlama2CErrors(t *testing.T) {
	good := llama2cBytes([]string{"<unk>", "\n<s>\n", "\n</s>\n", " a", "b"}, []float32{0, 0, 0, -1, -2})
	tok, err := ParseLlama2C(good)
	if err != nil {
		t.Fatal(err)
	}
	if got := tok.Vocab().Tokens[1:4]; !slices.Equal(got, []string{"<s>", "</s>", "▁a"}) {
		t.Errorf("tokens %q, want <s> </s> ▁a", got)
	}
	nan := llama2cBytes([]string{"<unk>", "x", "y"}, []float32{0, float32(math.NaN()), 0})
	neg := slices.Clone(good)
	binary.LittleEndian.PutUint32(neg[4+4:], uint32(0xFFFFFFFF)) // first length -1
	for name, b := range map[string][]byte{
		"empty":      nil,
		"header":     {1, 0},
		"maxlen 0":   {0, 0, 0, 0},
		"truncated":  good[:len(good)-1],
		"half rec":   good[:4+5],
		"negative":   neg,
		"nan score":  nan,
		"two tokens": llama2cBytes([]string{"<unk>", "a"}, []float32{0, 0}),
	} {
		if _, err := ParseLlama2C(b); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := LoadLlama2C("/nonexistent/tokenizer.bin"); err == nil {
		t.Error("missing file: no error")
	}
}

func FuzzLlama2CLoad(f *testing.F) {
	f.Add(llama2cBytes([]string{"<unk>", "\n<s>\n", "\n</s>\n", "<0x41>", " a", "b", " ab"}, []float32{0, 0, 0, 0, -1, -2, -3}))
	if d := testutil.SharedDir(); d != "" {
		if b, err := os.ReadFile(d + "/models/llama2.c/tok512.bin"); err == nil {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		tok, err := ParseLlama2C(b)
		if err != nil {
			return
		}
		ids := tok.Encode("hello <s> wörld", Options{AddSpecial: true, ParseSpecial: true})
		_ = tok.Decode(append(ids, -1, 1<<30))
	})
}
