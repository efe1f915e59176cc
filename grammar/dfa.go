package grammar

import "fmt"

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

// dfaBuilder builds a dfa with dense rows, then compresses it.
type dfaBuilder struct {
	rows [][256]int32
	acc  []bool
}

func (b *dfaBuilder) state(accept bool) int32 {
	var row [256]int32
	for i := range row {
		row[i] = -1
	}
	b.rows = append(b.rows, row)
	b.acc = append(b.acc, accept)
	return int32(len(b.rows) - 1)
}

func (b *dfaBuilder) on(from int32, lo, hi byte, to int32) {
	for c := int(lo); c <= int(hi); c++ {
		b.rows[from][c] = to
	}
}

func (b *dfaBuilder) onSet(from int32, set string, to int32) {
	for i := 0; i < len(set); i++ {
		b.rows[from][set[i]] = to
	}
}

// maxStates bounds one lexeme's automaton (string length limits multiply
// its states).
const maxStates = 1 << 16

func (b *dfaBuilder) build() (*dfa, error) {
	if len(b.rows) > maxStates {
		return nil, fmt.Errorf("lexeme needs %d automaton states (limit %d)", len(b.rows), maxStates)
	}
	d := &dfa{acc: b.acc, out: make([]bool, len(b.rows))}
	classOf := map[string]uint8{}
	col := make([]byte, 4*len(b.rows))
	var reps []int // a representative byte per class
	for c := 0; c < 256; c++ {
		for s := range b.rows {
			v := uint32(b.rows[s][c])
			col[4*s], col[4*s+1], col[4*s+2], col[4*s+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
		}
		k, ok := classOf[string(col)]
		if !ok {
			k = uint8(len(reps))
			classOf[string(col)] = k
			reps = append(reps, c)
		}
		d.cls[c] = k
	}
	d.ncls = len(reps)
	d.next = make([]int32, len(b.rows)*d.ncls)
	for s := range b.rows {
		for k, c := range reps {
			t := b.rows[s][c]
			d.next[s*d.ncls+k] = t
			if t >= 0 {
				d.out[s] = true
			}
		}
	}
	return d, nil
}

// literalsDFA accepts exactly the given byte strings (a trie).
func literalsDFA(lits []string) (*dfa, error) {
	b := &dfaBuilder{}
	b.state(false)
	for _, l := range lits {
		s := int32(0)
		for i := 0; i < len(l); i++ {
			t := b.rows[s][l[i]]
			if t < 0 {
				t = b.state(false)
				b.rows[s][l[i]] = t
			}
			s = t
		}
		b.acc[s] = true
	}
	return b.build()
}

// wsDFA accepts JSON white space the way llama.cpp's JSON grammars bound
// it: nothing, one space, or one newline followed by up to indent spaces or
// tabs (pretty printing), so a model cannot loop on blank lines.
func wsDFA(indent int) (*dfa, error) {
	b := &dfaBuilder{}
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
	b := &dfaBuilder{}
	open := b.state(false)
	closed := b.state(true)
	levels := sp.maxLen
	if levels < 0 {
		levels = sp.minLen
	}
	// body[c]: c characters read; per level the partial-character states.
	type level struct{ body, esc, u1, u2, u3, u4, c1, c2, c3, e0, ed, f0, f4 int32 }
	ls := make([]level, levels+1)
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
		b.rows[l.body]['"'] = -1
		if c >= sp.minLen {
			b.rows[l.body]['"'] = closed
		}
		b.rows[l.body]['\\'] = -1
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
	b := &dfaBuilder{}
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
