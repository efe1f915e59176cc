package train

import (
	"context"
	"fmt"
	"strings"

	"pagoda/generate"
	"pagoda/gguf"
	"pagoda/model"
	"pagoda/sample"
)

// Distillation trains a draft on its target's own samples: a continuation
// y ~ p(·|x) drawn at temperature 1 and the draft's cross-entropy on it,
// E_y[−log q(y|x)], is the forward KL(p‖q) up to p's entropy, estimated
// from samples — the divergence DistillSpec finds works for drafting, on
// the target's own outputs rather than a corpus the target never saw.

// SampleTarget draws, for each prompt, a continuation of up to length
// tokens from m at temperature temp, and returns prompt+continuation.
func SampleTarget(ctx context.Context, m *model.Model, prompts [][]int32, length int, temp float32, seed uint64) ([][]int32, error) {
	out := make([][]int32, 0, len(prompts))
	for i, p := range prompts {
		o := generate.Options{MaxTokens: length, IgnoreEOS: true,
			Sampling: sample.Params{Temperature: temp, Seed: seed + uint64(i), HasSeed: true}}
		if len(p)+length > m.Config.ContextLen {
			o.MaxTokens = m.Config.ContextLen - len(p) - 1
		}
		if o.MaxTokens <= 0 {
			return nil, fmt.Errorf("train: prompt %d (%d tokens) leaves no room in the target's context of %d", i, len(p), m.Config.ContextLen)
		}
		res, err := generate.Generate(ctx, m, m.Tokenizer(), p, o, func(generate.Token) error { return nil })
		if err != nil {
			return nil, err
		}
		out = append(out, append(append([]int32(nil), p...), res.Tokens...))
	}
	return out, nil
}

// TokenizerMeta is the tokenizer.* metadata of a GGUF file, verbatim.
func TokenizerMeta(path string) ([]Meta, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var meta []Meta
	for _, kv := range f.KV {
		if strings.HasPrefix(kv.Key, "tokenizer.") {
			meta = append(meta, Meta{Key: kv.Key, Value: kv.Value})
		}
	}
	if len(meta) == 0 {
		return nil, fmt.Errorf("train: %s has no tokenizer metadata", path)
	}
	return meta, nil
}

// GreedyAgreement is the fraction of positions of seqs (from the second
// token on) at which the draft's most likely next token is the target's:
// the per-token acceptance rate of greedy speculative decoding with this
// draft on such text.
func GreedyAgreement(target *model.Model, draft *Model, seqs [][]int32) (float64, int, error) {
	agree, total := 0, 0
	V := draft.Config.Vocab
	for _, s := range seqs {
		if len(s) < 2 {
			continue
		}
		s = s[:min(len(s), draft.Config.Context, target.Config.ContextLen)]
		sc, err := generate.ScoreTokens(target, s, true, 0)
		if err != nil {
			return 0, 0, err
		}
		if _, err := draft.Forward(s, nil, 1, len(s)); err != nil {
			return 0, 0, err
		}
		lg := draft.Logits()
		for i := range s {
			if sample.Greedy(sc.Logits[i]) == sample.Greedy(lg[i*V:(i+1)*V]) {
				agree++
			}
			total++
		}
	}
	if total == 0 {
		return 0, 0, fmt.Errorf("train: no sequences to compare")
	}
	return float64(agree) / float64(total), total, nil
}
