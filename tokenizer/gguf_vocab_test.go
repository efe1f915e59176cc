package tokenizer

import (
	"bytes"
	"os"
	"slices"
	"testing"

	"pagoda/gguf"
	"pagoda/testutil"
)

func loadGGUF(t *testing.T, name string) Tokenizer {
	t.Helper()
	tok, _ := loadGGUFTB(t, name)
	return tok
}

func loadGGUFTB(t testing.TB, name string) (Tokenizer, bool) {
	t.Helper()
	tok, err := Load(testutil.Shared(t, "models/llama.cpp-vocab/"+name))
	if err != nil {
		t.Fatal(err)
	}
	return tok, true
}

// TestGGUFVocabCases runs llama.cpp's test-tokenizer-0 vectors for the SPM
// and WordPiece vocabularies.
func TestGGUFVocabCases(t *testing.T) {
	for _, c := range []struct {
		name      string
		model     string
		roundTrip bool
	}{
		{"ggml-vocab-llama-spm.gguf", "llama", true},
		{"ggml-vocab-phi-3.gguf", "llama", true},
		// BERT lower-cases and strips accents: no round trip.
		{"ggml-vocab-bert-bge.gguf", "bert", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			tok := loadGGUF(t, c.name)
			if got := tok.Vocab().Model; got != c.model {
				t.Fatalf("model %q, want %q", got, c.model)
			}
			texts, want := vocabCases(t, c.name)
			checkCases(t, tok, texts, want, c.roundTrip)
		})
	}
}

func TestGGUFVocabMetadata(t *testing.T) {
	spm := loadGGUF(t, "ggml-vocab-llama-spm.gguf").Vocab()
	if spm.BOS != 1 || spm.EOS != 2 || spm.UNK != 0 || !spm.AddBOS || spm.AddEOS || !spm.AddSpacePrefix {
		t.Errorf("llama-spm: bos %d eos %d unk %d add_bos %v add_eos %v prefix %v", spm.BOS, spm.EOS, spm.UNK, spm.AddBOS, spm.AddEOS, spm.AddSpacePrefix)
	}
	phi := loadGGUF(t, "ggml-vocab-phi-3.gguf").Vocab()
	if phi.EOS != 32000 || phi.EOT != 32007 || !phi.IsEOG(32007) || !phi.IsEOG(32000) || phi.IsEOG(1) {
		t.Errorf("phi-3: eos %d eot %d eog %v", phi.EOS, phi.EOT, phi.EOG)
	}
	if phi.ChatTemplate == "" {
		t.Error("phi-3: chat template missing")
	}
	bert := loadGGUF(t, "ggml-vocab-bert-bge.gguf").Vocab()
	if bert.BOS != 101 || bert.EOS != 102 || bert.UNK != 100 || bert.PAD != 0 {
		t.Errorf("bert: cls %d sep %d unk %d pad %d", bert.BOS, bert.EOS, bert.UNK, bert.PAD)
	}
}

func TestGGUFSpecialTokens(t *testing.T) {
	phi := loadGGUF(t, "ggml-vocab-phi-3.gguf")
	text := "<|user|>\nHi<|end|>"
	parsed := phi.Encode(text, Options{ParseSpecial: true, AddSpecial: true})
	if parsed[0] != 1 || parsed[1] != 32010 || parsed[len(parsed)-1] != 32007 {
		t.Errorf("parsed %v: want BOS, <|user|>, ..., <|end|>", parsed)
	}
	// llama.cpp drops the white space after Phi-3's special tokens (keyed
	// on general.name); these ids are llama.cpp's.
	chat := phi.Encode("<|user|>\nSYS\nHI<|end|>\n<|assistant|>\n", Options{ParseSpecial: true, AddSpecial: true})
	if want := []int32{1, 32010, 317, 21554, 13, 17628, 32007, 32001}; !slices.Equal(chat, want) {
		t.Errorf("phi-3 chat turn %v, want %v", chat, want)
	}
	// Other models keep it.
	spm := loadGGUF(t, "ggml-vocab-llama-spm.gguf")
	if got := spm.Encode("</s>\nHi", Options{ParseSpecial: true}); len(got) < 3 || got[0] != 2 || !slices.Contains(got, 13) {
		t.Errorf("llama-spm lost the newline after </s>: %v", got)
	}
	plain := phi.Encode(text, Options{})
	if slices.Contains(plain, 32010) || slices.Contains(plain, 32007) {
		t.Errorf("without ParseSpecial control tokens were produced: %v", plain)
	}
	if got := phi.Decode(plain); got != text {
		t.Errorf("plain round trip %q, want %q", got, text)
	}
	bert := loadGGUF(t, "ggml-vocab-bert-bge.gguf")
	got := bert.Encode("Hello world", Options{AddSpecial: true})
	if want := []int32{101, 7592, 2088, 102}; !slices.Equal(got, want) {
		t.Errorf("bert with specials: %v, want %v", got, want)
	}
	if s := bert.Decode(got); s != "hello world" {
		t.Errorf("bert decode %q", s)
	}
}

// TestBaichuanLoads: no expected ids upstream, so check that it loads as SPM
// and round-trips the common test strings.
func TestBaichuanLoads(t *testing.T) {
	tok := loadGGUF(t, "ggml-vocab-baichuan.gguf")
	if tok.Vocab().Size() != 64000 || tok.Vocab().Model != "llama" {
		t.Fatalf("size %d model %q", tok.Vocab().Size(), tok.Vocab().Model)
	}
	texts, _ := vocabCases(t, "ggml-vocab-llama-spm.gguf")
	for _, text := range texts {
		ids := tok.Encode(text, Options{AddSpecial: true})
		if got := tok.Decode(ids); got != text {
			t.Errorf("Decode(Encode(%q)) = %q", text, got)
		}
	}
}

// ggufWith builds an in-memory GGUF holding only the given metadata.
func ggufWith(t *testing.T, kv map[string]any) *gguf.File {
	t.Helper()
	w := gguf.NewWriter()
	for k, v := range kv {
		if err := w.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestFromGGUFErrors(t *testing.T) {
	abc := []string{"a", "b", "c"}
	for name, kv := range map[string]map[string]any{
		"no model":     {"tokenizer.ggml.tokens": abc},
		"no tokens":    {"tokenizer.ggml.model": "llama"},
		"t5":           {"tokenizer.ggml.model": "t5", "tokenizer.ggml.tokens": abc},
		"short scores": {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": abc, "tokenizer.ggml.scores": []float32{0}},
		"bad types":    {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": abc, "tokenizer.ggml.token_type": []string{"x", "y", "z"}},
		"no merges":    {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": abc},
		"bert no unk":  {"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": abc, "tokenizer.ggml.unknown_token_id": uint32(7)},
	} {
		if _, err := FromGGUF(ggufWith(t, kv)); err == nil {
			t.Errorf("%s: no error", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	// A tiny valid one: out-of-range ids (0xFFFFFFFF) read as absent.
	tok, err := FromGGUF(ggufWith(t, map[string]any{
		"tokenizer.ggml.model":            "llama",
		"tokenizer.ggml.tokens":           []string{"<unk>", "<s>", "</s>", "▁a", "a"},
		"tokenizer.ggml.padding_token_id": uint32(0xFFFFFFFF),
	}))
	if err != nil {
		t.Fatal(err)
	}
	if v := tok.Vocab(); v.PAD != -1 || v.BOS != 1 {
		t.Errorf("pad %d bos %d", v.PAD, v.BOS)
	}
	if got := tok.Encode("a", Options{}); !slices.Equal(got, []int32{3}) {
		t.Errorf("Encode(a) = %v", got)
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/tokenizer.model", []byte("\x0a\x0b"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, dir + "/missing.gguf", dir + "/x.txt", dir + "/tokenizer.model"} {
		if _, err := Load(p); err == nil {
			t.Errorf("Load(%s): no error", p)
		}
	}
	if err := os.WriteFile(dir+"/bad.gguf", []byte("GGUF\x03"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir + "/bad.gguf"); err == nil {
		t.Error("truncated gguf: no error")
	}
	// A GGUF is recognised by its magic whatever its name.
	b, err := os.ReadFile(testutil.Shared(t, "models/gguf/stories260K.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir+"/model", b, 0o644); err != nil {
		t.Fatal(err)
	}
	if tok, err := Load(dir + "/model"); err != nil || tok.Vocab().Size() != 512 {
		t.Errorf("GGUF without extension: %v", err)
	}
	tok, err := Load(testutil.Shared(t, "models/llama2.c"))
	if err != nil {
		t.Fatal(err)
	}
	if tok.Vocab().Size() != 32000 {
		t.Errorf("llama2.c dir: %d tokens", tok.Vocab().Size())
	}
}

// TestModelGGUFVocabs: the vocabularies inside model files tokenize like
// their reference tokenizers.
func TestModelGGUFVocabs(t *testing.T) {
	tok, err := Load(testutil.Shared(t, "models/gguf/stories260K.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	got := tok.Encode("Once upon a time", Options{AddSpecial: true})
	if want := []int32{1, 403, 407, 261, 378}; !slices.Equal(got, want) {
		t.Errorf("stories260K.gguf: %v, want %v", got, want)
	}
	ref, err := LoadLlama2C(testutil.Shared(t, "models/llama2.c/tok512.bin"))
	if err != nil {
		t.Fatal(err)
	}
	texts, _ := vocabCases(t, "ggml-vocab-llama-spm.gguf")
	for _, text := range texts {
		a, b := tok.Encode(text, Options{AddSpecial: true}), ref.Encode(text, Options{AddSpecial: true})
		if !slices.Equal(a, b) {
			t.Errorf("%q: gguf %v, tok512.bin %v", text, a, b)
		}
	}

	tiny, err := Load(testutil.Shared(t, "models/ollama/llama-2-tiny-random.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	texts, want := vocabCases(t, "ggml-vocab-llama-spm.gguf")
	checkCases(t, tiny, texts, want, true)
}
