package tokenizer

import (
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestPreTokenizerSplits(t *testing.T) {
	const s = "Hello  world\n\n  foo 12345 I'm"
	cases := []struct {
		name string
		want []string
	}{
		{"llama-bpe", []string{"Hello", " ", " world", "\n\n", " ", " foo", " ", "123", "45", " I", "'m"}},
		{"qwen2", []string{"Hello", " ", " world", "\n\n", " ", " foo", " ", "1", "2", "3", "4", "5", " I", "'m"}},
		{"gpt-2", []string{"Hello", " ", " world", "\n\n ", " foo", " 12345", " I", "'m"}},
		{"starcoder", []string{"Hello", " ", " world", "\n\n ", " foo", " ", "1", "2", "3", "4", "5", " I", "'m"}},
		{"deepseek-coder", []string{"Hello", " ", " world", "\n", "\n", " ", " foo", " ", "1", "2", "3", "4", "5", " I", "'", "m"}},
		{"falcon", []string{"Hello", " ", " world", "\n\n ", " foo", " ", "123", "45", " I", "'", "m"}},
		{"deepseek-v3", []string{"Hello", " ", " world", "\n\n", " ", " foo", " ", "123", "45", " I", "'m"}},
		{"tekken", []string{"Hello", " ", " world", "\n\n", " ", " foo", " ", "1", "2", "3", "4", "5", " I", "'m"}},
		{"poro-chat", []string{"Hello", " ", " world", "\n\n ", " foo", " 12345", " I'm"}},
	}
	for _, c := range cases {
		f, err := PreTokenizer(c.name)
		if err != nil {
			t.Fatal(err)
		}
		if got := f(s); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s:\n got %q\nwant %q", c.name, got, c.want)
		}
	}
	// Case split and the contraction suffix of GPT-4o-style regexes.
	f, _ := PreTokenizer("gpt-4o")
	if got, want := f("HelloWORLDFoo don't"), []string{"Hello", "WORLDFoo", " don't"}; !reflect.DeepEqual(got, want) {
		t.Errorf("gpt-4o: got %q want %q", got, want)
	}
	if _, err := PreTokenizer("no-such-family"); err == nil {
		t.Error("unknown family accepted")
	}
}

// preFamilies is one name per distinct splitter.
var preFamilies = []string{"default", "llama3", "dbrx", "deepseek-llm", "deepseek-coder", "deepseek-v3", "falcon",
	"starcoder", "gpt2", "qwen2", "poro-chat", "viking", "tekken", "gpt-4o", "chameleon", "bailingmoe", "seed-coder"}

var preSeeds = []string{"", " ", "  ", "\n", " \n\n\t x", "Hello world", "I've 'RE 'll", "12345 3.3 ½",
	"🚀 😶\u200d🌫️ ✅", "我想在apple工作1314151天～", "нещо на Български", "\xff\xfe bad \xc3", "a\u0301\u0300b",
	"IMGIMGABZ <sentinel:12>    x", "ΆΈ-Ί ＡＢＣ　。", "\r\n\r\n  \r x"}

func fuzzPre(f *testing.F, name string) {
	split, err := PreTokenizer(name)
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range preSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		pieces := split(s)
		if got := strings.Join(pieces, ""); got != s {
			t.Fatalf("%s: pieces %q do not join to %q", name, pieces, s)
		}
		for _, p := range pieces {
			if p == "" {
				t.Fatalf("%s: empty piece in %q", name, pieces)
			}
			if utf8.ValidString(s) && !utf8.ValidString(p) {
				t.Fatalf("%s: piece %q cuts a character", name, p)
			}
		}
	})
}

func FuzzPreDefault(f *testing.F)       { fuzzPre(f, "default") }
func FuzzPreLlama3(f *testing.F)        { fuzzPre(f, "llama3") }
func FuzzPreDeepseekLLM(f *testing.F)   { fuzzPre(f, "deepseek-llm") }
func FuzzPreDeepseekCoder(f *testing.F) { fuzzPre(f, "deepseek-coder") }
func FuzzPreDeepseekV3(f *testing.F)    { fuzzPre(f, "deepseek-v3") }
func FuzzPreFalcon(f *testing.F)        { fuzzPre(f, "falcon") }
func FuzzPreStarcoder(f *testing.F)     { fuzzPre(f, "starcoder") }
func FuzzPreGPT2(f *testing.F)          { fuzzPre(f, "gpt2") }
func FuzzPreQwen2(f *testing.F)         { fuzzPre(f, "qwen2") }
func FuzzPrePoro(f *testing.F)          { fuzzPre(f, "poro-chat") }
func FuzzPreViking(f *testing.F)        { fuzzPre(f, "viking") }
func FuzzPreTekken(f *testing.F)        { fuzzPre(f, "tekken") }
func FuzzPreGPT4o(f *testing.F)         { fuzzPre(f, "gpt-4o") }
func FuzzPreChameleon(f *testing.F)     { fuzzPre(f, "chameleon") }
func FuzzPreBailingMoE(f *testing.F)    { fuzzPre(f, "bailingmoe") }
func FuzzPreSeedCoder(f *testing.F)     { fuzzPre(f, "seed-coder") }

// TestPreFamiliesJoin runs every family over the seeds (the fuzz property
// without the fuzzer) and checks every listed llama.cpp name resolves.
func TestPreFamiliesJoin(t *testing.T) {
	for _, name := range preFamilies {
		split, err := PreTokenizer(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range preSeeds {
			if got := strings.Join(split(s), ""); got != s {
				t.Errorf("%s: %q -> %q", name, s, got)
			}
		}
	}
	for _, name := range []string{"gpt-2", "llama-bpe", "qwen2", "deepseek-llm", "deepseek-coder", "deepseek-v3",
		"starcoder", "falcon", "mpt", "refact", "gpt-neox", "command-r", "roberta-bpe", "chameleon", "phi-2",
		"stablelm2", "olmo", "dbrx", "smaug-bpe", "poro-chat", "jais", "tekken", "deepseek-r1-qwen", "chatglm-bpe",
		"viking", "smollm", "codeshell", "bloom", "gpt3-finnish", "exaone", "minerva-7b", "llama4", "gpt-4o"} {
		if _, err := PreTokenizer(name); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestPreLinear: long runs of one class must not make a splitter
// quadratic ({1,3} digit runs and \s+$ once were, taking tens of seconds
// here). It fails only on both signs: over a second for the whole input,
// and 8× the input taking far more than 8× the time (the best of three
// runs each), so a busy machine alone does not fail it.
func TestPreLinear(t *testing.T) {
	units := []string{"A", " ", " \n", "'", "\u0301", "Aʰ", "1", "a ", "  1", "ab\u00a0"}
	const n = 1 << 17
	best := func(split func(string) []string, s string) time.Duration {
		d := time.Duration(1<<63 - 1)
		for range 3 {
			start := time.Now()
			split(s)
			d = min(d, time.Since(start))
		}
		return max(d, time.Microsecond)
	}
	for _, name := range preFamilies {
		split, _ := PreTokenizer(name)
		for _, u := range units {
			k := n / len([]rune(u))
			small, large := best(split, strings.Repeat(u, k/8)), best(split, strings.Repeat(u, k))
			if r := float64(large) / float64(small); r > 24 && large > time.Second {
				t.Errorf("%s on %d × %q: %v, against %v for an eighth (×%.0f)", name, n, u, large, small, r)
			}
		}
	}
}

func TestDeepseekLetterClass(t *testing.T) {
	t16 := preDeepseekLettersTable.R16
	for k := 1; k < len(t16); k++ {
		if t16[k].Lo <= t16[k-1].Hi || t16[k].Lo > t16[k].Hi {
			t.Fatalf("range %d: %U-%U after %U", k, t16[k].Lo, t16[k].Hi, t16[k-1].Hi)
		}
	}
	for _, r := range "aZµÀöǄΆᏸＺ𐐀𞤀ɐ\u2126\u212a\u1fbe\u1fd3\u1fdb\u1f7d" {
		if !preDeepseekLetters(r) {
			t.Errorf("%q (%U) should be a DeepSeek letter", r, r)
		}
	}
	for _, r := range "ª×÷ƻʔ中あ1_ ¶ก\u1fbf" {
		if preDeepseekLetters(r) {
			t.Errorf("%q (%U) should not be a DeepSeek letter", r, r)
		}
	}
}
