package arch

import "fmt"

// Split is how a tensor divides across the ranks of a tensor-parallel
// group, so that a rank binds and loads only its shard. Every declared
// tensor names one (the zero value is "undeclared", which the arch tests
// refuse).
type Split uint8

const (
	// Replicated: every rank holds the whole tensor (norms, the MoE
	// router, MLA's low-rank down-projections).
	Replicated Split = iota + 1
	// Column: column-parallel. The output rows of W (ggml dims[1]) split
	// into contiguous ranges, so each rank computes a slice of the output
	// from the whole input; a vector (a bias) with this split divides with
	// those rows. Attention's q/k/v split by whole heads.
	Column
	// Row: row-parallel. The input columns of W (ggml dims[0]) split; each
	// rank multiplies its slice of the input and an all-reduce sums the
	// partial outputs. A row-parallel matrix consumes a column-parallel
	// one's output without any exchange in between.
	Row
	// Vocab: the vocabulary rows of the embedding or the output head split;
	// the logits' slices are gathered.
	Vocab
	// Expert: a stack of matrices (ggml dims[2]) splits by whole matrices:
	// MoE experts, or MLA's per-head up-projections.
	Expert
)

func (s Split) String() string {
	switch s {
	case Replicated:
		return "replicated"
	case Column:
		return "column"
	case Row:
		return "row"
	case Vocab:
		return "vocab"
	case Expert:
		return "expert"
	}
	return fmt.Sprintf("Split(%d)", uint8(s))
}
