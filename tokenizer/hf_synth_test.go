package tokenizer

import (
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

func TestSplitBehaviors(t *testing.T) {
	const s = "the-final--countdown"
	dash := preMatchStage{preMatchLiteral("-")}
	want := map[preSplitBehavior][]string{
		preSplitRemoved:            {"the", "final", "countdown"},
		preSplitIsolated:           {"the", "-", "final", "-", "-", "countdown"},
		preSplitMergedWithPrevious: {"the-", "final-", "-", "countdown"},
		preSplitMergedWithNext:     {"the", "-final", "-", "-countdown"},
		preSplitContiguous:         {"the", "-", "final", "--", "countdown"},
	}
	for beh, w := range want {
		got := preSplitWords(s, []preSplit{{stage: dash, behavior: beh}})
		if !reflect.DeepEqual(got, w) {
			t.Errorf("behavior %d: got %q want %q", beh, got, w)
		}
	}
	// invert: the matches are kept, each on its own (HF find_matches).
	got := preSplitWords(s, []preSplit{{stage: dash, behavior: preSplitRemoved, invert: true}})
	if w := []string{"-", "-", "-"}; !reflect.DeepEqual(got, w) {
		t.Errorf("invert: got %q want %q", got, w)
	}
}

// synthSPMJSON is a tiny Metaspace + byte_fallback tokenizer.json.
func synthSPMJSON(t *testing.T, pre string) []byte {
	t.Helper()
	vocab := map[string]int{"<unk>": 0, "<s>": 1, "</s>": 2}
	for b := 0; b < 256; b++ {
		vocab[fmt.Sprintf("<0x%02X>", b)] = 3 + b
	}
	for i, s := range []string{"▁", "a", "b", "▁a", "ab", "▁ab"} {
		vocab[s] = 259 + i
	}
	j := map[string]any{
		"added_tokens": []map[string]any{
			{"id": 0, "content": "<unk>", "special": true},
			{"id": 1, "content": "<s>", "special": true},
			{"id": 2, "content": "</s>", "special": true},
			{"id": 265, "content": "<x>", "special": false, "lstrip": true},
			{"id": 266, "content": "ww", "special": false, "single_word": true},
		},
		"normalizer":    nil,
		"pre_tokenizer": json.RawMessage(pre),
		"post_processor": map[string]any{"type": "TemplateProcessing",
			"single":         []any{map[string]any{"SpecialToken": map[string]any{"id": "<s>"}}, map[string]any{"Sequence": map[string]any{"id": "A"}}},
			"special_tokens": map[string]any{"<s>": map[string]any{"id": "<s>", "ids": []int{1}}}},
		"decoder": map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first"},
		"model": map[string]any{"type": "BPE", "vocab": vocab, "merges": [][]string{{"▁", "a"}, {"a", "b"}, {"▁a", "b"}},
			"byte_fallback": true, "fuse_unk": true, "unk_token": "<unk>"},
	}
	b, err := json.Marshal(j)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestHFSyntheticMetaspace(t *testing.T) {
	tok, err := ParseHF(synthSPMJSON(t, `{"type":"Metaspace","replacement":"▁","prepend_scheme":"first","split":true}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	v := tok.Vocab()
	if v.BOS != 1 || !v.AddBOS || v.Model != "llama" || !v.AddSpacePrefix || v.UNK != 0 {
		t.Errorf("vocab: BOS %d AddBOS %v Model %q AddSpacePrefix %v UNK %d", v.BOS, v.AddBOS, v.Model, v.AddSpacePrefix, v.UNK)
	}
	cases := []struct {
		text string
		o    Options
		want []int32
	}{
		{"ab ab", Options{}, []int32{264, 264}},
		{"ab ab", Options{AddSpecial: true}, []int32{1, 264, 264}},
		{"c", Options{}, []int32{259, 3 + 'c'}},
		{"é", Options{}, []int32{259, 3 + 0xC3, 3 + 0xA9}},
		{"a <x>b", Options{}, []int32{262, 265, 261}},      // lstrip eats the space
		{"aww", Options{}, []int32{262, 3 + 'w', 3 + 'w'}}, // single_word: inside a word
		{" ww", Options{}, []int32{259, 266}},
		{"<s>a", Options{}, []int32{259, 3 + '<', 3 + 's', 3 + '>', 260}},
		{"<s>a", Options{ParseSpecial: true}, []int32{1, 260}}, // "first": no ▁ after a token
	}
	for _, c := range cases {
		if got := tok.Encode(c.text, c.o); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%q %+v: got %v want %v", c.text, c.o, got, c.want)
		}
	}
	if got := tok.Decode([]int32{1, 264, 264, 3 + 0xC3, 3 + 0xA9}); got != "ab abé" {
		t.Errorf("decode: %q", got)
	}
	// (Leading spaces are not kept: "  a" becomes "▁" "▁a", and the decoder
	// drops the first, as in HF.)
	for _, s := range []string{"ab ab", "c", "é ab", "a  b"} {
		if got := tok.Decode(tok.Encode(s, Options{})); got != s {
			t.Errorf("round trip %q -> %q", s, got)
		}
	}
}

func TestHFSyntheticPreTokenizers(t *testing.T) {
	// Digits + WhitespaceSplit + Split on a plain string.
	tok, err := ParseHF(synthSPMJSON(t, `{"type":"Sequence","pretokenizers":[
		{"type":"WhitespaceSplit"},
		{"type":"Digits","individual_digits":true},
		{"type":"Split","pattern":{"String":"b"},"behavior":"MergedWithPrevious","invert":false}]}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	pieces := tok.split("ab12 bab", true)
	if want := []string{"ab", "1", "2", "b", "ab"}; !reflect.DeepEqual(pieces, want) {
		t.Errorf("pieces %q want %q", pieces, want)
	}
	for pre, want := range map[string][]string{
		`{"type":"Whitespace"}`:                         {"ab12", "!?", "b_a", "ü"},
		`{"type":"Punctuation","behavior":"Isolated"}`:  {"ab12 ", "!", "?", " b", "_", "a ü"},
		`{"type":"CharDelimiterSplit","delimiter":"_"}`: {"ab12 !? b", "a ü"},
	} {
		tok, err = ParseHF(synthSPMJSON(t, pre), nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := tok.split("ab12 !? b_a ü", true); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %q want %q", pre, got, want)
		}
	}
	// An unknown regex that RE2 can compile runs through regexp, with \s
	// widened to Unicode white space.
	tok, err = ParseHF(synthSPMJSON(t, `{"type":"Split","pattern":{"Regex":"\\s+"},"behavior":"Removed","invert":false}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := tok.split("a\u3000b  c", true), []string{"a", "b", "c"}; !reflect.DeepEqual(got, want) {
		t.Errorf("regex split: %q want %q", got, want)
	}
	// Look-ahead outside the known patterns is an error, not a panic.
	_, err = ParseHF(synthSPMJSON(t, `{"type":"Split","pattern":{"Regex":"a(?!b)"},"behavior":"Isolated","invert":false}`), nil)
	if err == nil || !strings.Contains(err.Error(), "not supported") {
		t.Errorf("look-ahead regex: err %v", err)
	}
}

func TestHFConfig(t *testing.T) {
	cfg := `{"bos_token":{"__type":"AddedToken","content":"<s>"},"eos_token":"</s>","add_bos_token":false,
		"chat_template":[{"name":"tool_use","template":"T"},{"name":"default","template":"D"}]}`
	tok, err := ParseHF(synthSPMJSON(t, `null`), []byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	v := tok.Vocab()
	if v.BOS != 1 || v.EOS != 2 || v.AddBOS || v.ChatTemplate != "D" || !v.IsEOG(2) {
		t.Errorf("BOS %d EOS %d AddBOS %v template %q EOG %v", v.BOS, v.EOS, v.AddBOS, v.ChatTemplate, v.EOG)
	}
	if got := tok.Encode("ab", Options{AddSpecial: true}); !reflect.DeepEqual(got, []int32{263}) {
		t.Errorf("no pre-tokenizer, add_bos false: %v", got)
	}
}

func TestHFErrors(t *testing.T) {
	bad := []string{
		``,
		`{}`,
		`{"model":{"type":"WordPiece","vocab":{"a":0}}}`,
		`{"model":{"type":"BPE","vocab":{"a":-1},"merges":[]}}`,
		`{"model":{"type":"BPE","vocab":{"a":0},"merges":["ab"]}}`,
		`{"model":{"type":"BPE","vocab":{"a":0},"merges":[3]}}`,
		`{"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"normalizer":{"type":"Precompiled"}}`,
		`{"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"pre_tokenizer":{"type":"Split","pattern":{"Regex":"("}}}`,
		`{"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"decoder":{"type":"WordPiece"}}`,
		`{"model":{"type":"BPE","vocab":{"a":0},"merges":[],"continuing_subword_prefix":"##"}}`,
		`{"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"added_tokens":[{"id":99999999,"content":"x"}]}`,
	}
	for _, s := range bad {
		if _, err := ParseHF([]byte(s), nil); err == nil {
			t.Errorf("accepted %s", s)
		}
	}
	if _, err := LoadHF("/nonexistent/tokenizer.json"); err == nil {
		t.Error("missing file accepted")
	}
	if _, err := NewBPE(&Vocab{Tokens: []string{"a"}, BOS: 5}, nil); err == nil {
		t.Error("BOS out of range accepted")
	}
	if _, err := NewBPE(&Vocab{Tokens: []string{"a"}, BOS: -1, EOS: -1, UNK: -1, PAD: -1, EOT: -1}, []string{"nospace"}); err == nil {
		t.Error("merge without space accepted")
	}
}

// FuzzParseHF: malformed tokenizer.json must give an error, never a panic.
func FuzzParseHF(f *testing.F) {
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]},"pre_tokenizer":{"type":"ByteLevel"}}`), "abab")
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"post_processor":{"type":"RobertaProcessing","sep":["x",7],"cls":["y",9]}}`), "a")
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"▁":0,"a":1},"merges":[["▁","a"]],"byte_fallback":true},"pre_tokenizer":{"type":"Metaspace"},"added_tokens":[{"id":5,"content":"<x>","lstrip":true,"rstrip":true}]}`), " a <x> b")
	f.Fuzz(func(t *testing.T, js []byte, text string) {
		tok, err := ParseHF(js, nil)
		if err != nil {
			return
		}
		ids := tok.Encode(text, Options{ParseSpecial: true, AddSpecial: true})
		for _, id := range ids {
			if id < 0 || int(id) >= len(tok.Vocab().Tokens) {
				t.Fatalf("id %d out of range", id)
			}
		}
		_ = tok.Decode(ids)
	})
}

func TestHFRobertaProcessing(t *testing.T) {
	js := `{"model":{"type":"BPE","vocab":{"<s>":0,"</s>":1,"a":2},"merges":[]},
		"added_tokens":[{"id":0,"content":"<s>","special":true},{"id":1,"content":"</s>","special":true}],
		"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false},
		"post_processor":{"type":"RobertaProcessing","sep":["</s>",1],"cls":["<s>",0]}}`
	tok, err := ParseHF([]byte(js), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := tok.Encode("aa", Options{AddSpecial: true}); !reflect.DeepEqual(got, []int32{0, 2, 2, 1}) {
		t.Errorf("got %v", got)
	}
}

func TestHFTranslateRegex(t *testing.T) {
	cases := map[string]string{
		`\s+`:       `[\t-\r\x{85}\p{Z}]+`,
		`[^\s\d]`:   `[^\t-\r\x{85}\p{Z}\p{Nd}]`,
		`\S\W\D`:    `[^\t-\r\x{85}\p{Z}][^\p{L}\p{M}\p{Nd}\p{Pc}][^\p{Nd}]`,
		`\\s`:       `\\s`,
		`[\S]`:      `[\S]`,
		`a\.b\p{L}`: `a\.b\p{L}`,
	}
	for in, want := range cases {
		if got := hfTranslateRegex(in); got != want {
			t.Errorf("%s: got %s want %s", in, got, want)
		}
	}
	re := regexp.MustCompile(hfTranslateRegex(`\w+`))
	if got := re.FindString("¿héllo_١٢"); got != "héllo_١٢" {
		t.Errorf(`\w+ on Unicode: %q`, got)
	}
}

func TestHFFastPair(t *testing.T) {
	cases := []struct {
		raw, a, b string
		ok        bool
	}{
		{`"Ġ t"`, "Ġ", "t", true},
		{`"  x"`, " ", "x", true}, // first space after the first byte
		{"[\n  \"Ġ\",\n  \"Ġ\"\n]", "Ġ", "Ġ", true},
		{`["a b","c"]`, "a b", "c", true},
		{`"a\u0020b c"`, "", "", false}, // escapes go through encoding/json
		{`["a","b","c"]`, "", "", false},
		{`"ab"`, "", "", false},
	}
	for _, c := range cases {
		a, b, ok := hfFastPair([]byte(c.raw))
		if ok != c.ok || ok && (a != c.a || b != c.b) {
			t.Errorf("%s: got %q %q %v", c.raw, a, b, ok)
		}
	}
}
