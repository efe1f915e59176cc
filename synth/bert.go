package synth

import (
	"fmt"
	"hash/fnv"
	"math"
	"strings"

	"pagoda/arch"
	"pagoda/gguf"
	"pagoda/quant"
)

// BERT describes a synthetic BERT-family encoder (an embedding model) as
// llama.cpp's converter writes one: general.architecture "bert", learned
// positions, token types, post-norm blocks with biases, a WordPiece
// vocabulary and a pooling type.
type BERT struct {
	Layers, Embd, Heads, FFN int
	Positions                int // learned positions (context length)
	// Pooling is the GGUF pooling_type: 1 mean, 2 CLS, 3 last; 0 leaves
	// the key out.
	Pooling int
	// Type is the 2-D weights' type (F32 when zero); vectors are F32.
	Type quant.Type
	Seed int64
}

// WordPieceTokens is the vocabulary WriteBERT writes, in the GGUF
// spelling (word-start pieces carry "▁", continuations are bare): the
// five specials [PAD] [UNK] [CLS] [SEP] [MASK] at ids 0–4, then
// punctuation, letters and digits both as word starts and as
// continuations, frequent English words and a few suffixes.
func WordPieceTokens() []string {
	toks := []string{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}
	seen := map[string]bool{}
	add := func(s string) {
		if !seen[s] {
			seen[s] = true
			toks = append(toks, s)
		}
	}
	for _, c := range strings.Split(".,!?'\"-:;()", "") {
		add("▁" + c)
	}
	for c := 'a'; c <= 'z'; c++ {
		add("▁" + string(c))
		add(string(c))
	}
	for c := '0'; c <= '9'; c++ {
		add("▁" + string(c))
		add(string(c))
	}
	for _, w := range commonWords {
		add("▁" + w)
	}
	for _, s := range strings.Fields("ing ed er ly est s es ness ful") {
		add(s)
	}
	return toks
}

// WriteBERT writes the encoder to path.
func WriteBERT(path string, b BERT) error {
	w, err := bertWriter(b)
	if err != nil {
		return err
	}
	return w.WriteFile(path)
}

func bertWriter(b BERT) (*gguf.Writer, error) {
	if b.Type == 0 {
		b.Type = quant.F32
	}
	if b.Layers <= 0 || b.Embd <= 0 || b.Heads <= 0 || b.FFN <= 0 || b.Positions <= 0 || b.Embd%b.Heads != 0 {
		return nil, fmt.Errorf("synth: bert shape %+v invalid", b)
	}
	if b.Pooling < 0 || b.Pooling > 3 {
		return nil, fmt.Errorf("synth: bert pooling %d not one of 0–3", b.Pooling)
	}
	toks := WordPieceTokens()
	types := make([]int32, len(toks))
	scores := make([]float32, len(toks))
	for i := range toks {
		types[i] = typeNormal
		if i < 5 {
			types[i] = typeControl
		}
	}
	types[1] = typeUnknown
	w := gguf.NewWriter()
	kv := []struct {
		k string
		v any
	}{
		{"general.architecture", "bert"},
		{"general.name", "synthetic bert"},
		{"bert.block_count", uint32(b.Layers)},
		{"bert.context_length", uint32(b.Positions)},
		{"bert.embedding_length", uint32(b.Embd)},
		{"bert.feed_forward_length", uint32(b.FFN)},
		{"bert.attention.head_count", uint32(b.Heads)},
		{"bert.attention.layer_norm_epsilon", float32(1e-12)},
		{"bert.attention.causal", false},
		{"general.file_type", uint32(fileTypes[b.Type])},
		{"tokenizer.ggml.model", "bert"},
		{"tokenizer.ggml.tokens", toks},
		{"tokenizer.ggml.scores", scores},
		{"tokenizer.ggml.token_type", types},
		{"tokenizer.ggml.token_type_count", uint32(2)},
		{"tokenizer.ggml.padding_token_id", uint32(0)},
		{"tokenizer.ggml.unknown_token_id", uint32(1)},
		{"tokenizer.ggml.cls_token_id", uint32(2)},
		{"tokenizer.ggml.seperator_token_id", uint32(3)},
		{"tokenizer.ggml.mask_token_id", uint32(4)},
		{"tokenizer.ggml.bos_token_id", uint32(2)},
		{"tokenizer.ggml.eos_token_id", uint32(3)},
	}
	if b.Pooling > 0 {
		kv = append(kv, struct {
			k string
			v any
		}{"bert.pooling_type", uint32(b.Pooling)})
	}
	for _, e := range kv {
		if err := w.Set(e.k, e.v); err != nil {
			return nil, err
		}
	}
	d := arch.Dims{Embd: b.Embd, FFN: b.FFN, Vocab: len(toks), Positions: b.Positions, TokenTypes: 2}
	for _, t := range arch.BERT.Tensors(d, b.Layers) {
		shape := t.Shape(d)
		n := 1
		dims := make([]uint64, len(shape))
		for i, x := range shape {
			n *= x
			dims[i] = uint64(x)
		}
		f := make([]float32, n)
		h := fnv.New64a()
		h.Write([]byte(t.Name))
		fillNormal(f, splitmix(uint64(b.Seed)^h.Sum64()), bertStd(t.Role, b))
		typ := quant.F32
		// llama.cpp adds the token-type row to the embeddings as it is
		// stored, which its CPU backend can do for float types only.
		if len(shape) == 2 && t.Role != arch.TokenTypes {
			typ = storageType(b.Type, shape[0])
		}
		switch t.Role {
		case arch.EmbdNorm, arch.AttnOutNorm, arch.LayerOutNorm:
			for i := range f {
				f[i]++
			}
		}
		rb, err := quant.RowSize(typ, shape[0])
		if err != nil {
			return nil, err
		}
		data := make([]byte, rb*(n/shape[0]))
		if err := quant.QuantizeInto(typ, f, data); err != nil {
			return nil, err
		}
		if err := w.AddTensor(t.Name, typ, dims, data); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// bertStd sizes each tensor's noise so that attention is far from uniform
// and every layer changes its input noticeably: embeddings N(0,1), q/k
// N(0, 2/d) (score std ≈ 2), v/output/up N(0, 1/d), down N(0, 1/ffn),
// norms 1 + N(0, 0.1²), biases N(0, 0.05²).
func bertStd(r arch.Role, b BERT) float32 {
	isd := 1 / float32(b.Embd)
	switch r {
	case arch.TokenEmbd, arch.PosEmbd, arch.TokenTypes:
		return 1
	case arch.AttnQ, arch.AttnK:
		return sqrt32(2 * isd)
	case arch.AttnV, arch.AttnOut, arch.FFNUp:
		return sqrt32(isd)
	case arch.FFNDown:
		return sqrt32(1 / float32(b.FFN))
	case arch.EmbdNorm, arch.AttnOutNorm, arch.LayerOutNorm:
		return 0.1
	}
	return 0.05
}

func sqrt32(x float32) float32 { return float32(math.Sqrt(float64(x))) }
