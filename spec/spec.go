// Package spec is speculative decoding's proposing side: proposers that
// guess the next tokens of a sequence cheaply (an n-gram lookup in the
// sequence itself, a small draft model), the exact acceptance rule that
// keeps the output distribution the target's (Leviathan et al. 2023, Chen
// et al. 2023), and the bookkeeping that decides how many tokens to draft:
// per-request acceptance and the measured cost of verifying them.
//
// The engine owns the loop: before a step it asks a Proposer for drafts
// of the sequences that speculate, verifies them against the target's
// logits rows in the step's one forward pass, and tells the proposer what
// it rolled back (Truncate) or dropped (Free).
package spec

import "pagoda/sample"

// Req is one sequence's proposal request, and its answer.
type Req struct {
	ID     int32   // the sequence's handle (the engine's KV sequence id)
	Tokens []int32 // prompt then output so far; read only
	Max    int     // most tokens to propose
	// Sampler, for proposers that sample (a draft model), draws with the
	// request's sampling settings, so that q is processed as p is. nil
	// means greedy.
	Sampler *sample.Sampler

	// Draft is the proposal, at most Max tokens.
	Draft []int32
	// Probs holds, when not empty, len(Draft) rows of the target's
	// vocabulary size: row i is q, the distribution Draft[i] was drawn
	// from. Empty means each Draft[i] was chosen deterministically (q is
	// one-hot), as the n-gram proposer and greedy drafting do.
	Probs []float32
}

// Proposer guesses draft tokens. One goroutine (the engine's) calls it.
type Proposer interface {
	// Propose fills Draft (and Probs) of each request, batching where
	// it can; an empty Draft means no guess. An error is the proposer's
	// own failure (a draft model's forward pass), never the request's.
	Propose(reqs []*Req) error
	// Truncate says the target kept only the first n tokens of sequence
	// id: state beyond them is stale.
	Truncate(id int32, n int)
	// Free says sequence id is gone (finished, cancelled, preempted).
	Free(id int32)
}
