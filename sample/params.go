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
