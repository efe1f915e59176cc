package tokenizer

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// bpeAddedTok is a token matched in the raw text before pre-tokenization:
// a GGUF control/user-defined token or an HF added token.
type bpeAddedTok struct {
	id   int32
	text string
	// special tokens are only recognised with ParseSpecial; the others
	// (user-defined, HF special=false) always are, as in llama.cpp.
	special    bool
	lstrip     bool // swallow whitespace on the left
	rstrip     bool // swallow whitespace on the right
	singleWord bool // only when not inside a word
	normalized bool // HF: matched in the normalized text, not the raw one
}

// bpeAdded finds added tokens leftmost-longest, like HF's AddedVocabulary.
type bpeAdded struct {
	toks   []bpeAddedTok
	one    [256][]int       // one-byte tokens by byte
	two    map[uint16][]int // longer tokens by first two bytes, longest first
	first  [256]bool
	hasRaw bool // any normalized=false token
	hasNrm bool // any normalized=true token
}

func newBPEAdded(toks []bpeAddedTok) *bpeAdded {
	m := &bpeAdded{two: map[uint16][]int{}}
	for _, t := range toks {
		if t.text == "" {
			continue
		}
		k := len(m.toks)
		m.toks = append(m.toks, t)
		b := t.text[0]
		m.first[b] = true
		if len(t.text) == 1 {
			m.one[b] = append(m.one[b], k)
		} else {
			key := uint16(b)<<8 | uint16(t.text[1])
			m.two[key] = append(m.two[key], k)
		}
		if t.normalized {
			m.hasNrm = true
		} else {
			m.hasRaw = true
		}
	}
	for key, l := range m.two {
		// Insertion sort by length, longest first; lists are short.
		for a := 1; a < len(l); a++ {
			for b := a; b > 0 && len(m.toks[l[b]].text) > len(m.toks[l[b-1]].text); b-- {
				l[b], l[b-1] = l[b-1], l[b]
			}
		}
		m.two[key] = l
	}
	return m
}

func bpeIsWordRune(r rune) bool { return r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) }

// split cuts text into plain segments and added tokens (id >= 0), calling
// emit in order. Only tokens whose normalized flag equals normalized are
// looked for.
func (m *bpeAdded) split(text string, parseSpecial, normalized bool, emit func(seg string, id int32)) {
	if m == nil || (normalized && !m.hasNrm) || (!normalized && !m.hasRaw) {
		if text != "" {
			emit(text, -1)
		}
		return
	}
	seg := 0
	for i := 0; i < len(text); {
		if !m.first[text[i]] {
			i++
			continue
		}
		k := m.longest(text, i, parseSpecial, normalized)
		if k < 0 {
			i++
			continue
		}
		t := &m.toks[k]
		s, e := i, i+len(t.text)
		if t.lstrip {
			for s > seg {
				r, n := utf8.DecodeLastRuneInString(text[seg:s])
				if !unicode.IsSpace(r) {
					break
				}
				s -= n
			}
		}
		if t.rstrip {
			for e < len(text) {
				r, n := utf8.DecodeRuneInString(text[e:])
				if !unicode.IsSpace(r) {
					break
				}
				e += n
			}
		}
		if s > seg {
			emit(text[seg:s], -1)
		}
		emit("", t.id)
		seg, i = e, e
	}
	if seg < len(text) {
		emit(text[seg:], -1)
	}
}

func (m *bpeAdded) ok(t *bpeAddedTok, text string, i int, parseSpecial, normalized bool) bool {
	if t.normalized != normalized || (t.special && !parseSpecial) {
		return false
	}
	if t.singleWord {
		if i > 0 {
			if r, _ := utf8.DecodeLastRuneInString(text[:i]); bpeIsWordRune(r) {
				return false
			}
		}
		if e := i + len(t.text); e < len(text) {
			if r, _ := utf8.DecodeRuneInString(text[e:]); bpeIsWordRune(r) {
				return false
			}
		}
	}
	return true
}

// longest returns the longest eligible token starting at text[i], or -1.
func (m *bpeAdded) longest(text string, i int, parseSpecial, normalized bool) int {
	if i+1 < len(text) {
		for _, k := range m.two[uint16(text[i])<<8|uint16(text[i+1])] {
			t := &m.toks[k]
			if strings.HasPrefix(text[i:], t.text) && m.ok(t, text, i, parseSpecial, normalized) {
				return k
			}
		}
	}
	for _, k := range m.one[text[i]] {
		if m.ok(&m.toks[k], text, i, parseSpecial, normalized) {
			return k
		}
	}
	return -1
}
