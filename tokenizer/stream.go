package tokenizer

import "unicode/utf8"

// Stream is an incremental detokenizer: feed it generated ids one at a time
// and it returns only complete UTF-8, holding back the start of a multi-byte
// character until its last byte arrives. Bytes that can never form valid
// UTF-8 come out as U+FFFD, one per byte (as Go's range over a string
// reports them).
//
// When the vocabulary says AddSpacePrefix (SentencePiece, WordPiece), the
// leading space of the first token that produces any bytes is dropped, as
// llama.cpp and Hugging Face do when decoding; control tokens produce
// nothing. The concatenation of every Add and the final Flush equals the
// tokenizer's Decode of the whole sequence.
type Stream struct {
	t       Tokenizer
	v       *Vocab
	strip   bool // the leading space is still to be dropped
	pending []byte
	show    map[int32]bool // control tokens rendered as their text
}

// ShowSpecial renders the given control tokens as their vocabulary text
// instead of nothing: the tool-call markers some models emit as control
// tokens (Mistral's [TOOL_CALLS]) must reach the tool-call parser.
func (s *Stream) ShowSpecial(ids ...int32) {
	for _, id := range ids {
		if s.show == nil {
			s.show = map[int32]bool{}
		}
		s.show[id] = true
	}
}

// NewStream starts an incremental detokenizer over t.
func NewStream(t Tokenizer) *Stream {
	v := t.Vocab()
	return &Stream{t: t, v: v, strip: v != nil && v.AddSpacePrefix}
}

// Add feeds one token and returns the text that is now complete.
func (s *Stream) Add(id int32) string {
	return string(s.appendToken(nil, id))
}

// Flush returns whatever is held back, an incomplete character becoming
// U+FFFD per byte; call it when the sequence ends.
func (s *Stream) Flush() string {
	return string(s.appendFlush(nil))
}

func (s *Stream) appendToken(dst []byte, id int32) []byte {
	if s.v != nil && s.v.Types != nil && id >= 0 && int(id) < len(s.v.Types) && s.v.Types[id] == TypeControl {
		if !s.show[id] {
			return dst
		}
		s.strip = false
		s.pending = append(s.pending, s.v.Tokens[id]...)
		return s.drain(dst, false)
	}
	b := s.t.TokenBytes(id)
	if len(b) == 0 {
		return dst
	}
	if s.strip {
		s.strip = false
		if b[0] == ' ' {
			b = b[1:]
		}
	}
	s.pending = append(s.pending, b...)
	return s.drain(dst, false)
}

func (s *Stream) appendFlush(dst []byte) []byte {
	return s.drain(dst, true)
}

// drain moves every decidable character from pending to dst; with final
// set, an incomplete tail is decided too.
func (s *Stream) drain(dst []byte, final bool) []byte {
	p := s.pending
	i := 0
	for i < len(p) {
		if p[i] < utf8.RuneSelf {
			dst = append(dst, p[i])
			i++
			continue
		}
		if !final && !utf8.FullRune(p[i:]) {
			break
		}
		r, n := utf8.DecodeRune(p[i:])
		if r == utf8.RuneError && n == 1 {
			dst = utf8.AppendRune(dst, utf8.RuneError)
		} else {
			dst = append(dst, p[i:i+n]...)
		}
		i += n
	}
	s.pending = append(s.pending[:0], p[i:]...)
	return dst
}
