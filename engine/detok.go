package engine

import "pagoda/tokenizer"

// textOut is one completion's detokenizer with stop strings.
type textOut struct{ *tokenizer.TextStream }

func newTextOut(tok tokenizer.Tokenizer, prompt []int32, stops []string) *textOut {
	return &textOut{tokenizer.NewTextStream(tok, prompt, stops)}
}

func (t *textOut) add(id int32) (string, bool) { return t.Add(id) }
func (t *textOut) flush() string               { return t.Flush() }
