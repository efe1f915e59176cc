package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"pagoda/gguf"
	"pagoda/testutil"
)

// TestHFWordPiece writes the bert-bge GGUF vocabulary back out as a BERT
// tokenizer.json ("##" continuations) and checks LoadHF against llama.cpp's
// expected ids.
func TestHFWordPiece(t *testing.T) {
	p := testutil.Shared(t, "models/llama.cpp-vocab/ggml-vocab-bert-bge.gguf")
	f, err := gguf.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	toks, _ := f.Strings("tokenizer.ggml.tokens")
	types, _ := f.Int32s("tokenizer.ggml.token_type")
	f.Close()
	vocab := map[string]int{}
	var added []map[string]any
	for i, s := range toks {
		switch {
		case types != nil && types[i] == TypeControl:
			added = append(added, map[string]any{"id": i, "content": s, "special": true})
		case strings.HasPrefix(s, spaceMark):
			s = s[len(spaceMark):]
		case !(strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]")):
			s = "##" + s
		}
		if _, dup := vocab[s]; !dup {
			vocab[s] = i
		}
	}
	js, err := json.Marshal(map[string]any{
		"added_tokens":   added,
		"normalizer":     map[string]any{"type": "BertNormalizer", "lowercase": true},
		"pre_tokenizer":  map[string]any{"type": "BertPreTokenizer"},
		"post_processor": map[string]any{"type": "BertProcessing", "sep": []any{"[SEP]", 102}, "cls": []any{"[CLS]", 101}},
		"model":          map[string]any{"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##", "vocab": vocab},
	})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), js, 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := LoadHF(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := tok.(*WordPiece); !ok {
		t.Fatalf("LoadHF gave %T", tok)
	}
	texts, want := bpeCases(t, p+".inp", p+".out")
	bad := 0
	for i, s := range texts {
		if got := tok.Encode(s, Options{ParseSpecial: true}); !bpeEqualIDs(got, want[i]) {
			bad++
			if bad <= 3 {
				t.Errorf("case %d %q:\n got %v\nwant %v", i, s, got, want[i])
			}
		}
	}
	t.Logf("bert-bge via tokenizer.json: %d/%d cases match", len(texts)-bad, len(texts))
	if got := tok.Encode("hello", Options{AddSpecial: true}); len(got) != 3 || got[0] != 101 || got[2] != 102 {
		t.Errorf("[CLS] hello [SEP]: %v", got)
	}
}
