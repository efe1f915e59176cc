package tokenizer

import (
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"
)

// GPT-2's byte-level alphabet: every byte gets a printable rune so that
// vocabularies can be stored as text. Printable Latin-1 bytes stand for
// themselves; the others are moved to U+0100 upwards in byte order.
var (
	bpeByteRune [256]rune
	bpeRuneByte [0x144]int16 // rune -> byte, -1 outside the alphabet
)

func init() {
	for i := range bpeRuneByte {
		bpeRuneByte[i] = -1
	}
	n := 0
	for b := 0; b < 256; b++ {
		if b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE {
			bpeByteRune[b] = rune(b)
		} else {
			bpeByteRune[b] = rune(256 + n)
			n++
		}
		bpeRuneByte[bpeByteRune[b]] = int16(b)
	}
}

// byteLevelDecode maps a byte-level token text back to its raw bytes; false
// when a rune is outside the alphabet (an added token stored verbatim).
func byteLevelDecode(s string) (string, bool) {
	var sb strings.Builder
	sb.Grow(len(s))
	for _, r := range s {
		if r < 0 || int(r) >= len(bpeRuneByte) || bpeRuneByte[r] < 0 {
			return "", false
		}
		sb.WriteByte(byte(bpeRuneByte[r]))
	}
	return sb.String(), true
}

// byteLevelEncode maps raw bytes to the byte-level alphabet.
func byteLevelEncode(s string) string {
	var sb strings.Builder
	sb.Grow(2 * len(s))
	for i := 0; i < len(s); i++ {
		sb.WriteRune(bpeByteRune[s[i]])
	}
	return sb.String()
}

type bpeMerge struct{ rank, id int32 }

func bpePair(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// BPE is a merge-rank BPE tokenizer. In byte-level mode (GGUF "gpt2", HF
// ByteLevel) it works on raw bytes: token texts are decoded from the GPT-2
// byte alphabet once, so words never need re-encoding. Otherwise (HF BPE
// with Metaspace / byte_fallback, e.g. Mistral, Gemma) it works on the
// normalized text's characters, falling back to <0xXX> tokens.
type BPE struct {
	v *Vocab

	byteLevel    bool
	ignoreMerges bool // a word that is a whole token is not merged (llama3)
	byteFallback bool
	fuseUnk      bool
	unk          int32

	normalize func(string) string // HF normalizer; nil when none
	// split is the pre-tokenizer (nil: the segment is one word); atStart
	// says the segment begins the input text.
	split func(s string, atStart bool) []string

	ids     map[string]int32 // symbol text (raw bytes when byteLevel) -> id
	merges  map[uint64]bpeMerge
	byteTok [256]int32 // byte-level: single-byte token; else <0xXX>; -1 none
	added   *bpeAdded
	pieces  [][]byte // TokenBytes
	// stripLeft is how many leading spaces Decode removes (HF Strip decoder).
	stripLeft int

	mu    sync.Mutex
	cache map[string][]int32
	pool  sync.Pool
}

// bpeCacheMax bounds the word cache; it is cleared when full. Words longer
// than bpeCacheWordMax (whole SentencePiece-style segments) are not cached.
const (
	bpeCacheMax     = 1 << 17
	bpeCacheWordMax = 256
)

// NewBPE builds a byte-level BPE tokenizer (GGUF tokenizer.ggml.model
// "gpt2") from a vocabulary and its merges ("a b" in the byte-level
// alphabet, best first). v.Pre picks the pre-tokenizer; an unknown name falls
// back to llama.cpp's "default" regexes, as llama.cpp does.
func NewBPE(v *Vocab, merges []string) (*BPE, error) {
	if v == nil || len(v.Tokens) == 0 {
		return nil, fmt.Errorf("tokenizer: bpe: empty vocabulary")
	}
	if v.Types != nil && len(v.Types) != len(v.Tokens) {
		return nil, fmt.Errorf("tokenizer: bpe: %d token types for %d tokens", len(v.Types), len(v.Tokens))
	}
	for _, id := range []int32{v.BOS, v.EOS, v.UNK, v.PAD, v.EOT} {
		if id >= int32(len(v.Tokens)) {
			return nil, fmt.Errorf("tokenizer: bpe: special token id %d out of range (%d tokens)", id, len(v.Tokens))
		}
	}
	stages, ignore, err := preFamily(v.Pre)
	if err != nil {
		stages, ignore, _ = preFamily("default")
	}
	t := &BPE{v: v, byteLevel: true, ignoreMerges: ignore, unk: v.UNK}
	t.split = func(s string, _ bool) []string { return preSplitWords(s, stages) }
	t.ids = make(map[string]int32, len(v.Tokens))
	var added []bpeAddedTok
	for i, s := range v.Tokens {
		switch t.tokType(int32(i)) {
		case TypeControl, TypeUnknown:
			added = append(added, bpeAddedTok{id: int32(i), text: s, special: true})
			continue
		case TypeUserDefined:
			added = append(added, bpeAddedTok{id: int32(i), text: s})
			continue
		}
		if raw, ok := byteLevelDecode(s); ok {
			t.ids[raw] = int32(i)
		}
	}
	t.added = newBPEAdded(added)
	t.merges = make(map[uint64]bpeMerge, len(merges))
	for rank, m := range merges {
		// Split at the first space after the first byte, as llama.cpp does.
		k := strings.IndexByte(m[min(1, len(m)):], ' ')
		if k < 0 {
			return nil, fmt.Errorf("tokenizer: bpe: merge %d %q has no space", rank, m)
		}
		k += min(1, len(m))
		a, okA := byteLevelDecode(m[:k])
		b, okB := byteLevelDecode(m[k+1:])
		if !okA || !okB {
			continue
		}
		t.addMerge(a, b, int32(rank))
	}
	t.finish()
	return t, nil
}

func (t *BPE) tokType(id int32) int32 {
	if t.v.Types == nil || id < 0 || int(id) >= len(t.v.Types) {
		return TypeNormal
	}
	return t.v.Types[id]
}

// addMerge records a merge of two symbol texts whose parts and result are
// all tokens; the first (best) rank of a pair wins.
func (t *BPE) addMerge(a, b string, rank int32) {
	ia, ok1 := t.ids[a]
	ib, ok2 := t.ids[b]
	ir, ok3 := t.ids[a+b]
	if !ok1 || !ok2 || !ok3 {
		return
	}
	key := bpePair(ia, ib)
	if _, dup := t.merges[key]; !dup {
		t.merges[key] = bpeMerge{rank: rank, id: ir}
	}
}

// finish fills the byte table and the decoded pieces.
func (t *BPE) finish() {
	for b := 0; b < 256; b++ {
		t.byteTok[b] = -1
		var key string
		if t.byteLevel {
			key = string([]byte{byte(b)})
		} else {
			key = fmt.Sprintf("<0x%02X>", b)
		}
		if id, ok := t.ids[key]; ok {
			t.byteTok[b] = id
		}
	}
	t.pieces = make([][]byte, len(t.v.Tokens))
	for i, s := range t.v.Tokens {
		t.pieces[i] = t.piece(int32(i), s)
	}
	t.cache = make(map[string][]int32)
	t.pool.New = func() any { return &bpeWork{} }
}

func (t *BPE) piece(id int32, s string) []byte {
	switch t.tokType(id) {
	case TypeControl:
		return nil
	case TypeUserDefined, TypeUnknown:
		if !t.byteLevel {
			// HF runs added tokens through the decoder too: "▁▁" is two spaces.
			return []byte(strings.ReplaceAll(s, spaceMark, " "))
		}
		return []byte(s)
	case TypeByte:
		if len(s) == 6 && strings.HasPrefix(s, "<0x") && s[5] == '>' {
			var b byte
			if _, err := fmt.Sscanf(s[3:5], "%02X", &b); err == nil {
				return []byte{b}
			}
		}
	}
	if t.byteLevel {
		if raw, ok := byteLevelDecode(s); ok {
			return []byte(raw)
		}
		return []byte(s)
	}
	return []byte(strings.ReplaceAll(s, spaceMark, " "))
}

// Vocab returns the vocabulary.
func (t *BPE) Vocab() *Vocab { return t.v }

// TokenBytes returns the bytes id contributes to the output: byte-level
// decoded text, an added token's text, nothing for control tokens.
func (t *BPE) TokenBytes(id int32) []byte {
	if id < 0 || int(id) >= len(t.pieces) {
		return nil
	}
	return t.pieces[id]
}

// Decode joins the tokens' bytes.
func (t *BPE) Decode(ids []int32) string {
	var sb strings.Builder
	for _, id := range ids {
		sb.Write(t.TokenBytes(id))
	}
	s := sb.String()
	for k := 0; k < t.stripLeft && strings.HasPrefix(s, " "); k++ {
		s = s[1:]
	}
	return s
}

// Encode tokenizes text.
func (t *BPE) Encode(text string, o Options) []int32 {
	out := make([]int32, 0, len(text)/3+2)
	if o.AddSpecial && t.v.AddBOS && t.v.BOS >= 0 {
		out = append(out, t.v.BOS)
	}
	w := t.pool.Get().(*bpeWork)
	atStart := true
	t.added.split(text, o.ParseSpecial, false, func(seg string, id int32) {
		if id >= 0 {
			out = append(out, id)
			atStart = false
			return
		}
		if t.normalize != nil {
			seg = t.normalize(seg)
		}
		t.added.split(seg, o.ParseSpecial, true, func(seg string, id int32) {
			if id >= 0 {
				out = append(out, id)
			} else if t.split == nil {
				out = t.encodeWord(w, seg, out)
			} else {
				for _, word := range t.split(seg, atStart) {
					out = t.encodeWord(w, word, out)
				}
			}
			atStart = false
		})
	})
	t.pool.Put(w)
	if o.AddSpecial && t.v.AddEOS && t.v.EOS >= 0 {
		out = append(out, t.v.EOS)
	}
	return out
}

// bpeSym is a symbol in a word's linked list; id < 0 marks a dead one.
type bpeSym struct {
	id         int32
	prev, next int32
}

type bpeCand struct {
	rank, left, right int32
	lid, rid, res     int32
}

func (a bpeCand) less(b bpeCand) bool {
	return a.rank < b.rank || a.rank == b.rank && a.left < b.left
}

// bpeWork is per-call scratch space.
type bpeWork struct {
	syms []bpeSym
	heap []bpeCand
}

func (w *bpeWork) push(c bpeCand) {
	h := append(w.heap, c)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !h[i].less(h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
	w.heap = h
}

func (w *bpeWork) pop() bpeCand {
	h := w.heap
	top := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h = h[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && h[r].less(h[l]) {
			m = r
		}
		if !h[m].less(h[i]) {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	w.heap = h
	return top
}

func (t *BPE) tryPair(w *bpeWork, l, r int32) {
	if l < 0 || r < 0 {
		return
	}
	a, b := w.syms[l].id, w.syms[r].id
	if a < 0 || b < 0 {
		return
	}
	if m, ok := t.merges[bpePair(a, b)]; ok {
		w.push(bpeCand{rank: m.rank, left: l, right: r, lid: a, rid: b, res: m.id})
	}
}

func (t *BPE) encodeWord(w *bpeWork, word string, out []int32) []int32 {
	if word == "" {
		return out
	}
	if t.ignoreMerges {
		if id, ok := t.ids[word]; ok {
			return append(out, id)
		}
	}
	t.mu.Lock()
	cached, ok := t.cache[word]
	t.mu.Unlock()
	if ok {
		return append(out, cached...)
	}
	start := len(out)
	out = t.mergeWord(w, word, out)
	res := make([]int32, len(out)-start)
	copy(res, out[start:])
	if len(word) > bpeCacheWordMax {
		return out
	}
	t.mu.Lock()
	if len(t.cache) >= bpeCacheMax {
		clear(t.cache)
	}
	// Clone: the word is a slice of the caller's text, which must not stay
	// pinned in memory by the cache.
	t.cache[strings.Clone(word)] = res
	t.mu.Unlock()
	return out
}

// mergeWord runs the merges on one word: a linked list of symbols and a heap
// of candidate pairs, lowest rank first and leftmost on ties, as llama.cpp's
// llm_tokenizer_bpe_session and HF's Word::merge_all do.
func (t *BPE) mergeWord(w *bpeWork, word string, out []int32) []int32 {
	w.syms = w.syms[:0]
	w.heap = w.heap[:0]
	add := func(id int32) {
		n := int32(len(w.syms))
		w.syms = append(w.syms, bpeSym{id: id, prev: n - 1, next: n + 1})
	}
	if t.byteLevel {
		for i := 0; i < len(word); i++ {
			add(t.byteTok[word[i]])
		}
	} else {
		unkOpen := false
		for i := 0; i < len(word); {
			r, n := utf8.DecodeRuneInString(word[i:])
			ch := word[i : i+n]
			i += n
			if r != utf8.RuneError || n > 1 {
				if id, ok := t.ids[ch]; ok {
					add(id)
					unkOpen = false
					continue
				}
			}
			if t.byteFallback {
				okAll := true
				for k := 0; k < len(ch); k++ {
					if t.byteTok[ch[k]] < 0 {
						okAll = false
					}
				}
				if okAll {
					for k := 0; k < len(ch); k++ {
						add(t.byteTok[ch[k]])
					}
					unkOpen = false
					continue
				}
			}
			if t.fuseUnk && unkOpen {
				continue
			}
			add(t.unk)
			unkOpen = true
		}
	}
	if len(w.syms) == 0 {
		return out
	}
	w.syms[len(w.syms)-1].next = -1
	for i := 1; i < len(w.syms); i++ {
		t.tryPair(w, int32(i-1), int32(i))
	}
	for len(w.heap) > 0 {
		c := w.pop()
		ls, rs := &w.syms[c.left], &w.syms[c.right]
		if ls.id != c.lid || rs.id != c.rid || ls.next != c.right {
			continue // stale
		}
		ls.id = c.res
		ls.next = rs.next
		if rs.next >= 0 {
			w.syms[rs.next].prev = c.left
		}
		rs.id = -2
		rs.next = -1
		t.tryPair(w, ls.prev, c.left)
		t.tryPair(w, c.left, ls.next)
	}
	for i := int32(0); i >= 0; i = w.syms[i].next {
		if id := w.syms[i].id; id >= 0 {
			out = append(out, id)
		}
	}
	return out
}
