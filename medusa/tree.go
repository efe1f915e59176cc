package medusa

import "fmt"

// Tree is Medusa's static sparse tree of candidates, its nodes in the
// order they were chosen: node i is rank Rank[i] of the top-k of head
// Depth(i)−1 (head 0 guesses the token after the sequence's last), and
// follows node Parent[i] (−1: the last token). Every parent comes before
// its children, so any prefix of the nodes is a tree too, and siblings
// differ in rank, so in token.
type Tree struct {
	Parent []int32
	Rank   []int32
	depth  []int32
}

// Len is the number of nodes.
func (t *Tree) Len() int { return len(t.Parent) }

// Depth is node i's depth, 1 for a child of the last token.
func (t *Tree) Depth(i int) int { return int(t.depth[i]) }

// finish checks t against k heads of topK ranks and computes depths.
func (t *Tree) finish(k, topK int) error {
	if len(t.Rank) != len(t.Parent) {
		return fmt.Errorf("medusa: tree has %d parents and %d ranks", len(t.Parent), len(t.Rank))
	}
	t.depth = make([]int32, len(t.Parent))
	seen := make(map[[2]int32]bool, len(t.Parent))
	for i, p := range t.Parent {
		if p < -1 || int(p) >= i {
			return fmt.Errorf("medusa: tree node %d has parent %d (must be -1 or an earlier node)", i, p)
		}
		d := int32(1)
		if p >= 0 {
			d = t.depth[p] + 1
		}
		if int(d) > k {
			return fmt.Errorf("medusa: tree node %d is at depth %d, past the %d heads", i, d, k)
		}
		r := t.Rank[i]
		if r < 0 || int(r) >= topK {
			return fmt.Errorf("medusa: tree node %d takes rank %d of a top-%d", i, r, topK)
		}
		if seen[[2]int32{p, r}] {
			return fmt.Errorf("medusa: tree node %d repeats rank %d under parent %d", i, r, p)
		}
		seen[[2]int32{p, r}] = true
		t.depth[i] = d
	}
	return nil
}

// BuildTree is the paper's greedy construction: starting from the last
// token, add one node at a time, the child (of the root or a node already
// in) whose path has the largest expected acceptance, the product of the
// per-head rank accuracies along it, until nodes are placed or no child
// can be accepted at all. rankAcc is K·topK: rankAcc[k·topK+r] is how
// often rank r of head k was the right token.
func BuildTree(rankAcc []float64, k, topK, nodes int) (Tree, error) {
	if k < 1 || topK < 1 || len(rankAcc) != k*topK {
		return Tree{}, fmt.Errorf("medusa: %d rank accuracies for %d heads × top-%d", len(rankAcc), k, topK)
	}
	if nodes < 1 || nodes > 4096 {
		return Tree{}, fmt.Errorf("medusa: tree of %d nodes (want 1…4096)", nodes)
	}
	var t Tree
	var val []float64
	var depth []int
	used := map[[2]int32]bool{}
	for len(t.Parent) < nodes {
		best, bp, br := 0.0, int32(-2), int32(-1)
		for p := -1; p < len(t.Parent); p++ {
			pv, d := 1.0, 0
			if p >= 0 {
				pv, d = val[p], depth[p]
			}
			if d >= k {
				continue
			}
			for r := range topK {
				if used[[2]int32{int32(p), int32(r)}] {
					continue
				}
				if v := pv * rankAcc[d*topK+r]; v > best {
					best, bp, br = v, int32(p), int32(r)
				}
			}
		}
		if bp == -2 {
			break
		}
		used[[2]int32{bp, br}] = true
		d := 1
		if bp >= 0 {
			d = depth[bp] + 1
		}
		t.Parent, t.Rank = append(t.Parent, bp), append(t.Rank, br)
		val, depth = append(val, best), append(depth, d)
	}
	if len(t.Parent) == 0 {
		return Tree{}, fmt.Errorf("medusa: no head ever guessed right; no tree to build")
	}
	return t, t.finish(k, topK)
}

// priorAcc is a stand-in for measured accuracies (a published checkpoint
// carries none): the first head right about 60% of the time at rank 0,
// each further head three quarters as often, rank r about 1/(r+1) of
// rank 0 — roughly the shape the Medusa paper reports for Vicuna-7B.
func priorAcc(k, topK int) []float64 {
	acc := make([]float64, k*topK)
	a := 0.6
	for i := range k {
		for r := range topK {
			acc[i*topK+r] = a / float64(r+1) / 2
			if r == 0 {
				acc[i*topK] = a
			}
		}
		a *= 0.75
	}
	return acc
}
