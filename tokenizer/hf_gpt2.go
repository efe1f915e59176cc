package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

// LoadGPT2 loads OpenAI's original GPT-2 files: encoder.json (token -> id,
// byte-level alphabet) and vocab.bpe (a "#version" line, then one merge per
// line, best first).
func LoadGPT2(encoderJSON, vocabBPE string) (*BPE, error) {
	eb, err := os.ReadFile(encoderJSON)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	var enc map[string]int32
	if err := json.Unmarshal(eb, &enc); err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", encoderJSON, err)
	}
	mb, err := os.ReadFile(vocabBPE)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	size := 0
	for s, id := range enc {
		if id < 0 || id >= 1<<24 {
			return nil, fmt.Errorf("tokenizer: %s: token %q: id %d out of range", encoderJSON, s, id)
		}
		size = max(size, int(id)+1)
	}
	v := &Vocab{Model: "gpt2", Pre: "gpt-2", BOS: -1, EOS: -1, UNK: -1, PAD: -1, EOT: -1}
	v.Tokens = make([]string, size)
	v.Types = make([]int32, size)
	for i := range v.Types {
		v.Types[i] = TypeUnused
	}
	for s, id := range enc {
		v.Tokens[id] = s
		v.Types[id] = TypeNormal
		if strings.HasPrefix(s, "<|") && strings.HasSuffix(s, "|>") {
			v.Types[id] = TypeControl
		}
	}
	if id, ok := enc["<|endoftext|>"]; ok {
		v.BOS, v.EOS = id, id
		v.EOG = []int32{id}
	}
	var merges []string
	for _, line := range strings.Split(string(mb), "\n") {
		line = strings.TrimRight(line, "\r")
		if line == "" || strings.HasPrefix(line, "#version") {
			continue
		}
		merges = append(merges, line)
	}
	t, err := NewBPE(v, merges)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", vocabBPE, err)
	}
	return t, nil
}
