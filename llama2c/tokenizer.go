package llama2c

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
)

// Vocab is a llama2.c tokenizer.bin: int32 max_token_length, then per
// token a float32 score, an int32 byte length and the bytes. The file does
// not store the vocabulary size; every entry up to the end is read.
type Vocab struct {
	MaxTokenLength int
	Tokens         []string
	Scores         []float32
}

// Token types as GGUF's tokenizer.ggml.token_type numbers them.
const (
	TypeNormal  = 1
	TypeUnknown = 2
	TypeControl = 3
	TypeByte    = 6
)

// ReadVocab reads a tokenizer.bin file.
func ReadVocab(path string) (*Vocab, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("llama2c: %w", err)
	}
	v, err := ParseVocab(b)
	if err != nil {
		return nil, fmt.Errorf("llama2c: %s: %w", path, err)
	}
	return v, nil
}

// ParseVocab decodes tokenizer.bin bytes.
func ParseVocab(b []byte) (*Vocab, error) {
	le := binary.LittleEndian
	if len(b) < 4 {
		return nil, fmt.Errorf("tokenizer: %d bytes, too short", len(b))
	}
	mtl := int32(le.Uint32(b))
	if mtl <= 0 {
		return nil, fmt.Errorf("tokenizer: max_token_length %d", mtl)
	}
	v := &Vocab{MaxTokenLength: int(mtl)}
	off := 4
	for off < len(b) {
		if len(b)-off < 8 {
			return nil, fmt.Errorf("tokenizer: token %d: truncated entry at offset %d", len(v.Tokens), off)
		}
		score := math.Float32frombits(le.Uint32(b[off:]))
		n := int32(le.Uint32(b[off+4:]))
		off += 8
		if n < 0 || int(n) > len(b)-off {
			return nil, fmt.Errorf("tokenizer: token %d: length %d at offset %d exceeds the file", len(v.Tokens), n, off-4)
		}
		v.Tokens = append(v.Tokens, string(b[off:off+int(n)]))
		v.Scores = append(v.Scores, score)
		off += int(n)
	}
	if len(v.Tokens) == 0 {
		return nil, fmt.Errorf("tokenizer: no tokens")
	}
	return v, nil
}

// Pieces returns the tokens in SentencePiece spelling, as a GGUF vocabulary
// stores them: llama2.c's export wrote "\n<s>\n" and "\n</s>\n" for BOS and
// EOS and a plain space for "▁".
func (v *Vocab) Pieces() []string {
	out := make([]string, len(v.Tokens))
	for i, t := range v.Tokens {
		switch t {
		case "\n<s>\n":
			t = "<s>"
		case "\n</s>\n":
			t = "</s>"
		default:
			t = strings.ReplaceAll(t, " ", "▁")
		}
		out[i] = t
	}
	return out
}

// Types classifies the tokens the way llama.cpp's converter does: <unk>
// unknown, <s> and </s> control, <0xXX> byte tokens, the rest normal.
func (v *Vocab) Types() []int32 {
	out := make([]int32, len(v.Tokens))
	for i, t := range v.Pieces() {
		switch {
		case t == "<unk>":
			out[i] = TypeUnknown
		case t == "<s>" || t == "</s>":
			out[i] = TypeControl
		case isByteToken(t):
			out[i] = TypeByte
		default:
			out[i] = TypeNormal
		}
	}
	return out
}

func isByteToken(t string) bool {
	if len(t) != 6 || !strings.HasPrefix(t, "<0x") || t[5] != '>' {
		return false
	}
	_, err := strconv.ParseUint(t[3:5], 16, 8)
	return err == nil
}
