package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
)

// hfWordPiece loads a BERT-style tokenizer.json (model "WordPiece") into the
// package's WordPiece tokenizer, whose vocabulary is in llama.cpp's GGUF
// spelling: word-initial pieces get "▁", "##" continuations lose it, and
// bracketed specials stay as they are (convert_hf_to_gguf.py's phantom
// space). BERT's normalizer and pre-tokenizer are built into WordPiece.
func hfWordPiece(data, configJSON []byte) (*WordPiece, error) {
	var f struct {
		AddedTokens   []hfAddedToken  `json:"added_tokens"`
		PostProcessor json.RawMessage `json:"post_processor"`
		Model         struct {
			Vocab                   map[string]int32 `json:"vocab"`
			UnkToken                string           `json:"unk_token"`
			ContinuingSubwordPrefix *string          `json:"continuing_subword_prefix"`
		} `json:"model"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	prefix := "##"
	if p := f.Model.ContinuingSubwordPrefix; p != nil {
		prefix = *p
	}
	size := 0
	for s, id := range f.Model.Vocab {
		if id < 0 || id >= 1<<24 {
			return nil, fmt.Errorf("tokenizer.json: token %q: id %d out of range", s, id)
		}
		size = max(size, int(id)+1)
	}
	for _, a := range f.AddedTokens {
		if a.ID < 0 || a.ID >= 1<<24 {
			return nil, fmt.Errorf("tokenizer.json: added token %q: id %d out of range", a.Content, a.ID)
		}
		size = max(size, int(a.ID)+1)
	}
	if size == 0 {
		return nil, fmt.Errorf("tokenizer.json: empty WordPiece vocab")
	}
	v := &Vocab{Model: "bert", BOS: -1, EOS: -1, UNK: -1, PAD: -1, EOT: -1}
	v.Tokens = make([]string, size)
	v.Types = make([]int32, size)
	for i := range v.Types {
		v.Types[i] = TypeUnused
	}
	for s, id := range f.Model.Vocab {
		v.Types[id] = TypeNormal
		switch {
		case strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]"):
			v.Tokens[id] = s
		case prefix != "" && strings.HasPrefix(s, prefix):
			v.Tokens[id] = s[len(prefix):]
		default:
			v.Tokens[id] = spaceMark + s
		}
	}
	for _, a := range f.AddedTokens {
		v.Tokens[a.ID] = a.Content
		if a.Special {
			v.Types[a.ID] = TypeControl
		} else {
			v.Types[a.ID] = TypeUserDefined
		}
	}
	if id, ok := f.Model.Vocab[f.Model.UnkToken]; ok {
		v.UNK = id
		v.Types[id] = TypeUnknown
	}
	cls, sep := hfTemplateEnds(f.PostProcessor)
	if int(cls) >= size {
		cls = -1
	}
	if int(sep) >= size {
		sep = -1
	}
	v.BOS, v.EOS = cls, sep
	v.AddBOS, v.AddEOS = cls >= 0, sep >= 0
	if configJSON != nil {
		var cfg hfConfig
		if err := json.Unmarshal(configJSON, &cfg); err != nil {
			return nil, fmt.Errorf("tokenizer_config.json: %w", err)
		}
		if cfg.PAD != nil {
			if id, ok := f.Model.Vocab[cfg.PAD.content]; ok {
				v.PAD = id
			}
		}
		tmpl, err := hfChatTemplate(cfg.ChatTemplate)
		if err != nil {
			return nil, fmt.Errorf("tokenizer_config.json: chat_template: %w", err)
		}
		v.ChatTemplate = tmpl
	}
	if v.EOS >= 0 {
		v.EOG = []int32{v.EOS}
	}
	t, err := NewWordPiece(v)
	if err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	return t, nil
}
