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

// matchStage finds matches by trying a matcher at every position.
type matchStage struct{ m preMatcher }

func (s matchStage) find(rs []rune, dst []preSpan) []preSpan {
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

// regexpStage finds matches with Go's regexp, for tokenizer.json patterns
// that have no hand-written matcher and that RE2 can compile.
type regexpStage struct{ re *regexp.Regexp }

func (s regexpStage) find(rs []rune, dst []preSpan) []preSpan {
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

// splitBehavior is HF's SplitDelimiterBehavior.
type splitBehavior int

const (
	splitIsolated splitBehavior = iota
	splitRemoved
	splitMergedWithPrevious
	splitMergedWithNext
	splitContiguous
)

// preSplit is one stage with what happens to the matches.
type preSplit struct {
	stage    preStage
	behavior splitBehavior
	invert   bool
}

// runSplits applies the stages in order to rs and returns the final pieces.
func runSplits(rs []rune, stages []preSplit) []preSpan {
	cur := []preSpan{{0, len(rs)}}
	if len(rs) == 0 {
		return nil
	}
	var next, ms []preSpan
	for _, st := range stages {
		next = next[:0]
		for _, f := range cur {
			ms = st.stage.find(rs[f.a:f.b], ms[:0])
			next = applyBehavior(next, f.a, f.b-f.a, ms, st.behavior, st.invert)
		}
		cur, next = next, cur
	}
	return cur
}

// applyBehavior turns the matches of one fragment (offset off, length n)
// into pieces as HF's NormalizedString::split does.
func applyBehavior(dst []preSpan, off, n int, ms []preSpan, beh splitBehavior, invert bool) []preSpan {
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
	case splitIsolated:
		for _, p := range parts {
			emit(p.a, p.b)
		}
	case splitRemoved:
		for _, p := range parts {
			if !p.match {
				emit(p.a, p.b)
			}
		}
	case splitMergedWithPrevious:
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
	case splitMergedWithNext:
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
	case splitContiguous:
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

func isL(r rune) bool {
	if r < 0x80 {
		return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z'
	}
	return unicode.IsLetter(r)
}

func isN(r rune) bool {
	if r < 0x80 {
		return '0' <= r && r <= '9'
	}
	return unicode.IsNumber(r)
}

func isSpace(r rune) bool {
	if r < 0x80 {
		return r == ' ' || '\t' <= r && r <= '\r'
	}
	return unicode.IsSpace(r)
}

func isP(r rune) bool { return unicode.IsPunct(r) }
func isS(r rune) bool { return unicode.IsSymbol(r) }
func isM(r rune) bool { return r >= 0x300 && unicode.IsMark(r) }

func isCRLF(r rune) bool { return r == '\r' || r == '\n' }

// isOther is [^\s\p{L}\p{N}].
func isOther(r rune) bool { return !isSpace(r) && !isL(r) && !isN(r) }

// runUpTo is runOf limited to n runes: {1,n} quantifiers must not scan a
// long run at every position (quadratic on a million digits).
func runUpTo(rs []rune, i, n int, f func(rune) bool) int {
	j := i
	for j < len(rs) && j-i < n && f(rs[j]) {
		j++
	}
	return j
}

func runOf(rs []rune, i int, f func(rune) bool) int {
	j := i
	for j < len(rs) && f(rs[j]) {
		j++
	}
	return j
}

// matchContraction matches 's|'t|'re|'ve|'m|'ll|'d (ASCII apostrophe),
// case-insensitively when ci (the (?i:...) of llama3 and qwen2).
func matchContraction(rs []rune, i int, ci bool) int {
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

// matchSpaceTail covers the shared tail \s+(?!\S)|\s+: a run of whitespace
// followed by a non-space gives back its last character to the next word.
func matchSpaceTail(rs []rune, i int) int {
	if !isSpace(rs[i]) {
		return 0
	}
	j := runOf(rs, i, isSpace)
	if j == len(rs) || j-i == 1 {
		return j - i
	}
	return j - i - 1
}

// matchSpaceNewlines is \s*[\r\n]+: whitespace up to and including the last
// newline of the run.
func matchSpaceNewlines(rs []rune, i int) int {
	if !isSpace(rs[i]) {
		return 0
	}
	j := runOf(rs, i, isSpace)
	for k := j - 1; k >= i; k-- {
		if isCRLF(rs[k]) {
			return k + 1 - i
		}
	}
	return 0
}

// matchGPT2 is 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+.
func matchGPT2(rs []rune, i int) int {
	if n := matchContraction(rs, i, false); n > 0 {
		return n
	}
	s := i
	if rs[i] == ' ' && i+1 < len(rs) {
		s = i + 1
	}
	c := rs[s]
	switch {
	case isL(c):
		return runOf(rs, s, isL) - i
	case isN(c):
		return runOf(rs, s, isN) - i
	case isOther(c):
		return runOf(rs, s, isOther) - i
	}
	return matchSpaceTail(rs, i)
}

// llama3Like describes the llama3 family of regexes:
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,digits}|
// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
type llama3Like struct {
	digits int // 3 for llama3, 1 for qwen2
	// seed-coder: " ?[^\s\p{L}\p{N}\r\n]+" without the trailing newlines.
	noPunctNewlines bool
	// bailingmoe's "\s*[\r\n]" (one newline) matches exactly what
	// "\s*[\r\n]+" does: both end at the last newline of the run.
}

func (c llama3Like) match(rs []rune, i int) int {
	if n := matchContraction(rs, i, true); n > 0 {
		return n
	}
	r := rs[i]
	if !isCRLF(r) && !isL(r) && !isN(r) && i+1 < len(rs) && isL(rs[i+1]) {
		return runOf(rs, i+1, isL) - i
	}
	if isL(r) {
		return runOf(rs, i, isL) - i
	}
	if isN(r) {
		return runUpTo(rs, i, c.digits, isN) - i
	}
	s := i
	if r == ' ' && i+1 < len(rs) {
		s = i + 1
	}
	if isOther(rs[s]) {
		j := runOf(rs, s, isOther)
		if !c.noPunctNewlines {
			j = runOf(rs, j, isCRLF)
		}
		return j - i
	}
	if n := matchSpaceNewlines(rs, i); n > 0 {
		return n
	}
	return matchSpaceTail(rs, i)
}

// isPS is [\p{P}\p{S}].
func isPS(r rune) bool { return isP(r) || isS(r) }

func isASCIIPunct(r rune) bool {
	return r >= '!' && r <= '/' || r >= ':' && r <= '@' || r >= '[' && r <= '`' || r >= '{' && r <= '~'
}

func isASCIILetter(r rune) bool { return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' }

func isLM(r rune) bool { return isL(r) || isM(r) }

// matchDeepseekV3 is the third DeepSeek-V3 regex:
// [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|
// ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
func matchDeepseekV3(rs []rune, i int) int {
	r := rs[i]
	if isASCIIPunct(r) && i+1 < len(rs) && isASCIILetter(rs[i+1]) {
		return runOf(rs, i+1, isASCIILetter) - i
	}
	if !isCRLF(r) && !isL(r) && !isPS(r) && i+1 < len(rs) && isLM(rs[i+1]) {
		return runOf(rs, i+1, isLM) - i
	}
	if isLM(r) {
		return runOf(rs, i, isLM) - i
	}
	s := i
	if r == ' ' && i+1 < len(rs) {
		s = i + 1
	}
	if isPS(rs[s]) {
		j := runOf(rs, s, isPS)
		return runOf(rs, j, isCRLF) - i
	}
	if n := matchSpaceNewlines(rs, i); n > 0 {
		return n
	}
	return matchSpaceTail(rs, i)
}

// Tekken and GPT-4o split upper- and lower-case runs:
// [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|
// [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|...

func isUpperish(r rune) bool {
	if r < 0x80 {
		return 'A' <= r && r <= 'Z'
	}
	return unicode.In(r, unicode.Lu, unicode.Lt, unicode.Lm, unicode.Lo, unicode.M)
}

func isLowerish(r rune) bool {
	if r < 0x80 {
		return 'a' <= r && r <= 'z'
	}
	return unicode.In(r, unicode.Ll, unicode.Lm, unicode.Lo, unicode.M)
}

// upperThenLower is U*L+ at s with backtracking; -1 when it cannot match.
func upperThenLower(rs []rune, s int) int {
	u := runOf(rs, s, isUpperish)
	for k := u; k >= s; k-- {
		if k < len(rs) && isLowerish(rs[k]) {
			return runOf(rs, k, isLowerish)
		}
	}
	return -1
}

// upperPlusLower is U+L* at s; -1 when it cannot match.
func upperPlusLower(rs []rune, s int) int {
	u := runOf(rs, s, isUpperish)
	if u == s {
		return -1
	}
	return runOf(rs, u, isLowerish)
}

type caseSplit struct {
	digits      int  // \p{N}{1,digits}
	contraction bool // gpt-4o: (?i:'s|...)? after each word
}

func (c caseSplit) match(rs []rune, i int) int {
	r := rs[i]
	pre := !isCRLF(r) && !isL(r) && !isN(r)
	word := func(f func([]rune, int) int) int {
		if pre && i+1 < len(rs) {
			if e := f(rs, i+1); e >= 0 {
				return e
			}
		}
		return f(rs, i)
	}
	e := word(upperThenLower)
	if e < 0 {
		e = word(upperPlusLower)
	}
	if e > i {
		if c.contraction && e < len(rs) {
			e += matchContraction(rs, e, true)
		}
		return e - i
	}
	if isN(r) {
		return runUpTo(rs, i, c.digits, isN) - i
	}
	s := i
	if r == ' ' && i+1 < len(rs) {
		s = i + 1
	}
	if isOther(rs[s]) {
		j := runOf(rs, s, isOther)
		return runOf(rs, j, func(r rune) bool { return isCRLF(r) || r == '/' }) - i
	}
	if n := matchSpaceNewlines(rs, i); n > 0 {
		return n
	}
	return matchSpaceTail(rs, i)
}

// Simple building blocks for the multi-stage families.

func matchClassRun(f func(rune) bool) preMatcher {
	return func(rs []rune, i int) int { return runOf(rs, i, f) - i }
}

func matchClassOne(f func(rune) bool) preMatcher {
	return func(rs []rune, i int) int {
		if f(rs[i]) {
			return 1
		}
		return 0
	}
}

// matchDigitsUpTo is \p{N}{1,n}.
func matchDigitsUpTo(n int) preMatcher {
	return func(rs []rune, i int) int { return runUpTo(rs, i, n, isN) - i }
}

// matchOptSpaceRun is \s?[class]+.
func matchOptSpaceRun(f func(rune) bool) preMatcher {
	return func(rs []rune, i int) int {
		if isSpace(rs[i]) && i+1 < len(rs) && f(rs[i+1]) {
			return runOf(rs, i+1, f) - i
		}
		return runOf(rs, i, f) - i
	}
}

// matchTrailingSpace is \s+$ within the fragment.
func matchTrailingSpace(rs []rune, i int) int {
	// Inside a run the previous position already failed, and so does
	// this one; checking that keeps long runs linear.
	if !isSpace(rs[i]) || i > 0 && isSpace(rs[i-1]) {
		return 0
	}
	if j := runOf(rs, i, isSpace); j == len(rs) {
		return j - i
	}
	return 0
}

func inRanges(t *unicode.RangeTable) func(rune) bool {
	return func(r rune) bool { return unicode.Is(t, r) }
}

// rangeTable builds a table from pairs of inclusive bounds.
func rangeTable(pairs ...rune) *unicode.RangeTable {
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
	deepseekLettersTable = rangeTable(
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
	deepseekLetters = inRanges(deepseekLettersTable)
	// [!-/:-~！-／：-～‘-‟　-。]
	deepseekPunct = inRanges(rangeTable('!', '/', ':', '~', 0x2018, 0x201F, 0x3000, 0x3002, 0xFF01, 0xFF0F, 0xFF1A, 0xFF5E))
	// [一-龥ࠀ-一가-퟿]
	deepseekCJK = inRanges(rangeTable(0x0800, 0x9FA5, 0xAC00, 0xD7FF))
	// [一-龥぀-ゟ゠-ヿ]
	deepseekV3CJK = inRanges(rangeTable(0x3040, 0x309F, 0x30A0, 0x30FF, 0x4E00, 0x9FA5))
)

func isFalconPunct(r rune) bool {
	switch r {
	case '$', '+', '<', '=', '>', '^', '~', '|', '`':
		return true
	}
	return isP(r)
}

func isDefaultPunct(r rune) bool { return r != '`' && isFalconPunct(r) }

func isASCIIDigit(r rune) bool { return '0' <= r && r <= '9' }

// match3Digits is [0-9][0-9][0-9].
func match3Digits(rs []rune, i int) int {
	if i+2 < len(rs) && isASCIIDigit(rs[i]) && isASCIIDigit(rs[i+1]) && isASCIIDigit(rs[i+2]) {
		return 3
	}
	return 0
}

// matchPoro is " ?[^(\s|.,!?…。，、।۔،)]+".
func matchPoro(rs []rune, i int) int {
	ok := func(r rune) bool {
		switch r {
		case '(', '|', ')', '.', ',', '!', '?', '…', '。', '，', '、', '।', '۔', '،':
			return false
		}
		return !isSpace(r)
	}
	s := i
	if rs[i] == ' ' && i+1 < len(rs) && ok(rs[i+1]) {
		s = i + 1
	}
	return runOf(rs, s, ok) - i
}

// Chameleon's extra stages.

func matchLiteral(lit string) preMatcher {
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

// matchSentinel is <sentinel:[0-9]+>.
var (
	matchSentinelPrefix = matchLiteral("<sentinel:")
	matchIMGIMG         = matchLiteral("IMGIMG")
	match4Spaces        = matchLiteral("    ")
	match2Spaces        = matchLiteral("  ")
)

func matchSentinel(rs []rune, i int) int {
	n := matchSentinelPrefix(rs, i)
	if n == 0 {
		return 0
	}
	j := runOf(rs, i+n, isASCIIDigit)
	if j == i+n || j >= len(rs) || rs[j] != '>' {
		return 0
	}
	return j + 1 - i
}

// matchImageTokens is (IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z.
func matchImageTokens(rs []rune, i int) int {
	n := matchIMGIMG(rs, i)
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

// matchChameleonWS is ([\t\n]|    |  ).
func matchChameleonWS(rs []rune, i int) int {
	if rs[i] == '\t' || rs[i] == '\n' {
		return 1
	}
	if n := match4Spaces(rs, i); n > 0 {
		return n
	}
	return match2Spaces(rs, i)
}

func isChameleonPunct(r rune) bool { return isASCIIPunct(r) || isP(r) }

func isolated(ms ...preMatcher) []preSplit {
	out := make([]preSplit, len(ms))
	for k, m := range ms {
		out[k] = preSplit{stage: matchStage{m}}
	}
	return out
}

// preFamily resolves a llama.cpp tokenizer.ggml.pre name to its stages and
// whether the family skips merging for words that are whole tokens.
func preFamily(name string) (stages []preSplit, ignoreMerges bool, err error) {
	llama3 := llama3Like{digits: 3}.match
	qwen2 := llama3Like{digits: 1}.match
	switch name {
	case "default", "":
		return isolated(matchClassRun(isDefaultPunct), matchGPT2, matchClassRun(isN), match3Digits), false, nil
	case "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2":
		return isolated(llama3), true, nil
	case "dbrx", "smaug-bpe", "smaug", "glm4", "chatglm-bpe":
		return isolated(llama3), false, nil
	case "deepseek-llm":
		return isolated(matchClassOne(isCRLF), matchOptSpaceRun(deepseekLetters), matchOptSpaceRun(deepseekPunct),
			matchTrailingSpace, matchClassRun(deepseekCJK), matchClassRun(isN)), false, nil
	case "deepseek-coder":
		return isolated(matchClassOne(isCRLF), matchOptSpaceRun(isL), matchOptSpaceRun(isP),
			matchClassRun(deepseekCJK), matchClassOne(isN)), false, nil
	case "deepseek-v3", "hunyuan-dense":
		return isolated(matchDigitsUpTo(3), matchClassRun(deepseekV3CJK), matchDeepseekV3), false, nil
	case "falcon":
		return isolated(matchClassRun(isFalconPunct), matchGPT2, match3Digits), false, nil
	case "starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b":
		return isolated(matchClassOne(isN), matchGPT2), false, nil
	case "gpt2", "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
		"jina-v1-en", "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais", "trillion", "granite-docling", "exaone4", "gpt-neox":
		return isolated(matchGPT2), false, nil
	case "qwen2", "qwen3", "deepseek-r1-qwen", "kormo", "stablelm2", "megrez", "hunyuan", "grok-2":
		return isolated(qwen2), false, nil
	case "poro-chat", "poro", "bloom", "gpt3-finnish":
		return isolated(matchPoro), false, nil
	case "viking":
		return isolated(matchPoro, matchClassOne(isN)), false, nil
	case "tekken":
		return isolated(caseSplit{digits: 1}.match), true, nil
	case "gpt-4o", "llama4", "minimax-m2":
		return isolated(caseSplit{digits: 3, contraction: true}.match), false, nil
	case "chameleon":
		return isolated(matchSentinel, matchImageTokens, matchChameleonWS, matchClassOne(isN),
			matchClassOne(isChameleonPunct), matchGPT2), false, nil
	case "bailingmoe", "bailingmoe2", "llada-moe":
		return isolated(qwen2), false, nil
	case "seed-coder":
		return isolated(llama3Like{digits: 1, noPunctNewlines: true}.match), false, nil
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
	return func(s string) []string { return splitWords(s, stages) }, nil
}

func splitWords(s string, stages []preSplit) []string {
	if s == "" {
		return nil
	}
	rs := []rune(s)
	spans := runSplits(rs, stages)
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
