package grammar

import (
	"fmt"
	"math"
	"math/bits"
	"slices"
	"sync"
)

// Constraint is a grammar bound to a vocabulary, shared by the matchers of
// every completion that uses it; it caches the token mask of each parser
// state it has seen (JSON strings, for one, repeat a state token after
// token).
type Constraint struct {
	g *Grammar
	v *Vocab

	mu      sync.Mutex
	cache   map[string][]uint64
	lex     map[lexKey]*lexMask
	noState bool // benchmarks: no mask cache by parser state
	noLex   bool // benchmarks: no mask cache by lexeme state
}

// lexKey is a state inside one lexeme's automaton.
type lexKey struct{ dfa, st int32 }

// lexMask is what a lexeme state allows whatever the stack below it: the
// tokens whose bytes all stay inside the lexeme, and the trie nodes where
// the lexeme may end (entered from automaton state st), which need the
// stack.
type lexMask struct {
	bits  []uint64
	exits []lexExit
}

type lexExit struct{ node, st int32 }

// Each of a Constraint's two mask caches holds at most maxCached masks
// and about cacheBytes of them (a 150k vocabulary's mask is 19 KB).
const (
	maxCached  = 256
	cacheBytes = 4 << 20
)

// cacheCap is how many masks of this vocabulary a cache keeps.
func (c *Constraint) cacheCap() int {
	return max(8, min(maxCached, cacheBytes/(8*((len(c.v.pieces)+63)/64+1))))
}

// New binds g to v.
func New(g *Grammar, v *Vocab) *Constraint {
	return &Constraint{g: g, v: v, cache: map[string][]uint64{}, lex: map[lexKey]*lexMask{}}
}

// top is one stack of the parser: a lexeme at grammar position pos, in
// state st of its automaton, over return frames from rest (-1: none). pos
// -1 is an empty stack: the document is complete.
type top struct{ pos, st, rest int32 }

// frame is a return position under the top of a stack.
type frame struct{ pos, next int32 }

// Matcher is one completion's parser state. Not safe for concurrent use.
type Matcher struct {
	c      *Constraint
	tops   []top
	frames []frame // the committed state's frames, then scratch
	done   bool    // an end-of-generation token was accepted

	buf   []top
	bits  []uint64
	key   []byte
	tmp   []frame
	remap []int32
}

// Matcher starts a document.
func (c *Constraint) Matcher() *Matcher {
	m := &Matcher{c: c}
	m.expand(0, -1)
	m.dedup(0)
	m.tops = append(m.tops, m.buf...)
	m.buf = m.buf[:0]
	m.compact()
	return m
}

// expand pushes onto m.buf every stack that grammar position pos over
// frames rest can reach before reading a byte.
func (m *Matcher) expand(pos, rest int32) {
	g := m.c.g
	for {
		e := g.elems[pos]
		switch e.kind {
		case kEnd:
			if rest < 0 {
				m.buf = append(m.buf, top{-1, 0, -1})
				return
			}
			f := m.frames[rest]
			pos, rest = f.pos, f.next
		case kLex:
			d := g.dfas[e.arg]
			if d.out[0] {
				m.buf = append(m.buf, top{pos, 0, rest})
			}
			if !d.acc[0] {
				return
			}
			pos++
		case kRef:
			r := rest
			if g.elems[pos+1].kind != kEnd { // no frame for a tail call
				m.frames = append(m.frames, frame{pos + 1, rest})
				r = int32(len(m.frames) - 1)
			}
			alts := g.rules[e.arg]
			if len(alts) == 0 {
				return
			}
			for _, a := range alts[1:] {
				m.expand(a, r)
			}
			pos, rest = alts[0], r
		}
	}
}

// advance pushes onto m.buf what stack t becomes after byte b.
func (m *Matcher) advance(t top, b byte) {
	if t.pos < 0 {
		return
	}
	g := m.c.g
	d := g.dfas[g.elems[t.pos].arg]
	ns := d.step(t.st, b)
	if ns < 0 {
		return
	}
	if d.out[ns] {
		m.buf = append(m.buf, top{t.pos, ns, t.rest})
	}
	if d.acc[ns] {
		m.expand(t.pos+1, t.rest)
	}
}

func (m *Matcher) sameFrames(a, b int32) bool {
	for a != b {
		if a < 0 || b < 0 || m.frames[a].pos != m.frames[b].pos {
			return false
		}
		a, b = m.frames[a].next, m.frames[b].next
	}
	return true
}

// dedup removes repeated stacks from m.buf[start:].
func (m *Matcher) dedup(start int) {
	s := m.buf[start:]
	if len(s) < 2 {
		return
	}
	n := 0
outer:
	for _, t := range s {
		for _, u := range s[:n] {
			if t.pos == u.pos && t.st == u.st && m.sameFrames(t.rest, u.rest) {
				continue outer
			}
		}
		s[n] = t
		n++
	}
	m.buf = m.buf[:start+n]
}

// compact copies the frames the committed tops use to the front of
// m.frames, dropping the rest.
func (m *Matcher) compact() {
	if cap(m.remap) < len(m.frames) {
		m.remap = make([]int32, len(m.frames))
	}
	remap := m.remap[:len(m.frames)]
	for i := range remap {
		remap[i] = -1
	}
	m.tmp = m.tmp[:0]
	var cp func(i int32) int32
	cp = func(i int32) int32 {
		if i < 0 {
			return -1
		}
		if remap[i] >= 0 {
			return remap[i]
		}
		next := cp(m.frames[i].next)
		m.tmp = append(m.tmp, frame{m.frames[i].pos, next})
		remap[i] = int32(len(m.tmp) - 1)
		return remap[i]
	}
	for k := range m.tops {
		m.tops[k].rest = cp(m.tops[k].rest)
	}
	m.frames, m.tmp = append(m.frames[:0], m.tmp...), m.frames
}

// Complete reports whether the text so far is a whole document.
func (m *Matcher) Complete() bool {
	if m.done {
		return true
	}
	for _, t := range m.tops {
		if t.pos < 0 {
			return true
		}
	}
	return false
}

// Done reports whether an end-of-generation token was accepted.
func (m *Matcher) Done() bool { return m.done }

// stateKey identifies the committed state for the mask cache.
func (m *Matcher) stateKey() []byte {
	k := m.key[:0]
	put := func(v int32) { k = append(k, byte(v), byte(v>>8), byte(v>>16), byte(v>>24)) }
	for _, t := range m.tops {
		put(t.pos)
		put(t.st)
		for r := t.rest; r >= 0; r = m.frames[r].next {
			put(m.frames[r].pos)
		}
		put(-2)
	}
	m.key = k
	return k
}

// Allowed returns the bitmap of the tokens that may come next (bit id%64
// of word id/64); it is shared and must not be modified.
func (m *Matcher) Allowed() []uint64 {
	v := m.c.v
	words := (len(v.pieces) + 63) / 64
	if m.done {
		return m.eogBits(make([]uint64, words))
	}
	key := m.stateKey()
	c := m.c
	c.mu.Lock()
	bits, ok := c.cache[string(key)]
	c.mu.Unlock()
	ok = ok && !c.noState
	if ok {
		return bits
	}
	bits = make([]uint64, words)
	m.bits = bits
	base := len(m.frames)
	if len(m.tops) == 1 && m.tops[0].pos >= 0 {
		// One stack: the lexeme's own mask (shared by every stack that
		// has this lexeme state on top), then its exits with this stack.
		t := m.tops[0]
		lm := m.lexMask(t)
		copy(bits, lm.bits)
		for _, e := range lm.exits {
			m.buf = append(m.buf[:0], top{t.pos, e.st, t.rest})
			m.child(e.node, 0, 1)
		}
	} else {
		m.buf = append(m.buf[:0], m.tops...)
		m.walk(0, 0, len(m.tops))
	}
	m.buf, m.frames = m.buf[:0], m.frames[:base]
	if m.Complete() {
		m.eogBits(bits)
	}
	c.mu.Lock()
	if len(c.cache) >= c.cacheCap() {
		clear(c.cache)
	}
	c.cache[string(key)] = bits
	c.mu.Unlock()
	return bits
}

func (m *Matcher) eogBits(bits []uint64) []uint64 {
	for _, id := range m.c.v.eog {
		if id >= 0 && int(id) < len(m.c.v.pieces) {
			bits[id>>6] |= 1 << (id & 63)
		}
	}
	return bits
}

// lexMask returns the mask of t's lexeme state, computing it once.
func (m *Matcher) lexMask(t top) *lexMask {
	c := m.c
	k := lexKey{c.g.elems[t.pos].arg, t.st}
	c.mu.Lock()
	lm, ok := c.lex[k]
	c.mu.Unlock()
	if ok && !c.noLex {
		return lm
	}
	lm = &lexMask{bits: make([]uint64, len(m.bits))}
	m.walkLex(0, c.g.dfas[k.dfa], t.st, lm)
	c.mu.Lock()
	if len(c.lex) >= c.cacheCap() {
		clear(c.lex)
	}
	c.lex[k] = lm
	c.mu.Unlock()
	return lm
}

// walkLex collects the lexMask of automaton d from state st below trie
// node n.
func (m *Matcher) walkLex(n int32, d *dfa, st int32, lm *lexMask) {
	v := m.c.v
	row := d.next[int(st)*d.ncls : int(st+1)*d.ncls]
	for ch := v.nodes[n].first; ch >= 0; ch = v.nodes[ch].next {
		node := &v.nodes[ch]
		ns := row[d.cls[node.b]]
		switch {
		case ns < 0:
		case d.acc[ns]:
			lm.exits = append(lm.exits, lexExit{ch, st})
		case d.out[ns]:
			for _, id := range v.toks[node.t0:node.t1] {
				lm.bits[id>>6] |= 1 << (id & 63)
			}
			if node.first >= 0 {
				m.walkLex(ch, d, ns, lm)
			}
		}
	}
}

// walk visits the children of trie node n, whose prefix leaves the stacks
// m.buf[lo:hi] (their frames in m.frames), marking every token whose bytes
// keep some stack alive and pruning a subtree as soon as none is.
func (m *Matcher) walk(n int32, lo, hi int) {
	if hi-lo == 1 && m.buf[lo].pos >= 0 {
		m.walk1(n, m.buf[lo])
		return
	}
	v := m.c.v
	for ch := v.nodes[n].first; ch >= 0; ch = v.nodes[ch].next {
		m.child(ch, lo, hi)
	}
}

// child advances the stacks m.buf[lo:hi] over the byte of trie node ch and
// goes on below it.
func (m *Matcher) child(ch int32, lo, hi int) {
	v := m.c.v
	node := &v.nodes[ch]
	fmark := len(m.frames)
	for i := lo; i < hi; i++ {
		m.advance(m.buf[i], node.b)
	}
	if len(m.buf) > hi {
		m.dedup(hi)
		for _, id := range v.toks[node.t0:node.t1] {
			m.bits[id>>6] |= 1 << (id & 63)
		}
		if node.first >= 0 {
			m.walk(ch, hi, len(m.buf))
		}
	}
	m.buf, m.frames = m.buf[:hi], m.frames[:fmark]
}

// walk1 is walk for a single stack t: while the bytes stay inside t's
// lexeme (the common case: the body of a string) it only steps the
// automaton, falling back to the general path where the lexeme may end.
func (m *Matcher) walk1(n int32, t top) {
	v, g := m.c.v, m.c.g
	d := g.dfas[g.elems[t.pos].arg]
	row := d.next[int(t.st)*d.ncls : int(t.st+1)*d.ncls]
	for ch := v.nodes[n].first; ch >= 0; ch = v.nodes[ch].next {
		node := &v.nodes[ch]
		ns := row[d.cls[node.b]]
		if ns < 0 {
			continue
		}
		if d.acc[ns] {
			hi := len(m.buf)
			m.buf = append(m.buf, t)
			m.child(ch, hi, hi+1)
			m.buf = m.buf[:hi]
			continue
		}
		if !d.out[ns] {
			continue
		}
		for _, id := range v.toks[node.t0:node.t1] {
			m.bits[id>>6] |= 1 << (id & 63)
		}
		if node.first >= 0 {
			m.walk1(ch, top{t.pos, ns, t.rest})
		}
	}
}

// Mask sets to -Inf the logits of every token that cannot come next
// (logits beyond the vocabulary included). It fails when no token can.
func (m *Matcher) Mask(logits []float32) error {
	allowed := m.Allowed()
	ninf := float32(math.Inf(-1))
	n := min(len(logits), len(m.c.v.pieces))
	any := false
	for w := 0; w*64 < n; w++ {
		x := allowed[w]
		hi := min(w*64+64, n)
		switch x {
		case 0:
			row := logits[w*64 : hi]
			for i := range row {
				row[i] = ninf
			}
		case ^uint64(0):
			any = true
		default:
			any = true
			for z := ^x; z != 0; z &= z - 1 {
				if i := w*64 + bits.TrailingZeros64(z); i < hi {
					logits[i] = ninf
				}
			}
		}
	}
	for i := n; i < len(logits); i++ {
		logits[i] = ninf
	}
	if !any {
		return fmt.Errorf("grammar: no token of the vocabulary can continue the document")
	}
	return nil
}

// Accept advances the state over token id.
func (m *Matcher) Accept(id int32) error {
	v := m.c.v
	if id < 0 || int(id) >= len(v.pieces) {
		return fmt.Errorf("grammar: token %d outside the vocabulary of %d", id, len(v.pieces))
	}
	if v.isEOG[id] {
		if !m.Complete() {
			return fmt.Errorf("grammar: end of generation (token %d) before the document is complete", id)
		}
		m.done = true
		return nil
	}
	if m.done {
		return fmt.Errorf("grammar: token %d after the end of the document", id)
	}
	if err := m.AcceptBytes(v.pieces[id]); err != nil {
		return fmt.Errorf("grammar: token %d: %w", id, err)
	}
	return nil
}

// AcceptBytes advances the state over text; on error the state is
// unchanged.
func (m *Matcher) AcceptBytes(text []byte) error {
	if len(text) == 0 {
		return fmt.Errorf("no text to accept")
	}
	base := len(m.frames)
	m.buf = append(m.buf[:0], m.tops...)
	lo, hi := 0, len(m.buf)
	for i, b := range text {
		for k := lo; k < hi; k++ {
			m.advance(m.buf[k], b)
		}
		if len(m.buf) == hi {
			m.buf, m.frames = m.buf[:0], m.frames[:base]
			return fmt.Errorf("%q cannot continue the document at byte %d", text, i)
		}
		m.dedup(hi)
		lo, hi = hi, len(m.buf)
	}
	m.tops = append(m.tops[:0], m.buf[lo:hi]...)
	m.buf = m.buf[:0]
	m.compact()
	return nil
}

// Clone copies the state (for a speculative verifier that must roll back,
// or to try a token without committing it).
func (m *Matcher) Clone() *Matcher {
	return &Matcher{c: m.c, tops: slices.Clone(m.tops), frames: slices.Clone(m.frames), done: m.done}
}
