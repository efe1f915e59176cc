package tokenizer

import (
	"encoding/json"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"pagoda/testutil"
)

// vocabCases reads llama.cpp's test-tokenizer-0 vectors: the .inp strings and
// the expected ids of each from the .out file.
func vocabCases(t *testing.T, base string) ([]string, [][]int32) {
	t.Helper()
	inp, err := os.ReadFile(testutil.Shared(t, "models/llama.cpp-vocab/"+base+".inp"))
	if err != nil {
		t.Fatal(err)
	}
	texts := strings.Split(string(inp), "\n__ggml_vocab_test__\n")
	if texts[len(texts)-1] == "" {
		texts = texts[:len(texts)-1]
	}
	outb, err := os.ReadFile(testutil.Shared(t, "models/llama.cpp-vocab/"+base+".out"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(outb), "\n"), "\n")
	if len(lines) != len(texts) {
		t.Fatalf("%s: %d inputs, %d expected lines", base, len(texts), len(lines))
	}
	want := make([][]int32, len(lines))
	for i, l := range lines {
		for _, f := range strings.Fields(l) {
			n, err := strconv.Atoi(f)
			if err != nil {
				t.Fatalf("%s line %d: %v", base, i+1, err)
			}
			want[i] = append(want[i], int32(n))
		}
	}
	return texts, want
}

// checkCases encodes every case with llama.cpp test-tokenizer-0 semantics and
// checks the ids and, when roundTrip, that decoding gives the text back.
func checkCases(t *testing.T, tok Tokenizer, texts []string, want [][]int32, roundTrip bool) {
	t.Helper()
	bad := 0
	for i, text := range texts {
		got := tok.Encode(text, Options{ParseSpecial: true})
		if !slices.Equal(got, want[i]) {
			bad++
			t.Errorf("case %d %q:\n got %v\nwant %v", i, text, got, want[i])
		}
		if roundTrip {
			if dec := tok.Decode(got); dec != text {
				t.Errorf("case %d: Decode(Encode(%q)) = %q", i, text, dec)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d cases differ", bad, len(texts))
	}
}

func llama2Tokenizer(t testing.TB) *SPM {
	t.Helper()
	tok, err := LoadLlama2C(testutil.Shared(t, "models/llama2.c/tokenizer.bin"))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestLlama2CMatchesLlamaSPM(t *testing.T) {
	tok := llama2Tokenizer(t)
	if tok.Vocab().Size() != 32000 {
		t.Fatalf("vocab size %d, want 32000", tok.Vocab().Size())
	}
	texts, want := vocabCases(t, "ggml-vocab-llama-spm.gguf")
	checkCases(t, tok, texts, want, true)
}

func TestTok512Stories(t *testing.T) {
	tok, err := LoadLlama2C(testutil.Shared(t, "models/llama2.c/tok512.bin"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(testutil.Shared(t, "models/llama2.c/stories260K.reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref struct {
		Encode []struct {
			Text   string  `json:"text"`
			BOS    bool    `json:"bos"`
			Tokens []int32 `json:"tokens"`
		} `json:"encode"`
		Greedy struct {
			Tokens []int32 `json:"tokens"`
			Text   string  `json:"text"`
		} `json:"greedy"`
	}
	if err := json.Unmarshal(b, &ref); err != nil {
		t.Fatal(err)
	}
	if len(ref.Encode) == 0 || len(ref.Greedy.Tokens) == 0 {
		t.Fatal("reference has no encode/greedy cases")
	}
	// run.c strips the leading space of the first piece after BOS.
	if got := tok.Decode(ref.Greedy.Tokens); got != ref.Greedy.Text {
		t.Errorf("Decode(greedy tokens) =\n%q\nwant\n%q", got, ref.Greedy.Text)
	}
	for _, c := range ref.Encode {
		got := tok.Encode(c.Text, Options{AddSpecial: c.BOS})
		if !slices.Equal(got, c.Tokens) {
			t.Errorf("Encode(%q) = %v, want %v", c.Text, got, c.Tokens)
		}
		if dec := tok.Decode(got); dec != c.Text {
			t.Errorf("Decode = %q, want %q", dec, c.Text)
		}
	}
}
