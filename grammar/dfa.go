package grammar

import (
	"fmt"
	"slices"
	"sort"
)

// dfa is a small deterministic automaton over bytes: one lexeme of the
// grammar (a JSON string, a number, a literal, a run of white space).
// Bytes with the same column of transitions share a class, so a table is
// states × classes instead of states × 256. State 0 is the start.
type dfa struct {
	cls  [256]uint8
	ncls int
	next []int32 // [state*ncls+class], -1 = dead
	acc  []bool  // the lexeme may end here
	out  []bool  // some byte continues from here
}

// step is the state after b, or -1.
func (d *dfa) step(st int32, b byte) int32 {
	return d.next[int(st)*d.ncls+int(d.cls[b])]
}

// dfaBuilder builds a dfa. Rows have one entry per byte class: with no
// class map given every byte is its own class and build merges bytes with
// equal columns; a class map of byte intervals (newIntervalBuilder) keeps
// large automata (length-bounded strings) small from the start.
type dfaBuilder struct {
	cls   [256]uint8
	width int
	merge bool
	rows  []int32 // [state*width+class]
	acc   []bool
}

func newBuilder256() *dfaBuilder {
	b := &dfaBuilder{width: 256, merge: true}
	for c := range b.cls {
		b.cls[c] = uint8(c)
	}
	return b
}

// newIntervalBuilder makes classes of the byte intervals that start at
// each of starts (0 implied); every range given to on must be a union of
// them.
func newIntervalBuilder(starts ...int) *dfaBuilder {
	b := &dfaBuilder{}
	k := -1
	for c := 0; c < 256; c++ {
		if c == 0 || slices.Contains(starts, c) {
			k++
		}
		b.cls[c] = uint8(k)
	}
	b.width = k + 1
	return b
}

func (b *dfaBuilder) state(accept bool) int32 {
	for range b.width {
		b.rows = append(b.rows, -1)
	}
	b.acc = append(b.acc, accept)
	return int32(len(b.acc) - 1)
}

func (b *dfaBuilder) on(from int32, lo, hi byte, to int32) {
	if !b.merge && (b.cls[lo] == b.cls[max(int(lo), 1)-1] && lo != 0 || hi != 255 && b.cls[hi] == b.cls[hi+1]) {
		panic(fmt.Sprintf("grammar: range %#x-%#x splits a byte class", lo, hi))
	}
	row := b.rows[int(from)*b.width:]
	for c := int(lo); c <= int(hi); c++ {
		row[b.cls[c]] = to
	}
}

func (b *dfaBuilder) onSet(from int32, set string, to int32) {
	for i := 0; i < len(set); i++ {
		b.on(from, set[i], set[i], to)
	}
}

// maxStates bounds one lexeme's automaton (string length limits multiply
// its states).
const maxStates = 1 << 16

func (b *dfaBuilder) build() (*dfa, error) {
	n := len(b.acc)
	if n > maxStates {
		return nil, fmt.Errorf("lexeme needs %d automaton states (limit %d)", n, maxStates)
	}
	d := &dfa{acc: b.acc, out: make([]bool, n), cls: b.cls, ncls: b.width, next: b.rows}
	if b.merge {
		// Bytes with equal columns share a class: hash the columns, then
		// confirm equality against each class's representative.
		var h [256]uint64
		for s := 0; s < n; s++ {
			row := b.rows[s*256 : s*256+256]
			for c := range h {
				h[c] = h[c]*0x100000001b3 ^ uint64(uint32(row[c]))
			}
		}
		sameCol := func(x, y int) bool {
			for s := 0; s < n; s++ {
				if b.rows[s*256+x] != b.rows[s*256+y] {
					return false
				}
			}
			return true
		}
		var reps []int // a representative byte per class
		for c := 0; c < 256; c++ {
			k := -1
			for i, r := range reps {
				if h[r] == h[c] && sameCol(r, c) {
					k = i
					break
				}
			}
			if k < 0 {
				k = len(reps)
				reps = append(reps, c)
			}
			d.cls[c] = uint8(k)
		}
		d.ncls = len(reps)
		d.next = make([]int32, n*d.ncls)
		for s := 0; s < n; s++ {
			for k, c := range reps {
				d.next[s*d.ncls+k] = b.rows[s*256+c]
			}
		}
	}
	for s := 0; s < n; s++ {
		for _, t := range d.next[s*d.ncls : (s+1)*d.ncls] {
			if t >= 0 {
				d.out[s] = true
				break
			}
		}
	}
	return d, nil
}

// literalsDFA accepts exactly the given byte strings (a trie). Its byte
// classes are the bytes the strings use plus one for all others, so a
// state costs a few bytes rather than a 256-entry row, and the trie's size
// is counted (one pass over the sorted strings, nothing allocated) and
// checked against bud before anything is built: an enum of 85,000 values
// is refused for the price of a sort.
func literalsDFA(lits []string, bud *budget) (*dfa, error) {
	if !sort.StringsAreSorted(lits) {
		lits = slices.Clone(lits)
		sort.Strings(lits)
	}
	var used [256]bool
	states := 1
	prev := ""
	for _, l := range lits {
		p := 0
		for p < len(l) && p < len(prev) && l[p] == prev[p] {
			p++
		}
		states += len(l) - p
		for i := p; i < len(l); i++ {
			used[l[i]] = true
		}
		prev = l
	}
	b := &dfaBuilder{}
	k := 0
	if slices.Contains(used[:], false) {
		k = 1 // class 0: every byte no string uses
	}
	for c := range used {
		if used[c] {
			b.cls[c] = uint8(k)
			k++
		}
	}
	b.width = k
	if states > maxStates {
		return nil, fmt.Errorf("lexeme needs %d automaton states (limit %d)", states, maxStates)
	}
	if bud != nil {
		if err := bud.fits(states, dfaBytes(states, b.width)); err != nil {
			return nil, err
		}
	}
	b.rows = make([]int32, 0, states*b.width)
	b.acc = make([]bool, 0, states)
	b.state(false)
	for _, l := range lits {
		s := int32(0)
		for i := 0; i < len(l); i++ {
			at := int(s)*b.width + int(b.cls[l[i]])
			t := b.rows[at]
			if t < 0 {
				t = b.state(false)
				b.rows[at] = t
			}
			s = t
		}
		b.acc[s] = true
	}
	return b.build()
}

// dfaBytes is the memory of an automaton of states states and width byte
// classes.
func dfaBytes(states, width int) int64 { return int64(states)*(int64(width)*4+2) + 512 }

// wsDFA accepts JSON white space the way llama.cpp's JSON grammars bound
// it: nothing, one space, or one newline followed by up to indent spaces or
// tabs (pretty printing), so a model cannot loop on blank lines.
func wsDFA(indent int) (*dfa, error) {
	b := newBuilder256()
	start := b.state(true)
	space := b.state(true)
	b.on(start, ' ', ' ', space)
	prev := b.state(true)
	b.on(start, '\n', '\n', prev)
	for i := 0; i < indent; i++ {
		s := b.state(true)
		b.onSet(prev, " \t", s)
		prev = s
	}
	return b.build()
}

// stringSpec describes a JSON string lexeme.
type stringSpec struct {
	minLen, maxLen int  // in characters (an escape is one); maxLen < 0: unbounded
	noEscape       bool // plain characters only (object keys that must differ from declared names)
}

// stringDFA accepts a quoted JSON string: any UTF-8 except '"', '\\' and
// control characters, or the escapes \" \\ \/ \b \f \n \r \t \uXXXX, with
// between minLen and maxLen characters.
func stringDFA(sp stringSpec) (*dfa, error) {
	// Byte classes: everything the string automaton tells apart.
	b := newIntervalBuilder(0x20, '"', '"'+1, '/', '0', '9'+1, 'A', 'F'+1, '\\', '\\'+1,
		'a', 'b', 'c', 'f', 'f'+1, 'n', 'n'+1, 'r', 'r'+1, 't', 'u', 'u'+1, 0x80, 0x90, 0xa0, 0xc0,
		0xc2, 0xe0, 0xe1, 0xed, 0xee, 0xf0, 0xf1, 0xf4, 0xf5)
	open := b.state(false)
	closed := b.state(true)
	levels := sp.maxLen
	if levels < 0 {
		levels = sp.minLen
	}
	// body[c]: c characters read; per level the partial-character states.
	type level struct{ body, esc, u1, u2, u3, u4, c1, c2, c3, e0, ed, f0, f4 int32 }
	ls := make([]level, levels+1)
	b.rows = slices.Grow(b.rows, (2+13*len(ls))*b.width)
	for c := range ls {
		l := &ls[c]
		l.body = b.state(false)
		l.esc = b.state(false)
		l.u1, l.u2, l.u3, l.u4 = b.state(false), b.state(false), b.state(false), b.state(false)
		l.c1, l.c2, l.c3 = b.state(false), b.state(false), b.state(false)
		l.e0, l.ed, l.f0, l.f4 = b.state(false), b.state(false), b.state(false), b.state(false)
	}
	b.on(open, '"', '"', ls[0].body)
	for c := range ls {
		l := ls[c]
		if c >= sp.minLen {
			b.on(l.body, '"', '"', closed)
		}
		if c == sp.maxLen { // full
			continue
		}
		nc := c + 1
		if nc > levels { // unbounded: stay at the last level
			nc = levels
		}
		done := ls[nc].body
		b.on(l.body, 0x20, 0x7f, done)
		b.on(l.body, '"', '"', -1)
		if c >= sp.minLen {
			b.on(l.body, '"', '"', closed)
		}
		b.on(l.body, '\\', '\\', -1)
		if !sp.noEscape {
			b.on(l.body, '\\', '\\', l.esc)
			b.onSet(l.esc, `"\/bfnrt`, done)
			b.on(l.esc, 'u', 'u', l.u1)
			for _, p := range [][2]int32{{l.u1, l.u2}, {l.u2, l.u3}, {l.u3, l.u4}, {l.u4, done}} {
				b.on(p[0], '0', '9', p[1])
				b.on(p[0], 'a', 'f', p[1])
				b.on(p[0], 'A', 'F', p[1])
			}
		}
		// UTF-8 (RFC 3629 well-formed sequences).
		b.on(l.body, 0xc2, 0xdf, l.c1)
		b.on(l.body, 0xe0, 0xe0, l.e0)
		b.on(l.body, 0xe1, 0xec, l.c2)
		b.on(l.body, 0xed, 0xed, l.ed)
		b.on(l.body, 0xee, 0xef, l.c2)
		b.on(l.body, 0xf0, 0xf0, l.f0)
		b.on(l.body, 0xf1, 0xf3, l.c3)
		b.on(l.body, 0xf4, 0xf4, l.f4)
		b.on(l.c1, 0x80, 0xbf, done)
		b.on(l.c2, 0x80, 0xbf, l.c1)
		b.on(l.c3, 0x80, 0xbf, l.c2)
		b.on(l.e0, 0xa0, 0xbf, l.c1)
		b.on(l.ed, 0x80, 0x9f, l.c1)
		b.on(l.f0, 0x90, 0xbf, l.c2)
		b.on(l.f4, 0x80, 0x8f, l.c2)
	}
	return b.build()
}

// Digit limits keep numbers exact in a float64 and stop a model from
// looping on digits.
const (
	maxIntDigits  = 15
	maxFracDigits = 15
	maxExpDigits  = 2
)

// numberDFA accepts a JSON number; integer: no fraction or exponent;
// nonNeg: no minus sign.
func numberDFA(integer, nonNeg bool) (*dfa, error) {
	b := newBuilder256()
	start := b.state(false)
	minus := b.state(false)
	zero := b.state(true)
	if !nonNeg {
		b.on(start, '-', '-', minus)
	}
	ints := make([]int32, maxIntDigits) // ints[k]: k+1 digits read, first nonzero
	for k := range ints {
		ints[k] = b.state(true)
	}
	for _, s := range []int32{start, minus} {
		b.on(s, '0', '0', zero)
		b.on(s, '1', '9', ints[0])
	}
	for k := 0; k+1 < len(ints); k++ {
		b.on(ints[k], '0', '9', ints[k+1])
	}
	if integer {
		return b.build()
	}
	intEnds := append([]int32{zero}, ints...)
	dot := b.state(false)
	fr := make([]int32, maxFracDigits)
	for k := range fr {
		fr[k] = b.state(true)
	}
	e := b.state(false)
	esign := b.state(false)
	ex := make([]int32, maxExpDigits)
	for k := range ex {
		ex[k] = b.state(true)
	}
	for _, s := range intEnds {
		b.on(s, '.', '.', dot)
		b.onSet(s, "eE", e)
	}
	b.on(dot, '0', '9', fr[0])
	for k := range fr {
		if k+1 < len(fr) {
			b.on(fr[k], '0', '9', fr[k+1])
		}
		b.onSet(fr[k], "eE", e)
	}
	b.onSet(e, "+-", esign)
	b.on(e, '0', '9', ex[0])
	b.on(esign, '0', '9', ex[0])
	for k := 0; k+1 < len(ex); k++ {
		b.on(ex[k], '0', '9', ex[k+1])
	}
	return b.build()
}
