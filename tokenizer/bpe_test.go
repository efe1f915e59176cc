package tokenizer

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"pagoda/gguf"
	"pagoda/testutil"
)

// bpeCases reads a llama.cpp test-tokenizer-0 pair: the .inp strings and
// the expected ids of each (one line per string in .out).
func bpeCases(t *testing.T, inp, out string) ([]string, [][]int32) {
	t.Helper()
	ib, err := os.ReadFile(inp)
	if err != nil {
		t.Fatal(err)
	}
	ob, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	texts := strings.Split(string(ib), "\n__ggml_vocab_test__\n")
	lines := strings.Split(string(ob), "\n")
	n := len(texts)
	if texts[n-1] == "" {
		n--
	}
	if len(lines) < n {
		t.Fatalf("%s: %d expected lines for %d strings", out, len(lines), n)
	}
	want := make([][]int32, n)
	for i := 0; i < n; i++ {
		for _, f := range strings.Fields(lines[i]) {
			v, err := strconv.Atoi(f)
			if err != nil {
				t.Fatalf("%s line %d: %v", out, i+1, err)
			}
			want[i] = append(want[i], int32(v))
		}
	}
	return texts[:n], want
}

// bpeVocabFromGGUF reads the byte-level BPE vocabulary of a GGUF file
// without the loader of this package (which is written separately).
func bpeVocabFromGGUF(t *testing.T, path string) (*Vocab, []string) {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	model, _ := f.String("tokenizer.ggml.model")
	if model != "gpt2" {
		return nil, nil
	}
	v := &Vocab{Model: model, BOS: -1, EOS: -1, UNK: -1, PAD: -1, EOT: -1}
	v.Pre, _ = f.String("tokenizer.ggml.pre")
	toks, _ := f.Strings("tokenizer.ggml.tokens")
	v.Tokens = append([]string(nil), toks...)
	if ty, ok := f.Int32s("tokenizer.ggml.token_type"); ok {
		v.Types = append([]int32(nil), ty...)
	}
	if x, ok := f.Uint("tokenizer.ggml.bos_token_id"); ok {
		v.BOS = int32(x)
	}
	if x, ok := f.Uint("tokenizer.ggml.eos_token_id"); ok {
		v.EOS = int32(x)
	}
	v.AddBOS, _ = f.Bool("tokenizer.ggml.add_bos_token")
	merges, _ := f.Strings("tokenizer.ggml.merges")
	return v, append([]string(nil), merges...)
}

func bpeCompare(t *testing.T, name string, tok Tokenizer, texts []string, want [][]int32) int {
	t.Helper()
	bad := 0
	for i, s := range texts {
		got := tok.Encode(s, Options{ParseSpecial: true})
		if !bpeEqualIDs(got, want[i]) {
			bad++
			if bad <= 5 {
				t.Errorf("%s case %d %q:\n got %v\nwant %v", name, i, s, got, want[i])
			}
		}
		if dec := tok.Decode(tok.Encode(s, Options{})); dec != s {
			t.Errorf("%s case %d: round trip %q -> %q", name, i, s, dec)
		}
	}
	return bad
}

func bpeEqualIDs(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestBPEGGUFVocabs checks every byte-level ("gpt2") vocabulary GGUF of
// llama.cpp's tokenizer tests against its expected ids.
func TestBPEGGUFVocabs(t *testing.T) {
	dir := testutil.Shared(t, "models/llama.cpp-vocab")
	paths, _ := filepath.Glob(filepath.Join(dir, "*.gguf"))
	tested := 0
	for _, p := range paths {
		if _, err := os.Stat(p + ".inp"); err != nil {
			continue
		}
		name := strings.TrimSuffix(filepath.Base(p), ".gguf")
		t.Run(name, func(t *testing.T) {
			v, merges := bpeVocabFromGGUF(t, p)
			if v == nil {
				t.Skip("not a gpt2 vocabulary")
			}
			tok, err := NewBPE(v, merges)
			if err != nil {
				t.Fatal(err)
			}
			texts, want := bpeCases(t, p+".inp", p+".out")
			bad := bpeCompare(t, name, tok, texts, want)
			t.Logf("%s (pre %q): %d/%d cases match", name, v.Pre, len(texts)-bad, len(texts))
			tested++
		})
	}
	if tested == 0 {
		t.Skip("no gpt2 vocabularies found")
	}
}

// TestBPELongWord: a single quarter-million-byte word merges in
// O(n log n) and round-trips.
func TestBPELongWord(t *testing.T) {
	p := testutil.Shared(t, "models/llama.cpp-vocab/ggml-vocab-gpt-2.gguf")
	v, merges := bpeVocabFromGGUF(t, p)
	tok, err := NewBPE(v, merges)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{strings.Repeat("a", 1<<18), strings.Repeat("ab", 1<<17), strings.Repeat("é", 1<<17)} {
		start := time.Now()
		ids := tok.Encode(s, Options{})
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("%d-byte word took %v", len(s), d)
		}
		if tok.Decode(ids) != s {
			t.Errorf("%d-byte word: round trip differs", len(s))
		}
	}
}

func TestByteLevelAlphabet(t *testing.T) {
	var all []byte
	for b := 0; b < 256; b++ {
		all = append(all, byte(b))
	}
	enc := byteLevelEncode(string(all))
	if dec, ok := byteLevelDecode(enc); !ok || dec != string(all) {
		t.Fatalf("decode(encode(all bytes)) failed")
	}
	if byteLevelEncode(" \n\t") != "ĠĊĉ" {
		t.Errorf("space/newline/tab encode as %q", byteLevelEncode(" \n\t"))
	}
	if _, ok := byteLevelDecode("<|im_start|>中"); ok {
		t.Error("text outside the alphabet decoded")
	}
}
