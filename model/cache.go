package model

// Batch is one flat forward pass over tokens of one or more sequences:
// prefill chunks and single decode tokens mixed. Tokens of one sequence must
// appear in increasing position order.
type Batch struct {
	Tokens []int32
	Pos    []int32
	Seq    []int32 // sequence handle of each token, as the KVCache knows it
	// Logits marks the rows whose logits Forward returns, in row order.
	// nil means only the last row.
	Logits []bool
	// KV, when set, is where the rows live in a paged KV storage as the
	// scheduler's KV manager planned it; the storage then looks nothing
	// up by sequence. nil: the storage plans the step itself.
	KV *KVPlan
	// Rope, when set, is each row's rotary position where it differs from
	// its KV position Pos: the nodes of a speculation tree are stored at
	// consecutive positions after the sequence (Pos, which the KV plan
	// and spans address) but rotate by their depth in the tree, siblings
	// alike. nil: Pos.
	Rope []int32
	// Hidden, when its length is len(Tokens)·NEmbd, receives every row's
	// final hidden state (after the output norm, the output head's
	// input): the features Medusa heads and EAGLE drafts predict from.
	Hidden []float32
}

// RopePos is row i's rotary position.
func (b *Batch) RopePos(i int) int {
	if b.Rope != nil {
		return int(b.Rope[i])
	}
	return int(b.Pos[i])
}

// KVPlan is a step's paged-KV addressing as plain data: what a KV storage
// on another process needs to store and attend the step's rows without
// the manager's sequence tables. Rows fall into runs, consecutive rows of
// one sequence.
type KVPlan struct {
	// Runs: the first row of each run, and an end sentinel (len(Tokens)).
	Runs []int32
	// Tables holds each run's block table (its sequence's physical pages
	// by logical block, -1 for a block a policy released): run r's is
	// Tables[TableOff[r]:TableOff[r+1]].
	TableOff, Tables []int32
	// Slots is the slot mapping: each row's page·BlockSize + offset.
	Slots []int32
	// Spans are the positions each row may attend, per layer group, as
	// [From, To) pairs: group g, row i's pairs are
	// Spans[2·SpanOff[g·(T+1)+i] : 2·SpanOff[g·(T+1)+i+1]].
	SpanOff, Spans []int32
	// Notes are the manager's changes since the previous step that the
	// storage's side must follow, in the order they were made: page
	// copies, and what policies keeping state there (H2O's scores,
	// SnapKV's votes, Quest's key bounds) must hear of a sequence.
	Notes []KVNote
}

// Reset empties p, keeping its memory.
func (p *KVPlan) Reset() {
	p.Runs, p.TableOff, p.Tables, p.Slots, p.SpanOff, p.Spans = p.Runs[:0], p.TableOff[:0], p.Tables[:0], p.Slots[:0], p.SpanOff[:0], p.Spans[:0]
	p.Notes = p.Notes[:0]
}

// KVOp is what a KVNote says happened.
type KVOp uint8

// The notes a KV manager sends its storage.
const (
	// NoteCopy: page N was copied into page Seq (copy-on-write of a
	// shared block), every layer.
	NoteCopy KVOp = iota + 1
	// NoteBind: sequence Seq runs the policy Policy (its configuration
	// string) until it is freed.
	NoteBind
	// NotePrompt: Seq's prompt is its first N tokens.
	NotePrompt
	// NoteCommit: Seq has computed its first N tokens; Table is its block
	// table then.
	NoteCommit
	// NoteTruncate: Seq keeps its first N tokens.
	NoteTruncate
	// NoteFork: sequence N starts as a copy of Seq.
	NoteFork
	// NoteFree: Seq is gone.
	NoteFree
)

// KVNote is one change a KV manager made that its storage, on another
// process, must follow.
type KVNote struct {
	Op     KVOp
	Seq, N int32
	Policy string
	Table  []int32
}

// KVReport is what the storage's side of a stateful policy decided for
// one sequence, which the manager acts on: the blocks every layer and
// head has evicted (their pages may return to the pool) and the first
// position whose K/V were computed over an evicted history (blocks from
// there stay out of the prefix cache).
type KVReport struct {
	Seq int32
	// Sealed is that position, or -1 for none.
	Sealed int32
	// Dead holds [From, To) pairs of logical blocks, ascending.
	Dead []int32
}

// AttnParams describes the attention of one layer.
type AttnParams struct {
	NHead, NKVHead, HeadDim int
	Scale                   float32
	// Window > 0 limits attention to the last Window positions (Mistral
	// sliding window); 0 is full causal attention.
	Window int
}

// KVCache stores keys and values and runs attention over them. Begin
// prepares a batch once per forward pass (slots, block lists, what each
// row may see), so Store and Attend address rows of that batch and look
// nothing up per token and layer. The model writes K/V for a row before it
// attends from that row, so the query of row i sees positions [0, Pos[i]]
// of its sequence (less the window). Implementations: a contiguous
// float32 cache (NewFlatCache) for single runs, and the paged cache of
// package kvcache for the serving engine.
type KVCache interface {
	// Begin prepares for a forward pass over b, and reports an error when
	// some row has no room in the cache.
	Begin(b *Batch) error
	// Store writes the keys and values (NKVHead·HeadDim floats each) of
	// batch row row, layer layer.
	Store(layer, row int, k, v []float32)
	// Attend computes, for the rows [lo, hi) of the batch — consecutive
	// positions of one sequence — and each query head h of their rows of
	// q (NHead·HeadDim floats per row), out[h] = Σ_t softmax_t(Scale·q_h·k_t) v_t
	// over the positions t the row sees, with GQA head sharing
	// kv head = h / (NHead/NKVHead). q and out hold hi-lo rows.
	Attend(layer, lo, hi int, q, out []float32, p AttnParams)
}
