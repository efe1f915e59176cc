package arch

// Encoder declares a bidirectional (non-causal) encoder architecture, an
// embedding model: its tensors use the same Tensor declarations as the
// decoders', but its block is post-norm (x = LN(x + Attn(x)); x = LN(x +
// FFN(x))) with learned absolute positions, so it has no KV cache, no
// rotary embedding and no output head. The decoder loaders do not load
// encoders; package encoder does.
type Encoder struct {
	Name    string
	HFTypes []string
	// Globals are the tensors outside the blocks; Block a layer's tensors
	// (GGUF names without "blk.N.").
	Globals []Tensor
	Block   []Tensor
}

// Roles of the encoder's own tensors.
const (
	PosEmbd Role = iota + 100 // learned absolute positions
	TokenTypes
	EmbdNorm
	EmbdNormBias
	AttnOutBias
	AttnOutNorm
	AttnOutNormBias
	FFNUpBias
	FFNDownBias
	LayerOutNorm
	LayerOutNormBias
)

// BERT is the BERT family as llama.cpp's converter writes it (bert, and
// the BertModel checkpoints of MiniLM, bge, e5, gte-base): token, token
// type and position embeddings, a LayerNorm, post-norm blocks with biased
// q/k/v/output projections and a GELU MLP.
var BERT = &Encoder{
	Name:    "bert",
	HFTypes: []string{"bert"},
	Globals: []Tensor{
		{Name: "token_embd.weight", HF: "embeddings.word_embeddings.weight", Role: TokenEmbd, Shape: embdShape},
		{Name: "token_types.weight", HF: "embeddings.token_type_embeddings.weight", Role: TokenTypes,
			Shape: mat(embd, func(d Dims) int { return max(d.TokenTypes, 1) }), Optional: true},
		{Name: "position_embd.weight", HF: "embeddings.position_embeddings.weight", Role: PosEmbd,
			Shape: mat(embd, func(d Dims) int { return d.Positions })},
		{Name: "token_embd_norm.weight", HF: "embeddings.LayerNorm.weight", Role: EmbdNorm, Shape: vec(embd)},
		{Name: "token_embd_norm.bias", HF: "embeddings.LayerNorm.bias", Role: EmbdNormBias, Shape: vec(embd)},
	},
	Block: []Tensor{
		{Name: "attn_q.weight", HF: "attention.self.query.weight", Role: AttnQ, Shape: mat(embd, embd)},
		{Name: "attn_q.bias", HF: "attention.self.query.bias", Role: AttnQBias, Shape: vec(embd), Optional: true},
		{Name: "attn_k.weight", HF: "attention.self.key.weight", Role: AttnK, Shape: mat(embd, embd)},
		{Name: "attn_k.bias", HF: "attention.self.key.bias", Role: AttnKBias, Shape: vec(embd), Optional: true},
		{Name: "attn_v.weight", HF: "attention.self.value.weight", Role: AttnV, Shape: mat(embd, embd)},
		{Name: "attn_v.bias", HF: "attention.self.value.bias", Role: AttnVBias, Shape: vec(embd), Optional: true},
		{Name: "attn_output.weight", HF: "attention.output.dense.weight", Role: AttnOut, Shape: mat(embd, embd)},
		{Name: "attn_output.bias", HF: "attention.output.dense.bias", Role: AttnOutBias, Shape: vec(embd), Optional: true},
		{Name: "attn_output_norm.weight", HF: "attention.output.LayerNorm.weight", Role: AttnOutNorm, Shape: vec(embd)},
		{Name: "attn_output_norm.bias", HF: "attention.output.LayerNorm.bias", Role: AttnOutNormBias, Shape: vec(embd)},
		{Name: "ffn_up.weight", HF: "intermediate.dense.weight", Role: FFNUp, Shape: mat(embd, ffn)},
		{Name: "ffn_up.bias", HF: "intermediate.dense.bias", Role: FFNUpBias, Shape: vec(ffn), Optional: true},
		{Name: "ffn_down.weight", HF: "output.dense.weight", Role: FFNDown, Shape: mat(ffn, embd)},
		{Name: "ffn_down.bias", HF: "output.dense.bias", Role: FFNDownBias, Shape: vec(embd), Optional: true},
		{Name: "layer_output_norm.weight", HF: "output.LayerNorm.weight", Role: LayerOutNorm, Shape: vec(embd)},
		{Name: "layer_output_norm.bias", HF: "output.LayerNorm.bias", Role: LayerOutNormBias, Shape: vec(embd)},
	},
}

func embd(d Dims) int { return d.Embd }
func ffn(d Dims) int  { return d.FFN }

// encoders holds the declared encoder architectures (read-only).
var encoders = []*Encoder{BERT}

// LookupEncoder returns the encoder architecture a GGUF
// general.architecture names, or nil.
func LookupEncoder(ggufArch string) *Encoder {
	for _, e := range encoders {
		if e.Name == ggufArch {
			return e
		}
	}
	return nil
}

// EncoderNames lists the encoder architectures, for messages.
func EncoderNames() []string {
	var out []string
	for _, e := range encoders {
		out = append(out, e.Name)
	}
	return out
}

// Tensors lists every tensor of an encoder with these dims and layers in
// the order llama.cpp's converter writes them (optional ones included).
func (e *Encoder) Tensors(d Dims, layers int) []Named {
	var out []Named
	for _, t := range e.Globals {
		out = append(out, Named{Name: t.Name, Layer: -1, Tensor: t})
	}
	for l := 0; l < layers; l++ {
		for _, t := range e.Block {
			out = append(out, Named{Name: BlockName(l, t.Name), Layer: l, Tensor: t})
		}
	}
	return out
}
