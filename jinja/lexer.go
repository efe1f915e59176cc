package jinja

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

type tokKind int

const (
	tData tokKind = iota
	tVarBegin
	tVarEnd
	tBlockBegin
	tBlockEnd
	tName
	tString
	tInt
	tFloat
	tOp
	tEOF
)

type token struct {
	kind tokKind
	val  string // text, name, operator, unescaped string literal, number text
	pos  int    // byte offset in the normalized source
}

// SyntaxError is a template parse error; Line and Col are 1-based.
type SyntaxError struct {
	Line, Col int
	Msg       string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("jinja: syntax error at %d:%d: %s", e.Line, e.Col, e.Msg)
}

// lineCol converts a byte offset into 1-based line and column (in runes).
func lineCol(src string, pos int) (int, int) {
	if pos > len(src) {
		pos = len(src)
	}
	line := 1 + strings.Count(src[:pos], "\n")
	start := strings.LastIndexByte(src[:pos], '\n') + 1
	return line, 1 + utf8.RuneCountInString(src[start:pos])
}

// normalizeSource mirrors what Jinja's lexer does before tokenizing:
// newlines become "\n" and, without keep_trailing_newline, one trailing
// newline is dropped.
func normalizeSource(src string) string {
	if strings.Contains(src, "\r") {
		src = strings.ReplaceAll(src, "\r\n", "\n")
		src = strings.ReplaceAll(src, "\r", "\n")
	}
	return strings.TrimSuffix(src, "\n")
}

type lexer struct {
	src  string
	pos  int
	toks []token
	// lineStarting: the previous token ended with a newline (Jinja's
	// condition for lstrip_blocks on a tag that has no newline before it
	// in the same text chunk).
	lineStarting bool
}

func (l *lexer) errf(pos int, format string, args ...any) error {
	line, col := lineCol(l.src, pos)
	return &SyntaxError{line, col, fmt.Sprintf(format, args...)}
}

// lex tokenizes src with HF's settings: trim_blocks and lstrip_blocks on.
func lex(src string) ([]token, error) {
	l := &lexer{src: src, lineStarting: true}
	for l.pos < len(src) {
		// find the next tag start
		i := l.pos
		var start int = -1
		for {
			j := strings.IndexByte(src[i:], '{')
			if j < 0 {
				break
			}
			j += i
			if j+1 < len(src) && (src[j+1] == '{' || src[j+1] == '%' || src[j+1] == '#') {
				start = j
				break
			}
			i = j + 1
		}
		if start < 0 {
			l.emitText(src[l.pos:], l.pos)
			l.pos = len(src)
			break
		}
		kind := src[start+1]
		text := src[l.pos:start]
		sign := byte(0)
		if start+2 < len(src) && (src[start+2] == '-' || src[start+2] == '+') {
			sign = src[start+2]
		}
		switch {
		case sign == '-':
			text = strings.TrimRightFunc(text, unicode.IsSpace)
		case sign != '+' && kind != '{':
			// lstrip_blocks: drop spaces/tabs between the line start and the tag.
			lpos := strings.LastIndexByte(text, '\n') + 1
			if lpos > 0 || l.lineStarting {
				if strings.Trim(text[lpos:], " \t") == "" {
					text = text[:lpos]
				}
			}
		}
		l.emitText(text, l.pos)
		tagBody := start + 2
		if sign != 0 {
			tagBody++
		}
		var err error
		switch kind {
		case '#':
			err = l.comment(start, tagBody)
		case '{':
			l.toks = append(l.toks, token{kind: tVarBegin, pos: start})
			err = l.inside(tagBody, "}}", tVarEnd)
		case '%':
			if raw, ok := l.rawBlock(start, tagBody); ok {
				err = raw
			} else {
				l.toks = append(l.toks, token{kind: tBlockBegin, pos: start})
				err = l.inside(tagBody, "%}", tBlockEnd)
			}
		}
		if err != nil {
			return nil, err
		}
	}
	l.toks = append(l.toks, token{kind: tEOF, pos: len(src)})
	return l.toks, nil
}

func (l *lexer) emitText(s string, pos int) {
	if s != "" {
		l.toks = append(l.toks, token{kind: tData, val: s, pos: pos})
	}
}

// afterEnd consumes the whitespace control after a closing tag at end
// (the index just past "%}", "}}" or "#}"), given the sign before it.
func (l *lexer) afterEnd(end int, sign byte, block bool) {
	l.pos = end
	switch {
	case sign == '-':
		for l.pos < len(l.src) {
			r, n := utf8.DecodeRuneInString(l.src[l.pos:])
			if !unicode.IsSpace(r) {
				break
			}
			l.pos += n
		}
	case sign != '+' && block && l.pos < len(l.src) && l.src[l.pos] == '\n':
		l.pos++ // trim_blocks
	}
	l.lineStarting = l.pos > 0 && l.src[l.pos-1] == '\n'
}

func (l *lexer) comment(start, body int) error {
	j := strings.Index(l.src[body:], "#}")
	if j < 0 {
		return l.errf(start, "unclosed comment")
	}
	end := body + j
	sign := byte(0)
	if end > body && (l.src[end-1] == '-' || l.src[end-1] == '+') {
		sign = l.src[end-1]
	}
	l.afterEnd(end+2, sign, true)
	return nil
}

// rawBlock handles {% raw %}…{% endraw %}: everything inside is text.
func (l *lexer) rawBlock(start, body int) (error, bool) {
	p := body
	for p < len(l.src) && (l.src[p] == ' ' || l.src[p] == '\t' || l.src[p] == '\n') {
		p++
	}
	if !strings.HasPrefix(l.src[p:], "raw") {
		return nil, false
	}
	p += 3
	for p < len(l.src) && (l.src[p] == ' ' || l.src[p] == '\t' || l.src[p] == '\n') {
		p++
	}
	sign := byte(0)
	if p < len(l.src) && (l.src[p] == '-' || l.src[p] == '+') {
		sign = l.src[p]
		p++
	}
	if !strings.HasPrefix(l.src[p:], "%}") {
		return nil, false
	}
	// Jinja's raw_begin rule has no trim_blocks suffix: only "-" strips.
	if sign != '-' {
		sign = '+'
	}
	l.afterEnd(p+2, sign, true)
	// find {% endraw %} with optional whitespace control
	search := l.pos
	for {
		j := strings.Index(l.src[search:], "{%")
		if j < 0 {
			return l.errf(start, "missing {%% endraw %%}"), true
		}
		j += search
		q := j + 2
		esign := byte(0)
		if q < len(l.src) && (l.src[q] == '-' || l.src[q] == '+') {
			esign = l.src[q]
			q++
		}
		for q < len(l.src) && (l.src[q] == ' ' || l.src[q] == '\t' || l.src[q] == '\n') {
			q++
		}
		if !strings.HasPrefix(l.src[q:], "endraw") {
			search = j + 2
			continue
		}
		q += 6
		for q < len(l.src) && (l.src[q] == ' ' || l.src[q] == '\t' || l.src[q] == '\n') {
			q++
		}
		csign := byte(0)
		if q < len(l.src) && (l.src[q] == '-' || l.src[q] == '+') {
			csign = l.src[q]
			q++
		}
		if !strings.HasPrefix(l.src[q:], "%}") {
			search = j + 2
			continue
		}
		text := l.src[l.pos:j]
		if esign == '-' {
			text = strings.TrimRightFunc(text, unicode.IsSpace)
		} else if esign != '+' {
			lpos := strings.LastIndexByte(text, '\n') + 1
			if strings.Trim(text[lpos:], " \t") == "" && (lpos > 0 || l.lineStarting) {
				text = text[:lpos]
			}
		}
		l.emitText(text, l.pos)
		l.afterEnd(q+2, csign, true)
		return nil, true
	}
}

var ops2 = []string{"//", "**", "==", "!=", "<=", ">="}

const ops1 = "+-*/%~<>=()[]{},.:|!"

// inside tokenizes an expression region up to the closing delimiter.
func (l *lexer) inside(p int, closer string, endKind tokKind) error {
	src := l.src
	depth := 0 // brackets: a closer inside brackets is not the end ("{{ {'a':1}}}")
	for {
		for p < len(src) && unicode.IsSpace(rune(src[p])) {
			p++
		}
		if p >= len(src) {
			return l.errf(p, "unexpected end of template, expected %q", closer)
		}
		// closing delimiter, with optional whitespace control sign
		if depth == 0 {
			if (src[p] == '-' || src[p] == '+') && strings.HasPrefix(src[p+1:], closer) {
				l.toks = append(l.toks, token{kind: endKind, pos: p})
				l.afterEnd(p+1+len(closer), src[p], endKind == tBlockEnd)
				return nil
			}
			if strings.HasPrefix(src[p:], closer) {
				l.toks = append(l.toks, token{kind: endKind, pos: p})
				l.afterEnd(p+len(closer), 0, endKind == tBlockEnd)
				return nil
			}
		}
		c := src[p]
		switch {
		case c == '\'' || c == '"':
			s, n, err := l.stringLit(p)
			if err != nil {
				return err
			}
			l.toks = append(l.toks, token{kind: tString, val: s, pos: p})
			p = n
		case c >= '0' && c <= '9':
			q := p
			isFloat := false
			for q < len(src) && (src[q] >= '0' && src[q] <= '9' || src[q] == '_') {
				q++
			}
			if q+1 < len(src) && src[q] == '.' && src[q+1] >= '0' && src[q+1] <= '9' {
				isFloat = true
				q++
				for q < len(src) && (src[q] >= '0' && src[q] <= '9' || src[q] == '_') {
					q++
				}
			}
			if q < len(src) && (src[q] == 'e' || src[q] == 'E') {
				r := q + 1
				if r < len(src) && (src[r] == '+' || src[r] == '-') {
					r++
				}
				if r < len(src) && src[r] >= '0' && src[r] <= '9' {
					isFloat = true
					q = r
					for q < len(src) && src[q] >= '0' && src[q] <= '9' {
						q++
					}
				}
			}
			k := tInt
			if isFloat {
				k = tFloat
			}
			l.toks = append(l.toks, token{kind: k, val: strings.ReplaceAll(src[p:q], "_", ""), pos: p})
			p = q
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80:
			q := p
			for q < len(src) {
				r, n := utf8.DecodeRuneInString(src[q:])
				if r == '_' || unicode.IsLetter(r) || (q > p && unicode.IsDigit(r)) {
					q += n
					continue
				}
				break
			}
			if q == p {
				return l.errf(p, "unexpected character %q", src[p:p+1])
			}
			l.toks = append(l.toks, token{kind: tName, val: src[p:q], pos: p})
			p = q
		default:
			op := ""
			for _, o := range ops2 {
				if strings.HasPrefix(src[p:], o) {
					op = o
					break
				}
			}
			if op == "" && strings.IndexByte(ops1, c) >= 0 {
				op = src[p : p+1]
			}
			if op == "" {
				r, _ := utf8.DecodeRuneInString(src[p:])
				return l.errf(p, "unexpected character %q", r)
			}
			switch op {
			case "(", "[", "{":
				depth++
			case ")", "]", "}":
				if depth > 0 {
					depth--
				}
			}
			l.toks = append(l.toks, token{kind: tOp, val: op, pos: p})
			p += len(op)
		}
	}
}

// stringLit reads a Python-style quoted string starting at p.
func (l *lexer) stringLit(p int) (string, int, error) {
	src := l.src
	q := src[p]
	var b strings.Builder
	i := p + 1
	for i < len(src) {
		c := src[i]
		if c == q {
			return b.String(), i + 1, nil
		}
		if c != '\\' {
			b.WriteByte(c)
			i++
			continue
		}
		if i+1 >= len(src) {
			break
		}
		e := src[i+1]
		i += 2
		switch e {
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'r':
			b.WriteByte('\r')
		case '0':
			b.WriteByte(0)
		case 'a':
			b.WriteByte(7)
		case 'b':
			b.WriteByte(8)
		case 'f':
			b.WriteByte(12)
		case 'v':
			b.WriteByte(11)
		case '\\', '\'', '"':
			b.WriteByte(e)
		case '\n':
			// line continuation
		case 'x', 'u', 'U':
			n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[e]
			if i+n > len(src) {
				return "", 0, l.errf(i-2, "truncated \\%c escape", e)
			}
			var r rune
			for _, h := range src[i : i+n] {
				d := hexVal(byte(h))
				if d < 0 {
					return "", 0, l.errf(i-2, "invalid \\%c escape", e)
				}
				r = r*16 + rune(d)
			}
			if !utf8.ValidRune(r) {
				return "", 0, l.errf(i-2, "invalid code point in \\%c escape", e)
			}
			b.WriteRune(r)
			i += n
		default:
			// Python keeps unknown escapes verbatim.
			b.WriteByte('\\')
			b.WriteByte(e)
		}
	}
	return "", 0, l.errf(p, "unterminated string literal")
}

func hexVal(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}
