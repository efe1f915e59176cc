package tokenizer

import "testing"

// TestStreamShowSpecial: a control token renders as nothing unless shown,
// then as its text.
func TestStreamShowSpecial(t *testing.T) {
	v := &Vocab{Model: "llama", BOS: 1, EOS: 2, UNK: 0, PAD: -1, EOT: -1,
		Tokens: []string{"<unk>", "<s>", "</s>", "[TOOL_CALLS]", "a", "<0xC3>", "<0xA9>"},
		Types:  []int32{TypeUnknown, TypeControl, TypeControl, TypeControl, TypeNormal, TypeByte, TypeByte}}
	tok, err := NewSPM(v)
	if err != nil {
		t.Fatal(err)
	}
	ids := []int32{4, 3, 5, 6, 3, 4, 2}
	run := func(show ...int32) string {
		s := NewStream(tok)
		s.ShowSpecial(show...)
		var out string
		for _, id := range ids {
			out += s.Add(id)
		}
		return out + s.Flush()
	}
	if got := run(); got != "aéa" || got != tok.Decode(ids) {
		t.Errorf("hidden: %q (Decode %q)", got, tok.Decode(ids))
	}
	if got := run(3); got != "a[TOOL_CALLS]é[TOOL_CALLS]a" {
		t.Errorf("shown: %q", got)
	}
}
