package grammar

import (
	"bytes"
	"slices"

	"pagoda/tokenizer"
)

// Vocab is a tokenizer's vocabulary as the matcher needs it: each token's
// output bytes (SentencePiece "▁" as a space, <0xNN> byte tokens as their
// byte, GPT-2 byte-level symbols decoded: tokenizer.TokenBytes) in a byte
// trie, and the end-of-generation ids. Build it once per tokenizer; it is
// immutable and shared.
type Vocab struct {
	pieces [][]byte
	eog    []int32
	isEOG  []bool
	nodes  []tnode
	toks   []int32 // token ids grouped by trie node
}

// tnode is a trie node: the byte that leads to it, its first child and next
// sibling (-1 when none), and its tokens toks[t0:t1].
type tnode struct {
	b           byte
	first, next int32
	t0, t1      int32
}

// NewVocab indexes the vocabulary of tok.
func NewVocab(tok tokenizer.Tokenizer) *Vocab {
	v := tok.Vocab()
	pieces := make([][]byte, v.Size())
	var eog []int32
	for i := range pieces {
		id := int32(i)
		if v.IsEOG(id) {
			eog = append(eog, id)
			continue
		}
		if v.Types != nil && v.Types[i] == tokenizer.TypeControl {
			continue // renders as nothing
		}
		pieces[i] = tok.TokenBytes(id)
	}
	return NewVocabBytes(pieces, eog)
}

// NewVocabBytes indexes token byte strings directly; tokens with no bytes
// are never allowed, eog ids end a complete document.
func NewVocabBytes(pieces [][]byte, eog []int32) *Vocab {
	v := &Vocab{pieces: pieces, eog: eog, isEOG: make([]bool, len(pieces))}
	for _, id := range eog {
		if id >= 0 && int(id) < len(pieces) {
			v.isEOG[id] = true
		}
	}
	ids := make([]int32, 0, len(pieces))
	for i, p := range pieces {
		if len(p) > 0 && !v.isEOG[i] {
			ids = append(ids, int32(i))
		}
	}
	slices.SortFunc(ids, func(a, b int32) int {
		if c := bytes.Compare(pieces[a], pieces[b]); c != 0 {
			return c
		}
		return int(a - b)
	})
	v.nodes = []tnode{{first: -1, next: -1}}
	path := []int32{0}  // path[d]: the node at depth d of the current string
	last := []int32{-1} // last[d]: the last child created under path[d]
	var prev []byte
	for _, id := range ids {
		s := pieces[id]
		lcp := 0
		for lcp < len(s) && lcp < len(prev) && s[lcp] == prev[lcp] {
			lcp++
		}
		path, last = path[:lcp+1], last[:lcp+1]
		for d := lcp; d < len(s); d++ {
			n := int32(len(v.nodes))
			v.nodes = append(v.nodes, tnode{b: s[d], first: -1, next: -1})
			parent := path[d]
			if last[d] < 0 {
				v.nodes[parent].first = n
			} else {
				v.nodes[last[d]].next = n
			}
			last[d] = n
			path = append(path, n)
			last = append(last, -1)
		}
		leaf := path[len(s)]
		if v.nodes[leaf].t1 == 0 {
			v.nodes[leaf].t0 = int32(len(v.toks))
		}
		v.toks = append(v.toks, id)
		v.nodes[leaf].t1 = int32(len(v.toks))
		prev = s
	}
	return v
}

// Size is the number of token ids.
func (v *Vocab) Size() int { return len(v.pieces) }
