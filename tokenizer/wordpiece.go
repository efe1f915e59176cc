package tokenizer

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// WordPiece is BERT's tokenizer (GGUF tokenizer.ggml.model "bert"): BERT
// basic tokenization (clean-up, CJK characters and punctuation split off,
// lower-casing with accents stripped) and then greedy longest-match-first
// word pieces.
//
// The vocabulary is in llama.cpp's GGUF spelling: a piece that may start a
// word carries a leading "▁" and a continuation piece is bare (BERT's
// "##ing" is "ing"); bracketed specials ("[CLS]") are unchanged.
type WordPiece struct {
	v       *Vocab
	ids     map[string]int32
	maxLen  int // longest token, in bytes
	special *specialMatcher
	pieces  [][]byte
}

// wordPieceMaxChars is Hugging Face's max_input_chars_per_word: longer
// words become [UNK] without being searched.
const wordPieceMaxChars = 100

// NewWordPiece builds a WordPiece tokenizer over v, which needs an unknown
// token. It sets v.AddSpacePrefix: pieces carry their word's leading space,
// and decoding drops the first one.
func NewWordPiece(v *Vocab) (*WordPiece, error) {
	if v == nil || len(v.Tokens) == 0 {
		return nil, fmt.Errorf("tokenizer: wordpiece: empty vocabulary")
	}
	if err := checkVocab(v); err != nil {
		return nil, fmt.Errorf("tokenizer: wordpiece: %w", err)
	}
	if v.UNK < 0 {
		return nil, fmt.Errorf("tokenizer: wordpiece: vocabulary has no unknown token")
	}
	v.AddSpacePrefix = true
	t := &WordPiece{v: v, ids: make(map[string]int32, len(v.Tokens)), special: newSpecialMatcher(v)}
	t.pieces = make([][]byte, len(v.Tokens))
	for i, s := range v.Tokens {
		switch v.tokenType(int32(i)) {
		case TypeNormal, TypeUserDefined, TypeUndefined:
			if _, dup := t.ids[s]; !dup {
				t.ids[s] = int32(i)
			}
			t.maxLen = max(t.maxLen, len(s))
			t.pieces[i] = []byte(strings.ReplaceAll(s, spaceMark, " "))
		}
	}
	return t, nil
}

// Vocab returns the vocabulary.
func (t *WordPiece) Vocab() *Vocab { return t.v }

// TokenBytes returns the text of id with the word-start "▁" as a space;
// nil for control tokens.
func (t *WordPiece) TokenBytes(id int32) []byte {
	if id < 0 || int(id) >= len(t.pieces) {
		return nil
	}
	return t.pieces[id]
}

// Decode joins the pieces. It does not undo BERT's normalization (case,
// accents) nor the space put before punctuation.
func (t *WordPiece) Decode(ids []int32) string { return decodeVia(t, ids) }

// Encode tokenizes text; AddSpecial wraps it in the vocabulary's BOS
// ([CLS]) and EOS ([SEP]) as add_bos/add_eos say.
func (t *WordPiece) Encode(text string, o Options) []int32 {
	v := t.v
	var out []int32
	if o.AddSpecial && v.AddBOS && v.BOS >= 0 {
		out = append(out, v.BOS)
	}
	for _, f := range t.special.split(text, o.ParseSpecial) {
		if f.id >= 0 {
			out = append(out, f.id)
			continue
		}
		for _, w := range bertWords(f.text) {
			out = t.encodeWord(w, out)
		}
	}
	if o.AddSpecial && v.AddEOS && v.EOS >= 0 {
		out = append(out, v.EOS)
	}
	return out
}

// encodeWord splits one word greedily, longest piece first; a word with any
// part that no piece covers becomes a single unknown token.
func (t *WordPiece) encodeWord(word string, out []int32) []int32 {
	if utf8.RuneCountInString(word) > wordPieceMaxChars {
		return append(out, t.v.UNK)
	}
	w := spaceMark + word
	n0 := len(out)
	for start := 0; start < len(w); {
		if start == 0 && len(w) == len(spaceMark) {
			break
		}
		end := min(len(w), start+t.maxLen)
		found := false
		for ; end > start; end-- {
			if end < len(w) && !utf8.RuneStart(w[end]) {
				continue
			}
			if start == 0 && end <= len(spaceMark) {
				break
			}
			if id, ok := t.ids[w[start:end]]; ok {
				out = append(out, id)
				found = true
				break
			}
		}
		if !found {
			return append(out[:n0], t.v.UNK)
		}
		start = end
	}
	return out
}

// bertWords is BERT's basic tokenizer as Hugging Face's BertNormalizer and
// BertPreTokenizer apply it for an uncased model: drop NUL, U+FFFD and
// control characters; split at white space; give each CJK ideograph and
// punctuation character a word of its own; strip accents (NFD, then drop
// non-spacing marks) and lower-case.
func bertWords(text string) []string {
	var sb strings.Builder
	for _, r := range text {
		switch {
		case r == 0 || r == utf8.RuneError || bertControl(r):
		case unicode.IsSpace(r):
			sb.WriteByte(' ')
		case isCJK(r):
			sb.WriteByte(' ')
			sb.WriteRune(r)
			sb.WriteByte(' ')
		default:
			sb.WriteRune(r)
		}
	}
	var words []string
	var cur strings.Builder
	flush := func() {
		if cur.Len() > 0 {
			words = append(words, cur.String())
			cur.Reset()
		}
	}
	for _, r := range norm.NFD.String(sb.String()) {
		switch {
		case unicode.Is(unicode.Mn, r):
		case r == ' ':
			flush()
		case bertPunct(r):
			flush()
			words = append(words, strings.ToLower(string(r)))
		default:
			cur.WriteString(strings.ToLower(string(r)))
		}
	}
	flush()
	return words
}

func bertControl(r rune) bool {
	if r == '\t' || r == '\n' || r == '\r' {
		return false
	}
	return unicode.In(r, unicode.Cc, unicode.Cf, unicode.Co, unicode.Cs)
}

// bertPunct is every ASCII non-alphanumeric printable character plus
// Unicode punctuation (P*).
func bertPunct(r rune) bool {
	if (r >= 33 && r <= 47) || (r >= 58 && r <= 64) || (r >= 91 && r <= 96) || (r >= 123 && r <= 126) {
		return true
	}
	return unicode.IsPunct(r)
}

// isCJK is BERT's "Chinese character" test: the CJK Unified Ideographs
// blocks and their extensions and compatibility forms.
func isCJK(r rune) bool {
	return (r >= 0x4E00 && r <= 0x9FFF) || (r >= 0x3400 && r <= 0x4DBF) ||
		(r >= 0x20000 && r <= 0x2A6DF) || (r >= 0x2A700 && r <= 0x2B73F) ||
		(r >= 0x2B740 && r <= 0x2B81F) || (r >= 0x2B820 && r <= 0x2CEAF) ||
		(r >= 0xF900 && r <= 0xFAFF) || (r >= 0x2F800 && r <= 0x2FA1F)
}
