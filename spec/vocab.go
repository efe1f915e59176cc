package spec

import (
	"fmt"

	"pagoda/tokenizer"
)

// Vocabulary compatibility, as llama.cpp checks it for a draft model
// (common_speculative_are_compatible): the draft proposes token ids the
// target verifies, so an id must mean the same text in both.
const (
	// MaxVocabDiff is how many more tokens one vocabulary may have: the
	// padded or added tail some fine-tunes carry.
	MaxVocabDiff = 128
	// vocabCheckFrom skips the first few ids (control tokens whose texts
	// vary between conversions of one tokenizer).
	vocabCheckFrom = 5
)

// CheckVocab reports why a draft model's vocabulary cannot serve a target:
// a different tokenizer type, different BOS/EOS (or whether they are
// added), sizes more than MaxVocabDiff apart, or a token text that differs
// in the ids both have.
func CheckVocab(target, draft *tokenizer.Vocab) error {
	switch {
	case target == nil || draft == nil:
		return fmt.Errorf("spec: draft vocabulary check: a model has no vocabulary")
	case target.Model != draft.Model:
		return fmt.Errorf("spec: draft tokenizer type %q differs from the target's %q", draft.Model, target.Model)
	case target.AddBOS != draft.AddBOS || target.AddEOS != draft.AddEOS:
		return fmt.Errorf("spec: draft adds BOS/EOS (%v/%v), the target (%v/%v)", draft.AddBOS, draft.AddEOS, target.AddBOS, target.AddEOS)
	case target.BOS != draft.BOS || target.EOS != draft.EOS:
		return fmt.Errorf("spec: draft special tokens BOS %d, EOS %d differ from the target's BOS %d, EOS %d", draft.BOS, draft.EOS, target.BOS, target.EOS)
	}
	nt, nd := len(target.Tokens), len(draft.Tokens)
	if d := nt - nd; d > MaxVocabDiff || -d > MaxVocabDiff {
		return fmt.Errorf("spec: draft vocabulary of %d tokens and target's of %d differ by more than %d", nd, nt, MaxVocabDiff)
	}
	for i := vocabCheckFrom; i < min(nt, nd); i++ {
		if target.Tokens[i] != draft.Tokens[i] {
			return fmt.Errorf("spec: draft token %d is %q, the target's is %q: the vocabularies differ", i, draft.Tokens[i], target.Tokens[i])
		}
	}
	return nil
}
