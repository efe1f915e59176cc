package bench

import (
	"context"
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
