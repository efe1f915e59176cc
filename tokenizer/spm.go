package tokenizer

import (
	"fmt"
	"strings"
	"sync"
)

// spaceMark is SentencePiece's visible stand-in for a space ("▁", U+2581).
const spaceMark = "\u2581"

// SPM is a SentencePiece-style tokenizer (GGUF tokenizer.ggml.model
// "llama"): symbols start as UTF-8 characters and adjacent pairs are merged,
// best vocabulary score first, as long as the merged text is a token; what
// is left unmerged and unknown falls back to <0xXX> byte tokens. It follows
// llama.cpp's llm_tokenizer_spm, which is also what llama2.c's run.c does.
type SPM struct {
	v *Vocab
	// ids maps the text of the tokens that plain text may turn into; like
	// SentencePiece (and unlike llama.cpp), control, unknown, unused and
	// byte tokens are left out, so "<s>" or "<0x41>" typed as text is never
	// merged into those tokens.
	ids     map[string]int32
	byteTok [256]int32 // byte -> token for byte fallback, -1 when none
	special *specialMatcher
	pieces  [][]byte // decoded bytes of each token
	// pairs has bit a<<8|b set when bytes a, b occur next to each other in
	// some token. Where they do not, no merge can ever join the text on
	// either side, so the text is tokenized in independent pieces: this
	// keeps the merge queue small and the run time linear on long inputs.
	pairs *[1 << 16 / 64]uint64

	// cache memoizes the ids of short pieces (mostly whole words), which
	// repeat a lot in natural text; cleared when full.
	mu    sync.Mutex
	cache map[string][]int32
}

const (
	spmCacheMax      = 1 << 16
	spmCachePieceMax = 64 // bytes
)

// NewSPM builds an SPM tokenizer over v. v must hold tokens; scores and
// types may be absent (zero scores, normal tokens).
func NewSPM(v *Vocab) (*SPM, error) {
	if v == nil || len(v.Tokens) == 0 {
		return nil, fmt.Errorf("tokenizer: spm: empty vocabulary")
	}
	if err := checkVocab(v); err != nil {
		return nil, fmt.Errorf("tokenizer: spm: %w", err)
	}
	t := &SPM{v: v, ids: make(map[string]int32, len(v.Tokens))}
	all := make(map[string]int32, 256)
	for i, s := range v.Tokens {
		// Later duplicates win, as in llama.cpp's token_to_id map.
		switch v.tokenType(int32(i)) {
		case TypeNormal, TypeUserDefined, TypeUndefined:
			t.ids[s] = int32(i)
		case TypeByte:
			all[s] = int32(i)
		}
	}
	for b := 0; b < 256; b++ {
		t.byteTok[b] = -1
		if id, ok := all[fmt.Sprintf("<0x%02X>", b)]; ok {
			t.byteTok[b] = id
		} else if id, ok := t.ids[string([]byte{byte(b)})]; ok {
			t.byteTok[b] = id
		} else {
			t.byteTok[b] = v.UNK
		}
	}
	t.special = newSpecialMatcher(v)
	t.pairs = new([1 << 16 / 64]uint64)
	for _, s := range v.Tokens {
		for i := 1; i < len(s); i++ {
			k := uint(s[i-1])<<8 | uint(s[i])
			t.pairs[k/64] |= 1 << (k % 64)
		}
	}
	t.pieces = make([][]byte, len(v.Tokens))
	for i := range v.Tokens {
		t.pieces[i] = spmPiece(v, int32(i))
	}
	return t, nil
}

// checkVocab rejects vocabularies whose parallel arrays or special ids do not
// fit the token list; everything here may come from a file.
func checkVocab(v *Vocab) error {
	n := len(v.Tokens)
	if v.Scores != nil && len(v.Scores) != n {
		return fmt.Errorf("%d scores for %d tokens", len(v.Scores), n)
	}
	if v.Types != nil && len(v.Types) != n {
		return fmt.Errorf("%d token types for %d tokens", len(v.Types), n)
	}
	for _, s := range []struct {
		name string
		id   int32
	}{{"bos", v.BOS}, {"eos", v.EOS}, {"unk", v.UNK}, {"pad", v.PAD}, {"eot", v.EOT}} {
		if s.id < -1 || int(s.id) >= n {
			return fmt.Errorf("%s token id %d out of range [0,%d)", s.name, s.id, n)
		}
	}
	for _, id := range v.EOG {
		if id < 0 || int(id) >= n {
			return fmt.Errorf("end-of-generation token id %d out of range [0,%d)", id, n)
		}
	}
	return nil
}

// tokenType returns the type of id, TypeNormal when the vocabulary has no
// types.
func (v *Vocab) tokenType(id int32) int32 {
	if v.Types == nil {
		return TypeNormal
	}
	return v.Types[id]
}

func (v *Vocab) score(id int32) float32 {
	if v.Scores == nil {
		return 0
	}
	return v.Scores[id]
}

// spmPiece is the output bytes of one token: "▁" becomes a space in normal
// tokens, byte tokens give their byte, and control/unknown/unused tokens
// give nothing (llama.cpp token_to_piece without "special").
func spmPiece(v *Vocab, id int32) []byte {
	s := v.Tokens[id]
	switch v.tokenType(id) {
	case TypeNormal, TypeUndefined:
		return []byte(strings.ReplaceAll(s, spaceMark, " "))
	case TypeUserDefined:
		return []byte(s)
	case TypeByte:
		if b, ok := parseByteToken(s); ok {
			return []byte{b}
		}
		return []byte(s)
	}
	return nil
}

// parseByteToken parses "<0xXX>".
func parseByteToken(s string) (byte, bool) {
	if len(s) != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>' {
		return 0, false
	}
	hi, ok1 := unhex(s[3])
	lo, ok2 := unhex(s[4])
	return hi<<4 | lo, ok1 && ok2
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

// Vocab returns the vocabulary.
func (t *SPM) Vocab() *Vocab { return t.v }

// TokenBytes returns the bytes id contributes to the output; nil for
// control tokens and ids out of range.
func (t *SPM) TokenBytes(id int32) []byte {
	if id < 0 || int(id) >= len(t.pieces) {
		return nil
	}
	return t.pieces[id]
}

// Decode turns ids into text. Invalid UTF-8 (stray byte tokens) becomes
// U+FFFD per byte, exactly as Stream emits it.
func (t *SPM) Decode(ids []int32) string {
	return decodeVia(t, ids)
}

// decodeVia decodes through a Stream so that Decode and incremental
// detokenization can never disagree.
func decodeVia(t Tokenizer, ids []int32) string {
	s := NewStream(t)
	var out []byte
	for _, id := range ids {
		out = s.appendToken(out, id)
	}
	out = s.appendFlush(out)
	return string(out)
}

// Encode tokenizes text.
func (t *SPM) Encode(text string, o Options) []int32 {
	v := t.v
	out := make([]int32, 0, len(text)/3+2)
	if o.AddSpecial && v.AddBOS && v.BOS >= 0 {
		out = append(out, v.BOS)
	}
	if text != "" {
		prevSpecial := true // the first fragment gets the dummy prefix
		var sess spmSession
		for _, f := range t.special.split(text, o.ParseSpecial) {
			if f.id >= 0 {
				out = append(out, f.id)
				prevSpecial = true
				continue
			}
			frag := f.text
			if v.AddSpacePrefix && prevSpecial {
				frag = " " + frag
			}
			out = sess.tokenize(t, strings.ReplaceAll(frag, " ", spaceMark), out)
			prevSpecial = false
		}
	}
	if o.AddSpecial && v.AddEOS && v.EOS >= 0 {
		out = append(out, v.EOS)
	}
	return out
}

// spmSymbol is one piece of text being merged; a linked list over the
// fragment, n == 0 once merged into its left neighbour.
type spmSymbol struct {
	start, n   int32
	prev, next int32
}

type spmBigram struct {
	left, right int32
	score       float32
	size        int32
}

// spmSession holds the work buffers of one tokenize call, reused across the
// fragments of an Encode.
type spmSession struct {
	syms []spmSymbol
	heap []spmBigram
}

func (s *spmSession) tokenize(t *SPM, text string, out []int32) []int32 {
	start := 0
	for i := 1; i < len(text); i++ {
		k := uint(text[i-1])<<8 | uint(text[i])
		if t.pairs[k/64]&(1<<(k%64)) == 0 {
			out = s.tokenizePiece(t, text[start:i], out)
			start = i
		}
	}
	return s.tokenizePiece(t, text[start:], out)
}

func (s *spmSession) tokenizePiece(t *SPM, text string, out []int32) []int32 {
	if len(text) > spmCachePieceMax {
		return s.merge(t, text, out)
	}
	t.mu.Lock()
	ids, ok := t.cache[text]
	t.mu.Unlock()
	if ok {
		return append(out, ids...)
	}
	n := len(out)
	out = s.merge(t, text, out)
	ids = append([]int32(nil), out[n:]...)
	t.mu.Lock()
	if len(t.cache) >= spmCacheMax || t.cache == nil {
		t.cache = make(map[string][]int32)
	}
	t.cache[strings.Clone(text)] = ids
	t.mu.Unlock()
	return out
}

// merge is llama.cpp's llm_tokenizer_spm_session::tokenize on one piece.
func (s *spmSession) merge(t *SPM, text string, out []int32) []int32 {
	s.syms = s.syms[:0]
	s.heap = s.heap[:0]
	for off := 0; off < len(text); {
		n := min(utf8Len(text[off]), len(text)-off)
		idx := int32(len(s.syms))
		next := idx + 1
		if off+n == len(text) {
			next = -1
		}
		s.syms = append(s.syms, spmSymbol{start: int32(off), n: int32(n), prev: idx - 1, next: next})
		off += n
	}
	for i := 1; i < len(s.syms); i++ {
		s.tryAdd(t, text, int32(i-1), int32(i))
	}
	for len(s.heap) > 0 {
		b := s.pop()
		l, r := &s.syms[b.left], &s.syms[b.right]
		// Skip pairs made stale by an earlier merge.
		if l.n == 0 || r.n == 0 || l.n+r.n != b.size {
			continue
		}
		l.n += r.n
		r.n = 0
		l.next = r.next
		if r.next >= 0 {
			s.syms[r.next].prev = b.left
		}
		s.tryAdd(t, text, l.prev, b.left)
		s.tryAdd(t, text, b.left, l.next)
	}
	if len(s.syms) == 0 {
		return out
	}
	for i := int32(0); i != -1; i = s.syms[i].next {
		sym := s.syms[i]
		piece := text[sym.start : sym.start+sym.n]
		if id, ok := t.ids[piece]; ok {
			out = append(out, id)
			continue
		}
		// Merged symbols are always tokens, so only single characters
		// missing from the vocabulary get here.
		for j := 0; j < len(piece); j++ {
			if id := t.byteTok[piece[j]]; id >= 0 {
				out = append(out, id)
			}
		}
	}
	return out
}

func (s *spmSession) tryAdd(t *SPM, text string, left, right int32) {
	if left < 0 || right < 0 {
		return
	}
	l, r := s.syms[left], s.syms[right]
	piece := text[l.start : r.start+r.n]
	id, ok := t.ids[piece]
	if !ok {
		return
	}
	s.push(spmBigram{left: left, right: right, score: t.v.score(id), size: int32(len(piece))})
}

// better orders the queue: higher score first, then the leftmost pair.
func (a spmBigram) better(b spmBigram) bool {
	return a.score > b.score || (a.score == b.score && a.left < b.left)
}

func (s *spmSession) push(b spmBigram) {
	h := append(s.heap, b)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !h[i].better(h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
	s.heap = h
}

func (s *spmSession) pop() spmBigram {
	h := s.heap
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	for i := 0; ; {
		l := 2*i + 1
		if l >= len(h) {
			break
		}
		c := l
		if r := l + 1; r < len(h) && h[r].better(h[l]) {
			c = r
		}
		if !h[c].better(h[i]) {
			break
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
	s.heap = h
	return top
}

// utf8Len is the sequence length announced by a UTF-8 lead byte; stray
// continuation bytes count as one, as in llama.cpp's unicode_len_utf8.
func utf8Len(b byte) int {
	switch {
	case b < 0xC0:
		return 1
	case b < 0xE0:
		return 2
	case b < 0xF0:
		return 3
	}
	return 4
}
