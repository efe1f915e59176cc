package train

import (
	"fmt"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"

	"pagoda/gguf"
	"pagoda/tokenizer"
)

// Vocab is a trained byte-level BPE vocabulary in GPT-2's form (GGUF
// tokenizer.ggml.model "gpt2", pre-tokenizer "gpt2"): the 256 byte tokens,
// one token per merge, then the end-of-text token.
type Vocab struct {
	Tokens []string // in GPT-2's byte alphabet
	Types  []int32
	Merges []string // "a b", in rank order
	EOT    int32    // <|endoftext|>, also BOS and EOS
	// AddBOS is written as tokenizer.ggml.add_bos_token: set for a model
	// trained on BOS-anchored windows, so prompts start as its windows did.
	AddBOS bool
}

const eotText = "<|endoftext|>"

// byteRunes is GPT-2's byte alphabet: printable Latin-1 bytes stand for
// themselves, the rest move to U+0100 upwards in byte order (as package
// tokenizer decodes them).
var byteRunes = func() (r [256]rune) {
	n := 0
	for b := 0; b < 256; b++ {
		if b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE {
			r[b] = rune(b)
		} else {
			r[b] = rune(256 + n)
			n++
		}
	}
	return
}()

func byteLevel(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		b.WriteRune(byteRunes[s[i]])
	}
	return b.String()
}

// preSplit splits text as GPT-2's pre-tokenizer regex does:
// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
func preSplit(s string) []string {
	rs := []rune(s)
	var out []string
	isOther := func(r rune) bool { return !unicode.IsSpace(r) && !unicode.IsLetter(r) && !unicode.IsNumber(r) }
	run := func(i int, f func(rune) bool) int {
		for i < len(rs) && f(rs[i]) {
			i++
		}
		return i
	}
	for i := 0; i < len(rs); {
		j := i
		if rs[i] == '\'' && i+1 < len(rs) {
			for _, c := range []string{"s", "t", "re", "ve", "m", "ll", "d"} {
				if strings.HasPrefix(string(rs[i+1:min(len(rs), i+3)]), c) {
					j = i + 1 + len(c)
					break
				}
			}
		}
		if j == i {
			s := i
			if rs[i] == ' ' && i+1 < len(rs) && !unicode.IsSpace(rs[i+1]) {
				s = i + 1
			}
			switch c := rs[s]; {
			case unicode.IsLetter(c):
				j = run(s, unicode.IsLetter)
			case unicode.IsNumber(c):
				j = run(s, unicode.IsNumber)
			case isOther(c):
				j = run(s, isOther)
			default:
				// Whitespace: all of it, less the last character when a
				// non-space follows (that one leads the next word).
				j = run(i, unicode.IsSpace)
				if j < len(rs) && j-i > 1 {
					j--
				}
			}
		}
		out = append(out, string(rs[i:j]))
		i = j
	}
	return out
}

// TrainBPE learns size−257 merges from text (byte-level BPE, merging the
// most frequent adjacent pair within pre-tokenized words, ties broken by
// the pair's token ids, so the result is deterministic).
func TrainBPE(text string, size int) (*Vocab, error) {
	if size < 257 {
		return nil, fmt.Errorf("train: bpe vocabulary of %d is smaller than the 256 bytes and end-of-text", size)
	}
	if !utf8.ValidString(text) {
		return nil, fmt.Errorf("train: bpe: text is not valid UTF-8")
	}
	counts := map[string]int{}
	for _, w := range preSplit(text) {
		counts[w]++
	}
	type word struct {
		syms []int32
		n    int
	}
	words := make([]word, 0, len(counts))
	keys := make([]string, 0, len(counts))
	for w := range counts {
		keys = append(keys, w)
	}
	sort.Strings(keys)
	for _, w := range keys {
		syms := make([]int32, len(w))
		for i := 0; i < len(w); i++ {
			syms[i] = int32(w[i])
		}
		words = append(words, word{syms, counts[w]})
	}
	v := &Vocab{}
	raw := make([]string, 256, size) // raw bytes of each token
	for b := 0; b < 256; b++ {
		raw[b] = string([]byte{byte(b)})
		v.Tokens = append(v.Tokens, string(byteRunes[b]))
		v.Types = append(v.Types, tokenizer.TypeNormal)
	}
	pairs := map[uint64]int{}
	for len(v.Tokens) < size-1 {
		clear(pairs)
		for _, w := range words {
			for i := 0; i+1 < len(w.syms); i++ {
				pairs[uint64(w.syms[i])<<32|uint64(w.syms[i+1])] += w.n
			}
		}
		var best uint64
		bestN := 0
		for p, n := range pairs {
			if n > bestN || n == bestN && p < best {
				best, bestN = p, n
			}
		}
		if bestN < 2 {
			break // nothing left worth merging
		}
		a, b := int32(best>>32), int32(best&0xffffffff)
		id := int32(len(v.Tokens))
		raw = append(raw, raw[a]+raw[b])
		v.Tokens = append(v.Tokens, byteLevel(raw[a]+raw[b]))
		v.Types = append(v.Types, tokenizer.TypeNormal)
		v.Merges = append(v.Merges, byteLevel(raw[a])+" "+byteLevel(raw[b]))
		for wi := range words {
			s := words[wi].syms
			k := 0
			for i := 0; i < len(s); i++ {
				if i+1 < len(s) && s[i] == a && s[i+1] == b {
					s[k] = id
					i++
				} else {
					s[k] = s[i]
				}
				k++
			}
			words[wi].syms = s[:k]
		}
	}
	v.EOT = int32(len(v.Tokens))
	v.Tokens = append(v.Tokens, eotText)
	v.Types = append(v.Types, tokenizer.TypeControl)
	return v, nil
}

// Meta is one GGUF metadata entry to write.
type Meta struct {
	Key   string
	Value any
}

// Meta is the vocabulary as GGUF tokenizer.* metadata.
func (v *Vocab) Meta() []Meta {
	return []Meta{
		{Key: "tokenizer.ggml.model", Value: "gpt2"},
		{Key: "tokenizer.ggml.pre", Value: "gpt2"},
		{Key: "tokenizer.ggml.tokens", Value: v.Tokens},
		{Key: "tokenizer.ggml.token_type", Value: v.Types},
		{Key: "tokenizer.ggml.merges", Value: v.Merges},
		{Key: "tokenizer.ggml.bos_token_id", Value: uint32(v.EOT)},
		{Key: "tokenizer.ggml.eos_token_id", Value: uint32(v.EOT)},
		{Key: "tokenizer.ggml.add_bos_token", Value: v.AddBOS},
	}
}

// Tokenizer is Pagoda's tokenizer for the vocabulary, the one `pagoda
// run` builds from the checkpoint, so training data is encoded exactly as
// inference will encode prompts.
func (v *Vocab) Tokenizer() (tokenizer.Tokenizer, error) {
	tv := &tokenizer.Vocab{Model: "gpt2", Pre: "gpt2", Tokens: v.Tokens, Types: v.Types,
		BOS: v.EOT, EOS: v.EOT, UNK: -1, PAD: -1, EOT: v.EOT}
	return tokenizer.NewBPE(tv, v.Merges)
}

// VocabFromGGUF reads back a vocabulary this package wrote.
func VocabFromGGUF(f *gguf.File) (*Vocab, error) {
	tv, merges, err := tokenizer.VocabFromGGUF(f)
	if err != nil {
		return nil, err
	}
	if tv.Model != "gpt2" || tv.EOS < 0 {
		return nil, fmt.Errorf("train: vocabulary %q without end-of-text is not one this trainer writes", tv.Model)
	}
	types := tv.Types
	if types == nil {
		types = make([]int32, len(tv.Tokens))
		for i := range types {
			types[i] = tokenizer.TypeNormal
		}
	}
	return &Vocab{Tokens: tv.Tokens, Types: types, Merges: merges, EOT: tv.EOS, AddBOS: tv.AddBOS}, nil
}
