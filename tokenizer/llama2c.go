package tokenizer

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"strings"
)

// LoadLlama2C reads a llama2.c tokenizer.bin (Llama-2's tokenizer.bin,
// tok512.bin, ...) as an SPM tokenizer with BOS 1, EOS 2, UNK 0, a dummy
// space prefix and add_bos, which is how run.c uses it.
func LoadLlama2C(path string) (*SPM, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: llama2.c: %w", err)
	}
	t, err := ParseLlama2C(b)
	if err != nil {
		return nil, fmt.Errorf("%w (%s)", err, path)
	}
	return t, nil
}

// ParseLlama2C parses the bytes of a llama2.c tokenizer.bin: int32
// max_token_length, then per token float32 score, int32 length and the
// token's bytes, until the end of the data. export.py wrote "▁" as a space
// and BOS/EOS as "\n<s>\n"/"\n</s>\n"; both are undone here so the
// vocabulary reads like a GGUF "llama" one.
func ParseLlama2C(b []byte) (*SPM, error) {
	fail := func(format string, a ...any) (*SPM, error) {
		return nil, fmt.Errorf("tokenizer: llama2.c tokenizer.bin: "+format, a...)
	}
	if len(b) < 4 {
		return fail("%d bytes, too short for the header", len(b))
	}
	maxLen := int32(binary.LittleEndian.Uint32(b))
	if maxLen <= 0 || int(maxLen) > len(b) {
		return fail("max_token_length %d is invalid", maxLen)
	}
	v := &Vocab{Model: "llama", Pre: "default", BOS: 1, EOS: 2, UNK: 0, PAD: -1, EOT: -1,
		AddBOS: true, AddSpacePrefix: true}
	off := 4
	for off < len(b) {
		id := len(v.Tokens)
		if len(b)-off < 8 {
			return fail("token %d: record truncated at byte %d", id, off)
		}
		score := math.Float32frombits(binary.LittleEndian.Uint32(b[off:]))
		n := int32(binary.LittleEndian.Uint32(b[off+4:]))
		off += 8
		if n < 0 || n > maxLen || int(n) > len(b)-off {
			return fail("token %d: length %d is invalid (max_token_length %d, %d bytes left)", id, n, maxLen, len(b)-off)
		}
		if math.IsNaN(float64(score)) {
			return fail("token %d: score is NaN", id)
		}
		s := string(b[off : off+int(n)])
		off += int(n)
		typ := int32(TypeNormal)
		switch {
		case id == 0 && s == "<unk>":
			typ = TypeUnknown
		case (id == 1 && s == "\n<s>\n") || (id == 2 && s == "\n</s>\n"):
			s = strings.TrimSpace(s)
			typ = TypeControl
		case isByteToken(s):
			typ = TypeByte
		default:
			s = strings.ReplaceAll(s, " ", spaceMark)
		}
		v.Tokens = append(v.Tokens, s)
		v.Scores = append(v.Scores, score)
		v.Types = append(v.Types, typ)
	}
	if len(v.Tokens) < 3 {
		return fail("%d tokens; need at least <unk>, <s>, </s>", len(v.Tokens))
	}
	t, err := NewSPM(v)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: llama2.c tokenizer.bin: %w", err)
	}
	return t, nil
}

func isByteToken(s string) bool {
	_, ok := parseByteToken(s)
	return ok
}
