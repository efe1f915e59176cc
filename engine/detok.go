package engine

import "pagoda/tokenizer"

// textOut is one completion's detokenizer with stop strings.
type textOut struct{ *tokenizer.TextStream }

func newTextOut(tok tokenizer.Tokenizer, prompt []int32, stops []string, show ...int32) *textOut {
	t := &textOut{tokenizer.NewTextStream(tok, prompt, stops)}
	t.ShowSpecial(show...)
	return t
}

func (t *textOut) add(id int32) (string, bool) { return t.Add(id) }
func (t *textOut) flush() string               { return t.Flush() }
