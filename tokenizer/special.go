package tokenizer

import (
	"sort"
	"strings"
)

// fragment is a piece of input text, or a special token found in it
// (id >= 0).
type fragment struct {
	text string
	id   int32
}

// specialMatcher finds special tokens written in text the way llama.cpp's
// tokenizer_st_partition does: tokens are tried longest text first, and each
// one splits every remaining raw fragment at all of its (non-overlapping,
// leftmost-first) occurrences.
type specialMatcher struct {
	ids   []int32 // control/unknown/user-defined tokens, longest text first
	texts []string
	user  []bool // user-defined: matched even without ParseSpecial
	// lstrip/rstrip drop the white space before/after the token (llama.cpp
	// LLAMA_TOKEN_ATTR_LSTRIP/RSTRIP).
	lstrip, rstrip []bool
	first          [256][]int // indices into ids by first byte of the text
}

func newSpecialMatcher(v *Vocab) *specialMatcher {
	m := &specialMatcher{}
	if v.Types == nil {
		return m
	}
	var ids []int32
	for i, ty := range v.Types {
		if v.Tokens[i] == "" {
			continue
		}
		switch ty {
		case TypeControl, TypeUserDefined, TypeUnknown:
			ids = append(ids, int32(i))
		}
	}
	sort.SliceStable(ids, func(a, b int) bool { return len(v.Tokens[ids[a]]) > len(v.Tokens[ids[b]]) })
	m.ids = ids
	m.texts = make([]string, len(ids))
	m.user = make([]bool, len(ids))
	m.lstrip = make([]bool, len(ids))
	m.rstrip = make([]bool, len(ids))
	for k, id := range ids {
		s := v.Tokens[id]
		m.texts[k] = s
		m.user[k] = v.Types[id] == TypeUserDefined
		m.first[s[0]] = append(m.first[s[0]], k)
	}
	return m
}

// split cuts text into raw fragments and special tokens. With parseSpecial
// false only user-defined tokens are recognised, as in llama.cpp.
func (m *specialMatcher) split(text string, parseSpecial bool) []fragment {
	frags := []fragment{{text: text, id: -1}}
	if len(m.ids) == 0 {
		return frags
	}
	present := m.present(text, parseSpecial)
	for _, k := range present {
		tok, id := m.texts[k], m.ids[k]
		var next []fragment
		for _, f := range frags {
			if f.id >= 0 || !strings.Contains(f.text, tok) {
				next = append(next, f)
				continue
			}
			rest := f.text
			for {
				i := strings.Index(rest, tok)
				if i < 0 {
					break
				}
				left := rest[:i]
				if m.lstrip[k] {
					left = strings.TrimRightFunc(left, isCSpace)
				}
				if left != "" {
					next = append(next, fragment{text: left, id: -1})
				}
				next = append(next, fragment{id: id})
				rest = rest[i+len(tok):]
				if m.rstrip[k] {
					rest = strings.TrimLeftFunc(rest, isCSpace)
				}
			}
			if rest != "" {
				next = append(next, fragment{text: rest, id: -1})
			}
		}
		frags = next
	}
	return frags
}

// present lists, longest first, the special tokens that occur anywhere in
// text, so that split's per-token passes only run for those (a vocabulary
// may carry thousands of added tokens).
func (m *specialMatcher) present(text string, parseSpecial bool) []int {
	var found map[int]bool
	for i := 0; i < len(text); i++ {
		cands := m.first[text[i]]
		if cands == nil {
			continue
		}
		rest := text[i:]
		for _, k := range cands {
			if (parseSpecial || m.user[k]) && strings.HasPrefix(rest, m.texts[k]) {
				if found == nil {
					found = map[int]bool{}
				}
				found[k] = true
			}
		}
	}
	out := make([]int, 0, len(found))
	for k := range found {
		out = append(out, k)
	}
	sort.Ints(out) // k order is longest-first
	return out
}

// isCSpace is C's isspace, which llama.cpp strips with.
func isCSpace(r rune) bool {
	return r == ' ' || (r >= '\t' && r <= '\r')
}

// applyNameRules sets the strip attributes that llama.cpp derives from the
// model's general.name rather than from the file's token data: Phi-3 drops
// the white space after its special tokens (except <unk>, <s> and
// <|endoftext|>), so "<|user|>\nHi" tokenizes like "<|user|>Hi".
func (m *specialMatcher) applyNameRules(modelName string) {
	name := strings.ToLower(modelName)
	if !strings.Contains(name, "phi-3") && !strings.Contains(name, "phi3") {
		return
	}
	for k, tok := range m.texts {
		switch tok {
		case "<unk>", "<s>", "<|endoftext|>":
		default:
			m.rstrip[k] = true
		}
	}
}
