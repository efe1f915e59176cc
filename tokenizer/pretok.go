package tokenizer

import (
	"fmt"
	"regexp"
	"unicode"
	"unicode/utf8"
)

// Pre-tokenizers split text into the words that byte-level BPE merges
// within. The families' regexes (llama.cpp llama-vocab.cpp, HF
// tokenizer.json) use look-ahead and Unicode classes that Go's RE2 lacks or
// defines differently, so each one is written out here as code: a matcher
// says how long the regex's match starting at rune i is, and a stage cuts a
// fragment at every match, keeping the unmatched gaps as pieces too
// (llama.cpp's unicode_regex_split, HF Split "Isolated"). Several stages run
// one after another, each over the pieces of the previous one, so anchors
// and look-aheads see the end of the current piece, not of the whole text.

// preSpan is a half-open rune range.
type preSpan struct{ a, b int }

// preMatcher returns the length (in runes) of the leftmost-first match of a
// pattern anchored at rs[i], or 0 when the pattern does not match there.
// rs is the current fragment only.
type preMatcher func(rs []rune, i int) int

// preStage is one split step: find reports the matches in a fragment.
type preStage interface {
	find(rs []rune, dst []preSpan) []preSpan
}

// preMatchStage finds matches by trying a matcher at every position.
type preMatchStage struct{ m preMatcher }

func (s preMatchStage) find(rs []rune, dst []preSpan) []preSpan {
	for i := 0; i < len(rs); {
		if n := s.m(rs, i); n > 0 {
			dst = append(dst, preSpan{i, i + n})
			i += n
			continue
		}
		i++
	}
	return dst
}

// preRegexpStage finds matches with Go's regexp, for tokenizer.json patterns
// that have no hand-written matcher and that RE2 can compile.
type preRegexpStage struct{ re *regexp.Regexp }

func (s preRegexpStage) find(rs []rune, dst []preSpan) []preSpan {
	str := string(rs)
	locs := s.re.FindAllStringIndex(str, -1)
	if len(locs) == 0 {
		return dst
	}
	// Convert byte offsets to rune offsets in one pass.
	ri, bi := 0, 0
	toRune := func(b int) int {
		for bi < b {
			_, n := utf8.DecodeRuneInString(str[bi:])
			bi += n
			ri++
		}
		return ri
	}
	for _, l := range locs {
		if l[1] == l[0] {
			continue
		}
		a := toRune(l[0])
		b := toRune(l[1])
		dst = append(dst, preSpan{a, b})
	}
	return dst
}

// preSplitBehavior is HF's SplitDelimiterBehavior.
type preSplitBehavior int

const (
	preSplitIsolated preSplitBehavior = iota
	preSplitRemoved
	preSplitMergedWithPrevious
	preSplitMergedWithNext
	preSplitContiguous
)

// preSplit is one stage with what happens to the matches.
type preSplit struct {
	stage    preStage
	behavior preSplitBehavior
	invert   bool
}

// preRunSplits applies the stages in order to rs and returns the final pieces.
func preRunSplits(rs []rune, stages []preSplit) []preSpan {
	cur := []preSpan{{0, len(rs)}}
	if len(rs) == 0 {
		return nil
	}
	var next, ms []preSpan
	for _, st := range stages {
		next = next[:0]
		for _, f := range cur {
			ms = st.stage.find(rs[f.a:f.b], ms[:0])
			next = preApplyBehavior(next, f.a, f.b-f.a, ms, st.behavior, st.invert)
		}
		cur, next = next, cur
	}
	return cur
}

// preApplyBehavior turns the matches of one fragment (offset off, length n)
// into pieces as HF's NormalizedString::split does.
func preApplyBehavior(dst []preSpan, off, n int, ms []preSpan, beh preSplitBehavior, invert bool) []preSpan {
	// Mark every part as match or gap.
	type part struct {
		a, b  int
		match bool
	}
	parts := make([]part, 0, 2*len(ms)+1)
	last := 0
	for _, m := range ms {
		if m.a > last {
			parts = append(parts, part{last, m.a, false})
		}
		parts = append(parts, part{m.a, m.b, true})
		last = m.b
	}
	if last < n {
		parts = append(parts, part{last, n, false})
	}
	if invert {
		for i := range parts {
			parts[i].match = !parts[i].match
		}
	}
	emit := func(a, b int) {
		if b > a {
			dst = append(dst, preSpan{off + a, off + b})
		}
	}
	switch beh {
	case preSplitIsolated:
		for _, p := range parts {
			emit(p.a, p.b)
		}
	case preSplitRemoved:
		for _, p := range parts {
			if !p.match {
				emit(p.a, p.b)
			}
		}
	case preSplitMergedWithPrevious:
		start := -1
		for _, p := range parts {
			if start < 0 {
				start = p.a
			}
			if p.match {
				emit(start, p.b)
				start = -1
			}
		}
		if start >= 0 {
			emit(start, n)
		}
	case preSplitMergedWithNext:
		// A match opens a piece that the following gap joins.
		start := -1
		for _, p := range parts {
			if p.match {
				if start >= 0 {
					emit(start, p.a)
				}
				start = p.a
				continue
			}
			if start < 0 {
				start = p.a
			}
			emit(start, p.b)
			start = -1
		}
		if start >= 0 {
			emit(start, n)
		}
	case preSplitContiguous:
		for i := 0; i < len(parts); {
			j := i + 1
			for j < len(parts) && parts[j].match && parts[i].match {
				j++
			}
			emit(parts[i].a, parts[j-1].b)
			i = j
		}
	}
	return dst
}

// Character classes. ASCII takes a fast path; the rest uses the unicode
// package tables (\p{L} = Lu|Ll|Lt|Lm|Lo, \p{N} = Nd|Nl|No, \s = White_Space).

func preIsL(r rune) bool {
	if r < 0x80 {
		return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z'
	}
	return unicode.IsLetter(r)
}

func preIsN(r rune) bool {
	if r < 0x80 {
		return '0' <= r && r <= '9'
	}
	return unicode.IsNumber(r)
}

func preIsSpace(r rune) bool {
	if r < 0x80 {
		return r == ' ' || '\t' <= r && r <= '\r'
	}
	return unicode.IsSpace(r)
}

func preIsP(r rune) bool { return unicode.IsPunct(r) }
func preIsS(r rune) bool { return unicode.IsSymbol(r) }
func preIsM(r rune) bool { return r >= 0x300 && unicode.IsMark(r) }

func preIsCRLF(r rune) bool { return r == '\r' || r == '\n' }

// preIsOther is [^\s\p{L}\p{N}].
func preIsOther(r rune) bool { return !preIsSpace(r) && !preIsL(r) && !preIsN(r) }

// preRunUpTo is preRunOf limited to n runes: {1,n} quantifiers must not scan a
// long run at every position (quadratic on a million digits).
func preRunUpTo(rs []rune, i, n int, f func(rune) bool) int {
	j := i
	for j < len(rs) && j-i < n && f(rs[j]) {
		j++
	}
	return j
}

func preRunOf(rs []rune, i int, f func(rune) bool) int {
	j := i
	for j < len(rs) && f(rs[j]) {
		j++
	}
	return j
}

// preMatchContraction matches 's|'t|'re|'ve|'m|'ll|'d (ASCII apostrophe),
// case-insensitively when ci (the (?i:...) of llama3 and qwen2).
func preMatchContraction(rs []rune, i int, ci bool) int {
	if rs[i] != '\'' || i+1 >= len(rs) {
		return 0
	}
	low := func(r rune) rune {
		if ci && 'A' <= r && r <= 'Z' {
			return r + 32
		}
		return r
	}
	c := low(rs[i+1])
	switch c {
	case 's', 't', 'm', 'd':
		return 2
	}
	if i+2 < len(rs) {
		c2 := low(rs[i+2])
		switch {
		case c == 'r' && c2 == 'e', c == 'v' && c2 == 'e', c == 'l' && c2 == 'l':
			return 3
		}
	}
	return 0
}

// preMatchSpaceTail covers the shared tail \s+(?!\S)|\s+: a run of whitespace
// followed by a non-space gives back its last character to the next word.
func preMatchSpaceTail(rs []rune, i int) int {
	if !preIsSpace(rs[i]) {
		return 0
	}
	j := preRunOf(rs, i, preIsSpace)
	if j == len(rs) || j-i == 1 {
		return j - i
	}
	return j - i - 1
}

// preMatchSpaceNewlines is \s*[\r\n]+: whitespace up to and including the last
// newline of the run.
func preMatchSpaceNewlines(rs []rune, i int) int {
	if !preIsSpace(rs[i]) {
		return 0
	}
	j := preRunOf(rs, i, preIsSpace)
	for k := j - 1; k >= i; k-- {
		if preIsCRLF(rs[k]) {
			return k + 1 - i
		}
	}
	return 0
}

// preMatchGPT2 is 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+.
func preMatchGPT2(rs []rune, i int) int {
	if n := preMatchContraction(rs, i, false); n > 0 {
		return n
	}
	s := i
	if rs[i] == ' ' && i+1 < len(rs) {
		s = i + 1
	}
	c := rs[s]
	switch {
	case preIsL(c):
		return preRunOf(rs, s, preIsL) - i
	case preIsN(c):
		return preRunOf(rs, s, preIsN) - i
	case preIsOther(c):
		return preRunOf(rs, s, preIsOther) - i
	}
	return preMatchSpaceTail(rs, i)
}

// preLlama3Like describes the llama3 family of regexes:
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,digits}|
// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
type preLlama3Like struct {
	digits int // 3 for llama3, 1 for qwen2
	// seed-coder: " ?[^\s\p{L}\p{N}\r\n]+" without the trailing newlines.
	noPunctNewlines bool
	// bailingmoe's "\s*[\r\n]" (one newline) matches exactly what
	// "\s*[\r\n]+" does: both end at the last newline of the run.
}

func (c preLlama3Like) match(rs []rune, i int) int {
	if n := preMatchContraction(rs, i, true); n > 0 {
		return n
	}
	r := rs[i]
	if !preIsCRLF(r) && !preIsL(r) && !preIsN(r) && i+1 < len(rs) && preIsL(rs[i+1]) {
		return preRunOf(rs, i+1, preIsL) - i
	}
	if preIsL(r) {
		return preRunOf(rs, i, preIsL) - i
	}
	if preIsN(r) {
		return preRunUpTo(rs, i, c.digits, preIsN) - i
	}
	s := i
	if r == ' ' && i+1 < len(rs) {
		s = i + 1
	}
	if preIsOther(rs[s]) {
		j := preRunOf(rs, s, preIsOther)
		if !c.noPunctNewlines {
			j = preRunOf(rs, j, preIsCRLF)
		}
		return j - i
	}
	if n := preMatchSpaceNewlines(rs, i); n > 0 {
		return n
	}
	return preMatchSpaceTail(rs, i)
}

// preIsPS is [\p{P}\p{S}].
func preIsPS(r rune) bool { return preIsP(r) || preIsS(r) }

func preIsASCIIPunct(r rune) bool {
	return r >= '!' && r <= '/' || r >= ':' && r <= '@' || r >= '[' && r <= '`' || r >= '{' && r <= '~'
}

func preIsASCIILetter(r rune) bool { return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' }

func preIsLM(r rune) bool { return preIsL(r) || preIsM(r) }

// preMatchDeepseekV3 is the third DeepSeek-V3 regex:
// [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|
// ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
func preMatchDeepseekV3(rs []rune, i int) int {
	r := rs[i]
	if preIsASCIIPunct(r) && i+1 < len(rs) && preIsASCIILetter(rs[i+1]) {
		return preRunOf(rs, i+1, preIsASCIILetter) - i
	}
	if !preIsCRLF(r) && !preIsL(r) && !preIsPS(r) && i+1 < len(rs) && preIsLM(rs[i+1]) {
		return preRunOf(rs, i+1, preIsLM) - i
	}
	if preIsLM(r) {
		return preRunOf(rs, i, preIsLM) - i
	}
	s := i
	if r == ' ' && i+1 < len(rs) {
		s = i + 1
	}
	if preIsPS(rs[s]) {
		j := preRunOf(rs, s, preIsPS)
		return preRunOf(rs, j, preIsCRLF) - i
	}
	if n := preMatchSpaceNewlines(rs, i); n > 0 {
		return n
	}
	return preMatchSpaceTail(rs, i)
}

// Tekken and GPT-4o split upper- and lower-case runs:
// [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|
// [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|...

func preIsUpperish(r rune) bool {
	if r < 0x80 {
		return 'A' <= r && r <= 'Z'
	}
	return unicode.In(r, unicode.Lu, unicode.Lt, unicode.Lm, unicode.Lo, unicode.M)
}

func preIsLowerish(r rune) bool {
	if r < 0x80 {
		return 'a' <= r && r <= 'z'
	}
	return unicode.In(r, unicode.Ll, unicode.Lm, unicode.Lo, unicode.M)
}

// preUpperThenLower is U*L+ at s with backtracking; -1 when it cannot match.
func preUpperThenLower(rs []rune, s int) int {
	u := preRunOf(rs, s, preIsUpperish)
	for k := u; k >= s; k-- {
		if k < len(rs) && preIsLowerish(rs[k]) {
			return preRunOf(rs, k, preIsLowerish)
		}
	}
	return -1
}

// preUpperPlusLower is U+L* at s; -1 when it cannot match.
func preUpperPlusLower(rs []rune, s int) int {
	u := preRunOf(rs, s, preIsUpperish)
	if u == s {
		return -1
	}
	return preRunOf(rs, u, preIsLowerish)
}

type preCaseSplit struct {
	digits      int  // \p{N}{1,digits}
	contraction bool // gpt-4o: (?i:'s|...)? after each word
}

func (c preCaseSplit) match(rs []rune, i int) int {
	r := rs[i]
	pre := !preIsCRLF(r) && !preIsL(r) && !preIsN(r)
	word := func(f func([]rune, int) int) int {
		if pre && i+1 < len(rs) {
			if e := f(rs, i+1); e >= 0 {
				return e
			}
		}
		return f(rs, i)
	}
	e := word(preUpperThenLower)
	if e < 0 {
		e = word(preUpperPlusLower)
	}
	if e > i {
		if c.contraction && e < len(rs) {
			e += preMatchContraction(rs, e, true)
		}
		return e - i
	}
	if preIsN(r) {
		return preRunUpTo(rs, i, c.digits, preIsN) - i
	}
	s := i
	if r == ' ' && i+1 < len(rs) {
		s = i + 1
	}
	if preIsOther(rs[s]) {
		j := preRunOf(rs, s, preIsOther)
		return preRunOf(rs, j, func(r rune) bool { return preIsCRLF(r) || r == '/' }) - i
	}
	if n := preMatchSpaceNewlines(rs, i); n > 0 {
		return n
	}
	return preMatchSpaceTail(rs, i)
}

// Simple building blocks for the multi-stage families.

func preMatchClassRun(f func(rune) bool) preMatcher {
	return func(rs []rune, i int) int { return preRunOf(rs, i, f) - i }
}

func preMatchClassOne(f func(rune) bool) preMatcher {
	return func(rs []rune, i int) int {
		if f(rs[i]) {
			return 1
		}
		return 0
	}
}

// preMatchDigitsUpTo is \p{N}{1,n}.
func preMatchDigitsUpTo(n int) preMatcher {
	return func(rs []rune, i int) int { return preRunUpTo(rs, i, n, preIsN) - i }
}

// preMatchOptSpaceRun is \s?[class]+.
func preMatchOptSpaceRun(f func(rune) bool) preMatcher {
	return func(rs []rune, i int) int {
		if preIsSpace(rs[i]) && i+1 < len(rs) && f(rs[i+1]) {
			return preRunOf(rs, i+1, f) - i
		}
		return preRunOf(rs, i, f) - i
	}
}

// preMatchTrailingSpace is \s+$ within the fragment.
func preMatchTrailingSpace(rs []rune, i int) int {
	// Inside a run the previous position already failed, and so does
	// this one; checking that keeps long runs linear.
	if !preIsSpace(rs[i]) || i > 0 && preIsSpace(rs[i-1]) {
		return 0
	}
	if j := preRunOf(rs, i, preIsSpace); j == len(rs) {
		return j - i
	}
	return 0
}

func preInRanges(t *unicode.RangeTable) func(rune) bool {
	return func(r rune) bool { return unicode.Is(t, r) }
}

// preRangeTable builds a table from pairs of inclusive bounds.
func preRangeTable(pairs ...rune) *unicode.RangeTable {
	t := &unicode.RangeTable{}
	for k := 0; k+1 < len(pairs); k += 2 {
		lo, hi := pairs[k], pairs[k+1]
		if hi <= 0xFFFF {
			t.R16 = append(t.R16, unicode.Range16{Lo: uint16(lo), Hi: uint16(hi), Stride: 1})
		} else {
			t.R32 = append(t.R32, unicode.Range32{Lo: uint32(lo), Hi: uint32(hi), Stride: 1})
		}
	}
	return t
}

var (
	// DeepSeek LLM's cased-letter class, as in llama.cpp
	// ("[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓ...𞤀-𞥃]"), as code points: written as
	// characters, U+2126 OHM, U+212A KELVIN, U+1FBE, U+1FD3, U+1FDB and
	// U+1F7D would not survive NFC-normalizing editors.
	preDeepseekLettersTable = preRangeTable(
		0x0041, 0x005A, 0x0061, 0x007A, 0x00B5, 0x00B5, 0x00C0, 0x00D6, 0x00D8, 0x00F6, 0x00F8, 0x01BA,
		0x01BC, 0x01BF, 0x01C4, 0x0293, 0x0295, 0x02AF, 0x0370, 0x0373, 0x0376, 0x0376, 0x0377, 0x0377,
		0x037B, 0x037D, 0x037F, 0x037F, 0x0386, 0x0386, 0x0388, 0x038A, 0x038C, 0x038C, 0x038E, 0x03A1,
		0x03A3, 0x03F5, 0x03F7, 0x0481, 0x048A, 0x052F, 0x0531, 0x0556, 0x10A0, 0x10C5, 0x13A0, 0x13F5,
		0x13F8, 0x13FD, 0x1C90, 0x1CBA, 0x1CBD, 0x1CBF, 0x1D00, 0x1D2B, 0x1D6B, 0x1D77, 0x1D79, 0x1D9A,
		0x1E00, 0x1F15, 0x1F18, 0x1F1D, 0x1F20, 0x1F45, 0x1F48, 0x1F4D, 0x1F50, 0x1F57, 0x1F59, 0x1F59,
		0x1F5B, 0x1F5B, 0x1F5D, 0x1F5D, 0x1F5F, 0x1F7D, 0x1F80, 0x1FB4, 0x1FB6, 0x1FBC, 0x1FBE, 0x1FBE,
		0x1FC2, 0x1FC4, 0x1FC6, 0x1FCC, 0x1FD0, 0x1FD3, 0x1FD6, 0x1FDB, 0x1FE0, 0x1FEC, 0x1FF2, 0x1FF4,
		0x1FF6, 0x1FFC, 0x2102, 0x2102, 0x2107, 0x2107, 0x210A, 0x2113, 0x2115, 0x2115, 0x2119, 0x211D,
		0x2124, 0x2124, 0x2126, 0x2126, 0x2128, 0x2128, 0x212A, 0x212D, 0x212F, 0x2134, 0x2139, 0x2139,
		0x213C, 0x213F, 0x2145, 0x2149, 0x214E, 0x214E, 0x2183, 0x2183, 0x2184, 0x2184, 0x2C00, 0x2C7B,
		0x2C7E, 0x2CE4, 0x2CEB, 0x2CEE, 0x2CF2, 0x2CF2, 0x2CF3, 0x2CF3, 0xA640, 0xA66D, 0xA680, 0xA69B,
		0xA722, 0xA76F, 0xA771, 0xA787, 0xA78B, 0xA78E, 0xAB70, 0xABBF, 0xFB00, 0xFB06, 0xFB13, 0xFB17,
		0xFF21, 0xFF3A, 0xFF41, 0xFF5A, 0x10400, 0x1044F, 0x104B0, 0x104D3, 0x104D8, 0x104FB, 0x10C80, 0x10CB2,
		0x10CC0, 0x10CF2, 0x118A0, 0x118DF, 0x1E900, 0x1E943,
	)
	preDeepseekLetters = preInRanges(preDeepseekLettersTable)
	// [!-/:-~！-／：-～‘-‟　-。]
	preDeepseekPunct = preInRanges(preRangeTable('!', '/', ':', '~', 0x2018, 0x201F, 0x3000, 0x3002, 0xFF01, 0xFF0F, 0xFF1A, 0xFF5E))
	// [一-龥ࠀ-一가-퟿]
	preDeepseekCJK = preInRanges(preRangeTable(0x0800, 0x9FA5, 0xAC00, 0xD7FF))
	// [一-龥぀-ゟ゠-ヿ]
	preDeepseekV3CJK = preInRanges(preRangeTable(0x3040, 0x309F, 0x30A0, 0x30FF, 0x4E00, 0x9FA5))
)

func preIsFalconPunct(r rune) bool {
	switch r {
	case '$', '+', '<', '=', '>', '^', '~', '|', '`':
		return true
	}
	return preIsP(r)
}

func preIsDefaultPunct(r rune) bool { return r != '`' && preIsFalconPunct(r) }

func preIsASCIIDigit(r rune) bool { return '0' <= r && r <= '9' }

// preMatch3Digits is [0-9][0-9][0-9].
func preMatch3Digits(rs []rune, i int) int {
	if i+2 < len(rs) && preIsASCIIDigit(rs[i]) && preIsASCIIDigit(rs[i+1]) && preIsASCIIDigit(rs[i+2]) {
		return 3
	}
	return 0
}

// preMatchPoro is " ?[^(\s|.,!?…。，、।۔،)]+".
func preMatchPoro(rs []rune, i int) int {
	ok := func(r rune) bool {
		switch r {
		case '(', '|', ')', '.', ',', '!', '?', '…', '。', '，', '、', '।', '۔', '،':
			return false
		}
		return !preIsSpace(r)
	}
	s := i
	if rs[i] == ' ' && i+1 < len(rs) && ok(rs[i+1]) {
		s = i + 1
	}
	return preRunOf(rs, s, ok) - i
}

// Chameleon's extra stages.

func preMatchLiteral(lit string) preMatcher {
	l := []rune(lit)
	return func(rs []rune, i int) int {
		if i+len(l) > len(rs) {
			return 0
		}
		for k, r := range l {
			if rs[i+k] != r {
				return 0
			}
		}
		return len(l)
	}
}

// preMatchSentinel is <sentinel:[0-9]+>.
var (
	preMatchSentinelPrefix = preMatchLiteral("<sentinel:")
	preMatchIMGIMG         = preMatchLiteral("IMGIMG")
	preMatch4Spaces        = preMatchLiteral("    ")
	preMatch2Spaces        = preMatchLiteral("  ")
)

func preMatchSentinel(rs []rune, i int) int {
	n := preMatchSentinelPrefix(rs, i)
	if n == 0 {
		return 0
	}
	j := preRunOf(rs, i+n, preIsASCIIDigit)
	if j == i+n || j >= len(rs) || rs[j] != '>' {
		return 0
	}
	return j + 1 - i
}

// preMatchImageTokens is (IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z.
func preMatchImageTokens(rs []rune, i int) int {
	n := preMatchIMGIMG(rs, i)
	if n == 0 {
		return 0
	}
	j := i + n
	k := j
	for k < len(rs) && k-j < 4 && rs[k] >= 'A' && rs[k] <= 'I' {
		k++
	}
	// {1,4} backtracks: the Z must follow some 1..4 letters; since Z is not
	// in A-I only the full greedy run can be followed by it.
	if k > j && k < len(rs) && rs[k] == 'Z' {
		return k + 1 - i
	}
	return 0
}

// preMatchChameleonWS is ([\t\n]|    |  ).
func preMatchChameleonWS(rs []rune, i int) int {
	if rs[i] == '\t' || rs[i] == '\n' {
		return 1
	}
	if n := preMatch4Spaces(rs, i); n > 0 {
		return n
	}
	return preMatch2Spaces(rs, i)
}

func preIsChameleonPunct(r rune) bool { return preIsASCIIPunct(r) || preIsP(r) }

func preIsolated(ms ...preMatcher) []preSplit {
	out := make([]preSplit, len(ms))
	for k, m := range ms {
		out[k] = preSplit{stage: preMatchStage{m}}
	}
	return out
}

// preFamily resolves a llama.cpp tokenizer.ggml.pre name to its stages and
// whether the family skips merging for words that are whole tokens.
func preFamily(name string) (stages []preSplit, ignoreMerges bool, err error) {
	llama3 := preLlama3Like{digits: 3}.match
	qwen2 := preLlama3Like{digits: 1}.match
	switch name {
	case "default", "":
		return preIsolated(preMatchClassRun(preIsDefaultPunct), preMatchGPT2, preMatchClassRun(preIsN), preMatch3Digits), false, nil
	case "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2":
		return preIsolated(llama3), true, nil
	case "dbrx", "smaug-bpe", "smaug", "glm4", "chatglm-bpe":
		return preIsolated(llama3), false, nil
	case "deepseek-llm":
		return preIsolated(preMatchClassOne(preIsCRLF), preMatchOptSpaceRun(preDeepseekLetters), preMatchOptSpaceRun(preDeepseekPunct),
			preMatchTrailingSpace, preMatchClassRun(preDeepseekCJK), preMatchClassRun(preIsN)), false, nil
	case "deepseek-coder":
		return preIsolated(preMatchClassOne(preIsCRLF), preMatchOptSpaceRun(preIsL), preMatchOptSpaceRun(preIsP),
			preMatchClassRun(preDeepseekCJK), preMatchClassOne(preIsN)), false, nil
	case "deepseek-v3", "hunyuan-dense":
		return preIsolated(preMatchDigitsUpTo(3), preMatchClassRun(preDeepseekV3CJK), preMatchDeepseekV3), false, nil
	case "falcon":
		return preIsolated(preMatchClassRun(preIsFalconPunct), preMatchGPT2, preMatch3Digits), false, nil
	case "starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b":
		return preIsolated(preMatchClassOne(preIsN), preMatchGPT2), false, nil
	case "gpt2", "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
		"jina-v1-en", "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais", "trillion", "granite-docling", "exaone4", "gpt-neox":
		return preIsolated(preMatchGPT2), false, nil
	case "qwen2", "qwen3", "deepseek-r1-qwen", "kormo", "stablelm2", "megrez", "hunyuan", "grok-2":
		return preIsolated(qwen2), false, nil
	case "poro-chat", "poro", "bloom", "gpt3-finnish":
		return preIsolated(preMatchPoro), false, nil
	case "viking":
		return preIsolated(preMatchPoro, preMatchClassOne(preIsN)), false, nil
	case "tekken":
		return preIsolated(preCaseSplit{digits: 1}.match), true, nil
	case "gpt-4o", "llama4", "minimax-m2":
		return preIsolated(preCaseSplit{digits: 3, contraction: true}.match), false, nil
	case "chameleon":
		return preIsolated(preMatchSentinel, preMatchImageTokens, preMatchChameleonWS, preMatchClassOne(preIsN),
			preMatchClassOne(preIsChameleonPunct), preMatchGPT2), false, nil
	case "bailingmoe", "bailingmoe2", "llada-moe":
		return preIsolated(qwen2), false, nil
	case "seed-coder":
		return preIsolated(preLlama3Like{digits: 1, noPunctNewlines: true}.match), false, nil
	}
	return nil, false, fmt.Errorf("tokenizer: pre-tokenizer %q not supported", name)
}

// PreTokenizer returns the word splitter of a llama.cpp pre-tokenizer family
// (GGUF tokenizer.ggml.pre, e.g. "llama-bpe", "qwen2", "deepseek-coder").
// The pieces it returns always concatenate back to its input.
func PreTokenizer(name string) (func(string) []string, error) {
	stages, _, err := preFamily(name)
	if err != nil {
		return nil, err
	}
	return func(s string) []string { return preSplitWords(s, stages) }, nil
}

func preSplitWords(s string, stages []preSplit) []string {
	if s == "" {
		return nil
	}
	rs := []rune(s)
	spans := preRunSplits(rs, stages)
	// Cut the original string by byte offsets so invalid UTF-8 survives
	// ([]rune and DecodeRuneInString both count a bad byte as one rune).
	offs := make([]int, len(rs)+1)
	bi := 0
	for k := range rs {
		offs[k] = bi
		_, n := utf8.DecodeRuneInString(s[bi:])
		bi += n
	}
	offs[len(rs)] = bi
	out := make([]string, 0, len(spans))
	for _, sp := range spans {
		out = append(out, s[offs[sp.a]:offs[sp.b]])
	}
	return out
}
