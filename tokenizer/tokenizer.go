// Package tokenizer turns text into token ids and back: SentencePiece-style
// BPE with scores and byte fallback, byte-level BPE with per-family
// pre-tokenizers, WordPiece, and the vocabularies of GGUF files, Hugging Face
// tokenizer.json and llama2.c tokenizer.bin.
package tokenizer

// Token types, as in GGUF tokenizer.ggml.token_type (llama.cpp's
// LLAMA_TOKEN_TYPE_*).
const (
	TypeUndefined   = 0
	TypeNormal      = 1
	TypeUnknown     = 2
	TypeControl     = 3
	TypeUserDefined = 4
	TypeUnused      = 5
	TypeByte        = 6
)

// Options controls one Encode call.
type Options struct {
	// AddSpecial adds BOS (and EOS) as the vocabulary's add_bos/add_eos say.
	AddSpecial bool
	// ParseSpecial recognises special/added tokens ("<|im_start|>", "<s>")
	// written in the text; otherwise they are encoded as plain text.
	ParseSpecial bool
}

// Tokenizer is what the rest of Pagoda needs of a tokenizer.
type Tokenizer interface {
	Encode(text string, o Options) []int32
	// Decode turns ids into text; special tokens are rendered as their text,
	// except BOS/EOS/control tokens, which render as nothing.
	Decode(ids []int32) string
	// TokenBytes is the raw byte sequence token id contributes to the
	// output (after byte-fallback / byte-level decoding), for incremental
	// detokenization. The SentencePiece "▁" is already a space here; the
	// first-token leading-space rule is applied by Decode and Stream.
	TokenBytes(id int32) []byte
	Vocab() *Vocab
}

// Vocab is the data common to every tokenizer kind.
type Vocab struct {
	Model  string // "llama" (SPM), "gpt2" (byte-level BPE), "bert" (WordPiece)
	Pre    string // pre-tokenizer name (GGUF tokenizer.ggml.pre), e.g. "llama3"
	Tokens []string
	Scores []float32
	Types  []int32

	BOS, EOS, UNK, PAD, EOT int32   // -1 when absent
	EOG                     []int32 // every id that ends generation
	AddBOS, AddEOS          bool
	AddSpacePrefix          bool // SPM: encode as if the text began with "▁"

	ChatTemplate string // Jinja source, "" when none
}

// IsEOG reports whether id ends generation.
func (v *Vocab) IsEOG(id int32) bool {
	if id < 0 {
		return false
	}
	if id == v.EOS || id == v.EOT {
		return true
	}
	for _, e := range v.EOG {
		if e == id {
			return true
		}
	}
	return false
}

// Size is the number of tokens.
func (v *Vocab) Size() int { return len(v.Tokens) }
