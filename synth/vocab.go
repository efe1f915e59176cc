package synth

import (
	"bytes"
	"fmt"
	"os"
	"strings"

	"pagoda/gguf"
	"pagoda/llama2c"
)

// minVocab is <unk>, <s>, </s> and the 256 byte tokens.
const minVocab = 3 + 256

// vocabulary is the tokenizer metadata to write.
type vocabulary struct {
	size int
	kv   []gguf.KV
}

// Token types (tokenizer.ggml.token_type).
const (
	typeNormal  = 1
	typeUnknown = 2
	typeControl = 3
	typeByte    = 6
)

// commonWords are frequent English (and TinyStories) words; with their
// prefixes they give a SentencePiece-style vocabulary in which random
// token ids still read as words.
var commonWords = strings.Fields(`
the a and to was he she it of in his her they that with on said you for
is i had but one day there were so big little very not happy wanted saw
up all be at time once upon named lily tom ben mom dad play played go went
friend friends could would what can we out help look do have this did
like toy ball dog cat bird tree park house sun fun from then when as
are no yes him them by an my your me do will just get got see good
new find found make made run ran jump jumped sad love loved ask asked
back down over too very into about after before because again home
girl boy man woman kids child children small red blue green fast slow
away around other more some many came come say says let lets eat food
water sky car box bed room door hand head eyes face smile smiled share
thank thanks sorry nice kind brave strong sleep tired long short hot cold
`)

// titleWords get capitalised variants, as sentence starts.
var titleWords = strings.Fields(`the once one she he they it there lily tom ben mom dad but then when i`)

// builtinVocab builds a self-contained SentencePiece-style vocabulary of n
// (>= minVocab) tokens: specials, the 256 byte-fallback tokens, printable
// ASCII and "▁", frequent words with all their prefixes, then letter
// n-grams until n. Scores descend with the id, as in SentencePiece BPE
// models, so earlier pieces merge first.
func builtinVocab(n int) *vocabulary {
	toks := []string{"<unk>", "<s>", "</s>"}
	types := []int32{typeUnknown, typeControl, typeControl}
	for b := 0; b < 256; b++ {
		toks = append(toks, fmt.Sprintf("<0x%02X>", b))
		types = append(types, typeByte)
	}
	seen := map[string]bool{}
	var pieces []string
	add := func(p string) {
		if !seen[p] && len(toks)+len(pieces) < n {
			seen[p] = true
			pieces = append(pieces, p)
		}
	}
	add("▁")
	for c := byte('!'); c <= '~'; c++ {
		add(string(c))
	}
	addWord := func(w string) {
		for k := 1; k <= len(w); k++ {
			add("▁" + w[:k])
		}
	}
	for _, w := range commonWords {
		addWord(w)
	}
	for _, w := range titleWords {
		addWord(strings.ToUpper(w[:1]) + w[1:])
	}
	for _, suf := range []string{"s", "ed", "ing", "er", "ly", "'s", "n't", "es", "y"} {
		for k := 1; k <= len(suf); k++ {
			add(suf[:k])
		}
	}
	// Letter n-grams, with and without the word-start marker.
	for length := 2; len(toks)+len(pieces) < n; length++ {
		idx := make([]int, length)
		for {
			var b strings.Builder
			for _, i := range idx {
				b.WriteByte(byte('a' + i))
			}
			add("▁" + b.String())
			add(b.String())
			if len(toks)+len(pieces) >= n {
				break
			}
			k := length - 1
			for k >= 0 && idx[k] == 25 {
				idx[k] = 0
				k--
			}
			if k < 0 {
				break
			}
			idx[k]++
		}
	}
	scores := make([]float32, len(toks), n)
	for i, p := range pieces {
		toks = append(toks, p)
		types = append(types, typeNormal)
		scores = append(scores, -float32(i))
	}
	return &vocabulary{size: len(toks), kv: spmKV(toks, scores, types)}
}

func spmKV(toks []string, scores []float32, types []int32) []gguf.KV {
	kv := func(k string, v any) gguf.KV {
		val, err := gguf.ToValue(v)
		if err != nil {
			panic(err) // only the fixed Go types below reach here
		}
		return gguf.KV{Key: k, Value: val}
	}
	return []gguf.KV{
		kv("tokenizer.ggml.model", "llama"),
		kv("tokenizer.ggml.tokens", toks),
		kv("tokenizer.ggml.scores", scores),
		kv("tokenizer.ggml.token_type", types),
		kv("tokenizer.ggml.bos_token_id", uint32(1)),
		kv("tokenizer.ggml.eos_token_id", uint32(2)),
		kv("tokenizer.ggml.unknown_token_id", uint32(0)),
		kv("tokenizer.ggml.add_bos_token", true),
		kv("tokenizer.ggml.add_eos_token", false),
	}
}

// loadVocab reads the vocabulary of a GGUF (every tokenizer.* entry, so BPE
// merges, pre-tokenizer and chat template come along) or of a llama2.c
// tokenizer.bin.
func loadVocab(path string) (*vocabulary, error) {
	head := make([]byte, 4)
	fd, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	_, err = fd.Read(head)
	fd.Close()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if !bytes.Equal(head, []byte(gguf.Magic)) {
		v, err := llama2c.ReadVocab(path)
		if err != nil {
			return nil, err
		}
		if len(v.Tokens) < 3 {
			return nil, fmt.Errorf("%s: only %d tokens", path, len(v.Tokens))
		}
		return &vocabulary{size: len(v.Tokens), kv: spmKV(v.Pieces(), v.Scores, v.Types())}, nil
	}
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	toks, ok := f.Strings("tokenizer.ggml.tokens")
	if !ok || len(toks) == 0 {
		return nil, fmt.Errorf("%s: no tokenizer.ggml.tokens", path)
	}
	var out vocabulary
	out.size = len(toks)
	for _, kv := range f.KV {
		if strings.HasPrefix(kv.Key, "tokenizer.") {
			// Values decoded from the file own their memory (strings and
			// slices are copied out of the mapping), so they outlive Close.
			out.kv = append(out.kv, kv)
		}
	}
	return &out, nil
}
