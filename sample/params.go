// Package sample turns logits into tokens: logits processors (penalties,
// bias) and samplers (greedy, temperature, top-k, top-p, min-p) driven by a
// seeded random source.
package sample

// Params are the per-request sampling settings. The zero value is greedy
// decoding with no penalties.
type Params struct {
	Temperature float32 // 0 = greedy
	TopK        int     // 0 = off
	TopP        float32 // 0 or 1 = off
	MinP        float32 // 0 = off

	RepetitionPenalty float32 // 1 or 0 = off (llama.cpp/HF style: divide positive logits, multiply negative)
	FrequencyPenalty  float32 // OpenAI: subtract count·f
	PresencePenalty   float32 // OpenAI: subtract p if present
	PenaltyLastN      int     // window of recent tokens the penalties see; 0 = all

	LogitBias map[int32]float32
	Seed      uint64
	HasSeed   bool // false: a random seed per sampler
}

// Constraint restricts which tokens may come next (a grammar, a JSON
// schema). A sampler built with one (NewConstrained) masks the logits with
// it first and feeds it the chosen token. A constrained sampler's state
// moves with every draw, so it cannot verify speculative drafts (it would
// need its state cloned and rolled back): constrained requests must not
// speculate. Params holds no constraint: they are plain data, and a
// constraint is live state, one per completion.
type Constraint interface {
	// Mask sets the logits of forbidden tokens to -Inf; an error means no
	// token is allowed.
	Mask(logits []float32) error
	// Accept advances the state over the chosen token.
	Accept(tok int32) error
}
