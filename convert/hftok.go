package convert

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"pagoda/gguf"
	"pagoda/tokenizer"
)

// ggufPre names the pre-tokenizer families package tokenizer recognises
// in a tokenizer.json the way llama.cpp's converter names them in
// tokenizer.ggml.pre.
var ggufPre = map[string]string{
	"llama3":      "llama-bpe",
	"qwen2":       "qwen2",
	"gpt2":        "gpt-2",
	"deepseek-v3": "deepseek-v3",
	"tekken":      "tekken",
	"gpt-4o":      "gpt-4o",
}

// hfTokenizerKV builds GGUF tokenizer metadata from a Hugging Face
// tokenizer.json (path is the file or its directory; tokenizer_config.json
// beside it supplies BOS/EOS, add_bos_token and the chat template). Only
// byte-level BPE vocabularies (GPT-2, Llama 3, Qwen, DeepSeek V3, …) map
// onto GGUF's "gpt2" model without the scores SentencePiece models need.
func hfTokenizerKV(path string) ([]gguf.KV, error) {
	tok, err := tokenizer.LoadHF(path)
	if err != nil {
		return nil, err
	}
	v := tok.Vocab()
	if v.Model != "gpt2" {
		return nil, fmt.Errorf("only byte-level BPE tokenizer.json files convert (this one is %q); give the model's GGUF vocabulary or tokenizer.bin instead", v.Model)
	}
	pre, ok := ggufPre[v.Pre]
	if !ok {
		return nil, fmt.Errorf("pre-tokenizer not recognised (family %q), so tokenizer.ggml.pre cannot be set", v.Pre)
	}
	file := path
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		file = filepath.Join(path, "tokenizer.json")
		if _, err := os.Stat(file); err != nil {
			file += ".gz"
		}
	}
	merges, err := readMerges(file)
	if err != nil {
		return nil, err
	}
	toks := append([]string(nil), v.Tokens...)
	types := append([]int32(nil), v.Types...)
	for i, s := range toks {
		// Ids nothing in the file defines; llama.cpp's converter pads
		// them the same way.
		if s == "" {
			toks[i] = fmt.Sprintf("[PAD%d]", i)
			types[i] = tokenizer.TypeUserDefined
		}
	}
	entries := []struct {
		k string
		v any
	}{
		{"tokenizer.ggml.model", "gpt2"},
		{"tokenizer.ggml.pre", pre},
		{"tokenizer.ggml.tokens", toks},
		{"tokenizer.ggml.token_type", types},
		{"tokenizer.ggml.merges", merges},
	}
	for _, id := range []struct {
		k  string
		id int32
	}{
		{"tokenizer.ggml.bos_token_id", v.BOS}, {"tokenizer.ggml.eos_token_id", v.EOS},
		{"tokenizer.ggml.unknown_token_id", v.UNK}, {"tokenizer.ggml.padding_token_id", v.PAD},
	} {
		if id.id >= 0 {
			entries = append(entries, struct {
				k string
				v any
			}{id.k, uint32(id.id)})
		}
	}
	entries = append(entries, struct {
		k string
		v any
	}{"tokenizer.ggml.add_bos_token", v.AddBOS}, struct {
		k string
		v any
	}{"tokenizer.ggml.add_eos_token", v.AddEOS})
	if v.ChatTemplate != "" {
		entries = append(entries, struct {
			k string
			v any
		}{"tokenizer.chat_template", v.ChatTemplate})
	}
	out := make([]gguf.KV, 0, len(entries))
	for _, e := range entries {
		val, err := gguf.ToValue(e.v)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", e.k, err)
		}
		out = append(out, gguf.KV{Key: e.k, Value: val})
	}
	return out, nil
}

// readMerges returns model.merges of a tokenizer.json as GGUF stores them:
// "a b" strings, whether the file writes them so or as [a, b] pairs.
func readMerges(file string) ([]string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	if len(b) > 2 && b[0] == 0x1f && b[1] == 0x8b {
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			return nil, err
		}
		if b, err = io.ReadAll(zr); err != nil {
			return nil, err
		}
	}
	var f struct {
		Model struct {
			Merges []json.RawMessage `json:"merges"`
		} `json:"model"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	out := make([]string, len(f.Model.Merges))
	for i, raw := range f.Model.Merges {
		var s string
		var pair []string
		switch {
		case json.Unmarshal(raw, &s) == nil:
			out[i] = s
		case json.Unmarshal(raw, &pair) == nil && len(pair) == 2:
			out[i] = pair[0] + " " + pair[1]
		default:
			return nil, fmt.Errorf("%s: merge %d is neither \"a b\" nor [a, b]", file, i)
		}
	}
	return out, nil
}
