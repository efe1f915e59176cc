package tokenizer

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"pagoda/gguf"
)

// eotTexts are the texts llama.cpp recognises as end-of-turn tokens when a
// GGUF names no eot_token_id; every one of them also ends generation.
var eotTexts = []string{
	"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
	"<|end_of_text|>", "<EOT>", "_<EOT>", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
}

// eogTexts end generation too, without being the end-of-turn token.
var eogTexts = []string{"<|eom_id|>", "<|return|>", "<|call|>"}

// VocabFromGGUF reads the tokenizer.ggml.* metadata of f into a Vocab, with
// llama.cpp's defaults for what is absent. It also returns the BPE merges
// ("gpt2" vocabularies; nil otherwise).
func VocabFromGGUF(f *gguf.File) (*Vocab, []string, error) {
	model, ok := f.String("tokenizer.ggml.model")
	if !ok {
		return nil, nil, fmt.Errorf("tokenizer: gguf: no tokenizer.ggml.model")
	}
	tokens, ok := f.Strings("tokenizer.ggml.tokens")
	if !ok || len(tokens) == 0 {
		return nil, nil, fmt.Errorf("tokenizer: gguf: tokenizer.ggml.tokens missing or empty (model %q)", model)
	}
	n := len(tokens)
	v := &Vocab{Model: model, Tokens: tokens, PAD: -1, EOT: -1}
	v.Pre, _ = f.String("tokenizer.ggml.pre")
	v.ChatTemplate, _ = f.String("tokenizer.chat_template")
	if _, present := f.Get("tokenizer.ggml.scores"); present {
		if v.Scores, ok = f.Float32s("tokenizer.ggml.scores"); !ok || len(v.Scores) != n {
			return nil, nil, fmt.Errorf("tokenizer: gguf: tokenizer.ggml.scores is not a float array of %d", n)
		}
	}
	if _, present := f.Get("tokenizer.ggml.token_type"); present {
		if v.Types, ok = f.Int32s("tokenizer.ggml.token_type"); !ok || len(v.Types) != n {
			return nil, nil, fmt.Errorf("tokenizer: gguf: tokenizer.ggml.token_type is not an integer array of %d", n)
		}
	}
	var merges []string
	if _, present := f.Get("tokenizer.ggml.merges"); present {
		if merges, ok = f.Strings("tokenizer.ggml.merges"); !ok {
			return nil, nil, fmt.Errorf("tokenizer: gguf: tokenizer.ggml.merges is not a string array")
		}
	}

	// Per-model defaults, as llama.cpp's llama_vocab::load sets them.
	v.BOS, v.EOS, v.UNK = -1, -1, -1
	switch model {
	case "llama":
		v.BOS, v.EOS, v.UNK = 1, 2, 0
		v.AddBOS, v.AddSpacePrefix = true, true
	case "bert":
		v.BOS, v.EOS, v.UNK, v.PAD = 101, 102, 100, 0
		v.AddBOS, v.AddEOS = true, true
	case "gpt2":
		// These families add BOS when the file does not say (llama.cpp
		// sets add_bos with their pre-tokenizer type).
		switch v.Pre {
		case "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "tekken", "chameleon":
			v.AddBOS = true
		}
	}
	ids := []struct {
		key string
		dst *int32
	}{
		{"tokenizer.ggml.bos_token_id", &v.BOS},
		{"tokenizer.ggml.eos_token_id", &v.EOS},
		{"tokenizer.ggml.unknown_token_id", &v.UNK},
		{"tokenizer.ggml.padding_token_id", &v.PAD},
		{"tokenizer.ggml.eot_token_id", &v.EOT},
	}
	if model == "bert" {
		// BERT wraps input in [CLS] ... [SEP].
		ids = append(ids, struct {
			key string
			dst *int32
		}{"tokenizer.ggml.cls_token_id", &v.BOS}, struct {
			key string
			dst *int32
		}{"tokenizer.ggml.seperator_token_id", &v.EOS})
	}
	for _, k := range ids {
		if x, ok := f.Int(k.key); ok {
			// Out-of-range ids (0xFFFFFFFF is a common "none") mean absent.
			if x >= 0 && x < int64(n) {
				*k.dst = int32(x)
			} else {
				*k.dst = -1
			}
		}
	}
	for _, id := range []*int32{&v.BOS, &v.EOS, &v.UNK, &v.PAD} {
		if *id >= int32(n) {
			*id = -1
		}
	}
	for _, b := range []struct {
		key string
		dst *bool
	}{
		{"tokenizer.ggml.add_bos_token", &v.AddBOS},
		{"tokenizer.ggml.add_eos_token", &v.AddEOS},
		{"tokenizer.ggml.add_space_prefix", &v.AddSpacePrefix},
	} {
		if x, ok := f.Bool(b.key); ok {
			*b.dst = x
		}
	}
	findEOG(v)
	if x, ok := f.Int("tokenizer.ggml.eom_token_id"); ok && x >= 0 && x < int64(n) {
		v.EOG = appendUnique(v.EOG, int32(x))
	}
	return v, merges, nil
}

// findEOG fills in the end-of-turn token when the file names none and
// collects every end-of-generation token, as llama.cpp does.
func findEOG(v *Vocab) {
	special := func(id int) bool {
		ty := v.tokenType(int32(id))
		return v.Types == nil || ty == TypeControl || ty == TypeUserDefined
	}
	if v.EOT < 0 {
	find:
		for _, s := range eotTexts {
			for i, tok := range v.Tokens {
				if tok == s && special(i) {
					v.EOT = int32(i)
					break find
				}
			}
		}
	}
	for _, id := range []int32{v.EOS, v.EOT} {
		if id >= 0 {
			v.EOG = appendUnique(v.EOG, id)
		}
	}
	for i, tok := range v.Tokens {
		if !special(i) {
			continue
		}
		for _, s := range append(eotTexts, eogTexts...) {
			if tok == s {
				v.EOG = appendUnique(v.EOG, int32(i))
			}
		}
	}
}

func appendUnique(s []int32, id int32) []int32 {
	for _, x := range s {
		if x == id {
			return s
		}
	}
	return append(s, id)
}

// FromGGUF builds the tokenizer that f's metadata describes: "llama" is
// SentencePiece (NewSPM), "gpt2" byte-level BPE (NewBPE), "bert" WordPiece.
func FromGGUF(f *gguf.File) (Tokenizer, error) {
	v, merges, err := VocabFromGGUF(f)
	if err != nil {
		return nil, err
	}
	name, _ := f.String("general.name")
	switch v.Model {
	case "llama":
		t, err := NewSPM(v)
		if err != nil {
			return nil, err
		}
		t.special.applyNameRules(name)
		return t, nil
	case "gpt2":
		if len(merges) == 0 {
			return nil, fmt.Errorf("tokenizer: gguf: gpt2 vocabulary without tokenizer.ggml.merges")
		}
		return NewBPE(v, merges)
	case "bert":
		return NewWordPiece(v)
	}
	return nil, fmt.Errorf("tokenizer: gguf: tokenizer model %q not supported (want llama, gpt2 or bert)", v.Model)
}

// Load opens a tokenizer from a file or directory: a .gguf file (its
// vocabulary metadata), a llama2.c tokenizer.bin, or a Hugging Face
// tokenizer.json (or a directory holding one).
func Load(path string) (Tokenizer, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if st.IsDir() {
		for _, name := range []string{"tokenizer.json", "tokenizer.bin"} {
			if _, err := os.Stat(filepath.Join(path, name)); err == nil {
				return Load(filepath.Join(path, name))
			}
		}
		return nil, fmt.Errorf("tokenizer: directory %s holds no tokenizer.json or tokenizer.bin", path)
	}
	base := filepath.Base(path)
	switch {
	case strings.HasSuffix(strings.ToLower(path), ".gguf") || gguf.IsGGUF(path):
		f, err := gguf.Open(path)
		if err != nil {
			return nil, fmt.Errorf("tokenizer: %w", err)
		}
		defer f.Close()
		t, err := FromGGUF(f)
		if err != nil {
			return nil, fmt.Errorf("%w (%s)", err, path)
		}
		return t, nil
	case strings.HasSuffix(path, ".json"):
		return LoadHF(path)
	case strings.HasSuffix(path, ".bin"):
		return LoadLlama2C(path)
	case base == "tokenizer.model":
		return nil, fmt.Errorf("tokenizer: %s: SentencePiece protobuf models are not supported; use the model's GGUF, tokenizer.json or llama2.c tokenizer.bin", path)
	}
	return nil, fmt.Errorf("tokenizer: %s: unknown tokenizer file (want .gguf, tokenizer.json or llama2.c tokenizer.bin)", path)
}
