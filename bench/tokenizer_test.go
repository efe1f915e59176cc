package bench

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"pagoda/testutil"
	"pagoda/tokenizer"
)

// TestTokenizerPrompts: with a tokenizer, prompts are text that re-encodes
// to at most the requested length (decode/encode does not round-trip), and
// the dataset counts the re-encoded length.
func TestTokenizerPrompts(t *testing.T) {
	tok, err := tokenizer.Load(testutil.Shared(t, "models/gguf/stories260K.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{BaseURL: "http://x", NumPrompts: 20, InputLen: 48, OutputLen: 1, MinTokenID: 259,
		Tokenizer: tok, Endpoint: "chat", Seed: 5}
	if err := cfg.defaults(); err != nil {
		t.Fatal(err)
	}
	if cfg.VocabSize != tok.Vocab().Size() {
		t.Fatalf("vocab %d from the tokenizer, want %d", cfg.VocabSize, tok.Vocab().Size())
	}
	ps, err := cfg.dataset(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for i, p := range ps {
		n := len(tok.Encode(p.text, tokenizer.Options{}))
		if p.ids != nil || p.text == "" || n != p.len || n > 48 {
			t.Fatalf("prompt %d: %d tokens (counted %d): %q", i, n, p.len, p.text)
		}
		total += n
	}
	if total < 20*40 {
		t.Fatalf("prompts average %d tokens, far below the 48 asked", total/20)
	}
}

// TestTextPrompts: the text dataset's prompts are stretches of the corpus
// of the asked length, from different offsets, the same for a seed.
func TestTextPrompts(t *testing.T) {
	tok, err := tokenizer.Load(testutil.Shared(t, "models/gguf/stories260K.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	corpus := strings.Repeat("Once upon a time there was a cat. ", 3) + "The cat had a red ball and a big dog. The dog liked to run in the park with Tom. "
	corpus = strings.Repeat(corpus, 4)
	cfg := Config{BaseURL: "http://x", NumPrompts: 12, InputLen: 16, OutputLen: 1, Tokenizer: tok, Dataset: "text", Text: corpus, Seed: 2}
	if err := cfg.defaults(); err != nil {
		t.Fatal(err)
	}
	ps, err := cfg.dataset(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for i, p := range ps {
		n := len(tok.Encode(p.text, tokenizer.Options{}))
		if p.ids != nil || n != p.len || n > 16 || n < 14 || !strings.Contains(corpus, strings.TrimSpace(p.text)) {
			t.Fatalf("prompt %d: %d tokens (counted %d), in the corpus %v: %q", i, n, p.len, strings.Contains(corpus, strings.TrimSpace(p.text)), p.text)
		}
		seen[p.text] = true
	}
	if len(seen) < 6 {
		t.Errorf("%d distinct prompts of 12", len(seen))
	}
	if again, _ := cfg.dataset(context.Background()); !reflect.DeepEqual(again, ps) {
		t.Error("the same seed gave other prompts")
	}
	if err := (&Config{BaseURL: "http://x", NumPrompts: 1, InputLen: 4, OutputLen: 1, VocabSize: 9, Dataset: "text", Text: corpus}).defaults(); err == nil {
		t.Error("the text dataset without a tokenizer was accepted")
	}
}
