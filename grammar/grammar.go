// Package grammar constrains generation to a language: a JSON schema (or
// any JSON object) compiled to a context-free grammar whose terminals are
// small byte automata (strings, numbers, literals, bounded white space),
// and a matcher that, given a completion's state, masks the logits of every
// token whose bytes cannot continue a valid document.
//
// The matcher is a pushdown automaton over bytes. Its state is a set of
// stacks (the grammar may be ambiguous, e.g. anyOf); the top of each stack
// is a lexeme and a state inside its automaton, and the frames below are
// return positions. The vocabulary is a byte trie, walked once per step
// from the current state, pruning a subtree as soon as no stack survives
// its prefix; masks of states seen before come from a cache.
package grammar

import (
	"cmp"
	"fmt"
)

const (
	kEnd = iota // end of an alternative: return to the frame below
	kLex        // a lexeme: arg is a dfa index
	kRef        // a rule: arg is a rule index
)

type elem struct {
	kind uint8
	arg  int32
}

// Grammar is a compiled grammar. It is immutable and shared by every
// completion that uses it.
type Grammar struct {
	elems []elem    // every alternative, each followed by kEnd
	rules [][]int32 // per rule: the start positions of its alternatives
	dfas  []*dfa
	root  int32
}

// builder assembles a grammar. Rules are reserved first (so recursion can
// refer to them) and defined later.
type builder struct {
	alts [][][]elem // per rule, per alternative, its elements
	dfas []*dfa
	lexs map[string]int32 // memoized lexemes by description
	bud  *budget          // states, memory and time left
}

func newBuilder(bud *budget) *builder { return &builder{lexs: map[string]int32{}, bud: bud} }

func (b *builder) rule() int32 {
	b.alts = append(b.alts, nil)
	return int32(len(b.alts) - 1)
}

func (b *builder) define(r int32, alts ...[]elem) {
	n := 0
	for _, a := range alts {
		n += len(a) + 1
	}
	b.bud.charge(0, int64(n)*8+24) // sticky: checked by the compiler as it goes
	b.alts[r] = append(b.alts[r], alts...)
}

// ruleOf is a new rule with the given alternatives, as an element.
func (b *builder) ruleOf(alts ...[]elem) elem {
	r := b.rule()
	b.define(r, alts...)
	return elem{kRef, r}
}

// lex returns the lexeme element described by key, building it once.
func (b *builder) lex(key string, mk func() (*dfa, error)) (elem, error) {
	if i, ok := b.lexs[key]; ok {
		return elem{kLex, i}, nil
	}
	if err := b.bud.check(); err != nil {
		return elem{}, err
	}
	d, err := mk()
	if err != nil {
		return elem{}, err
	}
	if err := b.bud.charge(len(d.acc), dfaBytes(len(d.acc), d.ncls)+int64(len(key))+64); err != nil {
		return elem{}, err
	}
	b.dfas = append(b.dfas, d)
	i := int32(len(b.dfas) - 1)
	b.lexs[key] = i
	return elem{kLex, i}, nil
}

func (b *builder) lit(s string) elem {
	e, err := b.lex("lit:"+s, func() (*dfa, error) { return literalsDFA([]string{s}, b.bud) })
	if err != nil {
		// Only the budget can refuse a literal; the error is remembered
		// there and the compiler returns it at its next check.
		b.bud.err = cmp.Or(b.bud.err, err)
		return elem{kLex, 0}
	}
	return e
}

// finish checks and flattens the grammar rooted at root. Alternatives that
// can derive no finite document are dropped; a root that derives none, and
// recursion that consumes no input (a rule reaching itself before any
// byte), are errors.
func (b *builder) finish(root int32) (*Grammar, error) {
	n := len(b.alts)
	nullableLex := func(e elem) bool { return b.dfas[e.arg].acc[0] }
	// Productive rules: some alternative made only of lexemes and
	// productive rules.
	prod := make([]bool, n)
	for changed := true; changed; {
		changed = false
		for r := range n {
			if prod[r] {
				continue
			}
			for _, alt := range b.alts[r] {
				ok := true
				for _, e := range alt {
					if e.kind == kRef && !prod[e.arg] {
						ok = false
						break
					}
				}
				if ok {
					prod[r], changed = true, true
					break
				}
			}
		}
	}
	if !prod[root] {
		return nil, fmt.Errorf("the schema admits no finite JSON document")
	}
	for r := range n {
		kept := b.alts[r][:0]
		for _, alt := range b.alts[r] {
			ok := true
			for _, e := range alt {
				if e.kind == kRef && !prod[e.arg] {
					ok = false
				}
			}
			if ok {
				kept = append(kept, alt)
			}
		}
		b.alts[r] = kept
	}
	// Nullable rules, then left recursion through nullable prefixes.
	null := make([]bool, n)
	for changed := true; changed; {
		changed = false
		for r := range n {
			if null[r] {
				continue
			}
			for _, alt := range b.alts[r] {
				ok := true
				for _, e := range alt {
					if (e.kind == kLex && !nullableLex(e)) || (e.kind == kRef && !null[e.arg]) {
						ok = false
						break
					}
				}
				if ok {
					null[r], changed = true, true
					break
				}
			}
		}
	}
	first := make([][]int32, n) // rules reachable before any byte
	for r := range n {
		for _, alt := range b.alts[r] {
			for _, e := range alt {
				if e.kind == kRef {
					first[r] = append(first[r], e.arg)
					if !null[e.arg] {
						break
					}
				} else if !nullableLex(e) {
					break
				}
			}
		}
	}
	if err := b.bud.checkNow(); err != nil {
		return nil, err
	}
	color := make([]uint8, n)
	var visit func(r int32) bool
	visit = func(r int32) bool {
		color[r] = 1
		for _, s := range first[r] {
			if color[s] == 1 || (color[s] == 0 && !visit(s)) {
				return false
			}
		}
		color[r] = 2
		return true
	}
	for r := range n {
		if color[r] == 0 && !visit(int32(r)) {
			return nil, fmt.Errorf("the schema recurses without consuming input (a $ref cycle through anyOf/oneOf or a reference to itself)")
		}
	}
	g := &Grammar{dfas: b.dfas, root: root, rules: make([][]int32, n)}
	// Position 0 calls the root; the matcher starts by expanding it.
	g.elems = append(g.elems, elem{kRef, root}, elem{kind: kEnd})
	for r := range n {
		for _, alt := range b.alts[r] {
			g.rules[r] = append(g.rules[r], int32(len(g.elems)))
			g.elems = append(g.elems, alt...)
			g.elems = append(g.elems, elem{kind: kEnd})
		}
	}
	return g, nil
}
