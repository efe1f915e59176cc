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

import (
	"fmt"

	"pagoda/sample"
)

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
	// Parent, when not empty, makes Draft a tree of candidates (Medusa's
	// static tree, EAGLE-2's dynamic one), verified in one pass with a
	// tree attention mask: node i follows node Parent[i], an index below
	// i, or the sequence's last token when Parent[i] is -1. Siblings must
	// differ in token when Probs is empty (a top-k expansion), so that
	// one draw from the target picks at most one of them. Empty: a chain,
	// node i following node i-1. Max bounds the nodes either way.
	Parent []int32
	// TopK and Depth, for a TreeShaper, shrink the tree this request
	// gets: at most TopK children per node (its TopK most likely; 1
	// makes a chain) and paths of at most Depth nodes. 0 leaves the
	// proposer's own.
	TopK, Depth int

	// Features, for a FeatureProposer, are the target's final hidden
	// states (after the output norm: the output head's input, NEmbd
	// floats each) of the positions FeatFrom, FeatFrom+1, … of Tokens
	// that the target computed and kept since this sequence's previous
	// Propose; the newest is that of position len(Tokens)-2, whose logits
	// gave the last token (or, when Features is empty, no new row came).
	// Positions the target did not compute have none: a prompt's prefix
	// served from the prefix cache, so FeatFrom may start past 0 on the
	// first call, or past the rows seen so far after a recompute; the
	// proposer goes on from the rows it has. After Truncate(id, n) the
	// next rows start at FeatFrom ≤ n. Max may be 0: features only, no
	// drafts wanted. Read only, valid during the call.
	Features []float32
	FeatFrom int
}

// TreeShaper is a proposer of trees whose shape a request can shrink
// below the proposer's own (Req.TopK, Req.Depth): the engine's
// controller picks, per load, the tree that yields the most tokens per
// second of step time.
type TreeShaper interface {
	Proposer
	// TreeShape is the widest and deepest tree it drafts: the most
	// children of a node and the longest path.
	TreeShape() (topK, depth int)
}

// FeatureProposer is a proposer that predicts from the target's own
// hidden states (Medusa heads, an EAGLE draft layer): the engine asks the
// executor for them and hands them over in Req.Features.
type FeatureProposer interface {
	Proposer
	// FeatureDim is the width of the features it reads: the target's
	// NEmbd.
	FeatureDim() int
}

// Chain reports whether parent describes a chain: empty, or each node
// following the one before it.
func Chain(parent []int32) bool {
	for i, p := range parent {
		if int(p) != i-1 {
			return false
		}
	}
	return true
}

// CheckTree reports whether parent is a valid tree of n nodes: each
// parent -1 or an earlier node.
func CheckTree(parent []int32, n int) error {
	if len(parent) == 0 {
		return nil
	}
	if len(parent) != n {
		return fmt.Errorf("spec: %d parents for %d draft nodes", len(parent), n)
	}
	for i, p := range parent {
		if p < -1 || int(p) >= i {
			return fmt.Errorf("spec: draft node %d has parent %d (must be -1 or an earlier node)", i, p)
		}
	}
	return nil
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
