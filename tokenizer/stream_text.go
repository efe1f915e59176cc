package tokenizer

import "strings"

// TextStream turns one completion's tokens into text deltas: UTF-8 safe (a
// Stream holds back incomplete characters) and stop-string safe (text that
// could still be the start of a stop string is held back until it cannot,
// and a matched stop string and everything after it are dropped).
type TextStream struct {
	stream  *Stream
	stops   []string
	pending string
}

// NewTextStream starts a completion of prompt. The output continues the
// prompt: priming the stream with it keeps the leading space of the first
// generated word, as a completion API shows it, instead of treating the
// output as the start of a text.
func NewTextStream(tok Tokenizer, prompt []int32, stops []string) *TextStream {
	s := NewStream(tok)
	for _, id := range prompt {
		s.Add(id)
	}
	return &TextStream{stream: s, stops: stops}
}

// ShowSpecial renders the given control tokens as their text (see
// Stream.ShowSpecial).
func (t *TextStream) ShowSpecial(ids ...int32) { t.stream.ShowSpecial(ids...) }

// Add feeds a token; it returns the text that is safe to emit and whether a
// stop string matched (then nothing more should be fed).
func (t *TextStream) Add(id int32) (string, bool) {
	t.pending += t.stream.Add(id)
	return t.emit()
}

// Flush ends the completion: the held-back text is released.
func (t *TextStream) Flush() string {
	t.pending += t.stream.Flush()
	out := t.pending
	if i, ok := t.match(); ok {
		out = out[:i]
	}
	t.pending = ""
	return out
}

func (t *TextStream) match() (int, bool) {
	best := -1
	for _, s := range t.stops {
		if s == "" {
			continue
		}
		if i := strings.Index(t.pending, s); i >= 0 && (best < 0 || i < best) {
			best = i
		}
	}
	return best, best >= 0
}

func (t *TextStream) emit() (string, bool) {
	if i, ok := t.match(); ok {
		out := t.pending[:i]
		t.pending = ""
		return out, true
	}
	// Hold back the longest suffix that is a proper prefix of a stop string.
	hold := 0
	for _, s := range t.stops {
		for k := min(len(s)-1, len(t.pending)); k > hold; k-- {
			if strings.HasSuffix(t.pending, s[:k]) {
				hold = k
				break
			}
		}
	}
	cut := len(t.pending) - hold
	out := t.pending[:cut]
	t.pending = t.pending[cut:]
	return out, false
}
