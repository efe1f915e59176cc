package spec

import (
	"fmt"
	"math"
	"slices"

	"pagoda/executor"
	"pagoda/kvcache"
	"pagoda/model"
	"pagoda/sample"
	"pagoda/tokenizer"
)

// Forwarder is what a draft model must do: *model.Model does it. The
// draft reaches it through an executor over the draft's own KV cache.
type Forwarder = executor.Forwarder

// DraftOptions configure a draft-model proposer.
type DraftOptions struct {
	// TargetVocab is the target's vocabulary size: the length of a q row.
	TargetVocab int
	// PMin stops a sequence's drafting at the first token whose
	// probability under the draft (its plain softmax) is below PMin: the
	// draft is unsure, and verifying the guess would likely be wasted.
	// 0 never stops early.
	PMin float32
	// BlockSize and KVBlocks size the draft's own paged KV cache; 0 means
	// 16 tokens a block and KVBytes' worth of blocks.
	BlockSize, KVBlocks int
	KVBytes             int64 // 0 = 64 MiB
	KVDType             kvcache.DType
}

// Draft proposes with a small model that shares the target's vocabulary.
// It keeps its own paged KV cache of every speculating sequence's tokens
// and runs one batched forward pass per draft position across all the
// sequences of a step. When the target rejects drafts, the stale K/V is
// truncated (at Truncate, and again whenever the tokens it holds stop
// being a prefix of the sequence).
type Draft struct {
	ex        executor.Executor
	ctx, vd   int // the draft's context length and vocabulary size
	vt        int
	pmin      float32
	kv        *kvcache.Cache
	seqs      map[int32][]int32 // the tokens whose K/V the cache holds, per sequence
	batch     executor.StepInput
	scratch   []float32
	scratchEx []float64
}

// NewDraft makes a draft-model proposer of m for a target whose
// vocabulary is target, checking that they are compatible.
func NewDraft(m *model.Model, target *tokenizer.Vocab, o DraftOptions) (*Draft, error) {
	dv := m.Tokenizer().Vocab()
	if err := CheckVocab(target, dv); err != nil {
		return nil, err
	}
	return NewDraftFrom(m, m.Config, o)
}

// NewDraftFrom makes a draft-model proposer of any forwarder with config c
// (its shape, vocabulary size and context), without a vocabulary check:
// the caller vouches that the ids mean the same tokens.
func NewDraftFrom(fw Forwarder, c model.Config, o DraftOptions) (*Draft, error) {
	if o.TargetVocab <= 0 {
		return nil, fmt.Errorf("spec: draft: target vocabulary size %d", o.TargetVocab)
	}
	if o.PMin < 0 || o.PMin > 1 || o.PMin != o.PMin {
		return nil, fmt.Errorf("spec: draft: p-min %v must be in [0, 1]", o.PMin)
	}
	nkv, kd, vd := c.KVShape()
	kc := kvcache.Config{
		NLayer: c.NLayer, NKVHead: nkv, HeadDim: kd,
		BlockSize: o.BlockSize, NumBlocks: o.KVBlocks, Bytes: o.KVBytes, DType: o.KVDType,
		Window: c.SlidingWindow,
	}
	if vd == 0 { // MLA: the latent K row serves as V too, as the engine stores it
		layers := make([]int, c.NLayer)
		for i := range layers {
			layers[i] = i
		}
		kc.Groups = []kvcache.GroupSpec{{Layers: layers, NKVHead: nkv, KDim: kd}}
	}
	if kc.NumBlocks == 0 && kc.Bytes == 0 {
		kc.Bytes = 64 << 20
	}
	kv, err := kvcache.New(kc)
	if err != nil {
		return nil, fmt.Errorf("spec: draft KV cache: %w", err)
	}
	return &Draft{ex: executor.NewLocal(fw, kv), ctx: c.ContextLen, vd: c.VocabSize, vt: o.TargetVocab, pmin: o.PMin, kv: kv, seqs: map[int32][]int32{}}, nil
}

// KV is the draft's cache (for leak checks and usage).
func (d *Draft) KV() *kvcache.Cache { return d.kv }

// Close releases the draft's KV pages; the engine proposing with it must
// have stopped.
func (d *Draft) Close() error { return d.kv.Close() }

// drafting is one sequence's state within a Propose call.
type drafting struct {
	r    *Req
	max  int
	hist []int32 // r.Tokens then the drafts so far
	row  int     // its logits row in the last pass; -1 when done
}

func (d *Draft) Propose(reqs []*Req) error {
	b := &d.batch
	b.Tokens, b.Pos, b.Seq, b.Logits = b.Tokens[:0], b.Pos[:0], b.Seq[:0], b.Logits[:0]
	var act []*drafting
	for _, r := range reqs {
		r.Draft, r.Probs = r.Draft[:0], r.Probs[:0]
		n := len(r.Tokens)
		mx := min(r.Max, d.ctx-n)
		if mx <= 0 || n == 0 {
			continue
		}
		have := d.seqs[r.ID]
		c := commonPrefix(have, r.Tokens)
		if c == n {
			c-- // the last token's logits are needed again
		}
		if c < len(have) {
			d.kv.Truncate(r.ID, c)
			have = have[:c]
		}
		if !d.kv.Allocate(r.ID, nil, c, n) {
			// The draft's cache is full: this sequence goes without
			// drafts (and gives its blocks back) until there is room.
			d.Free(r.ID)
			continue
		}
		for p := c; p < n; p++ {
			b.Tokens = append(b.Tokens, r.Tokens[p])
			b.Pos = append(b.Pos, int32(p))
			b.Seq = append(b.Seq, r.ID)
			b.Logits = append(b.Logits, p == n-1)
		}
		d.seqs[r.ID] = append(have, r.Tokens[c:]...)
		act = append(act, &drafting{r: r, max: mx, hist: append(make([]int32, 0, n+mx), r.Tokens...)})
	}
	for len(b.Tokens) > 0 {
		out, err := d.ex.Execute(b)
		logits := out.Logits
		if err != nil {
			for _, a := range act {
				d.Free(a.r.ID)
			}
			return fmt.Errorf("spec: draft model: %w", err)
		}
		if len(logits) != len(act)*d.vd {
			// Only sequences still drafting are in act here.
			return fmt.Errorf("spec: draft model returned %d logits for %d rows of %d", len(logits), len(act), d.vd)
		}
		for i, a := range act {
			d.kv.Commit(a.r.ID, d.seqs[a.r.ID], len(d.seqs[a.r.ID]), 0)
			a.row = i
		}
		b.Tokens, b.Pos, b.Seq, b.Logits = b.Tokens[:0], b.Pos[:0], b.Seq[:0], b.Logits[:0]
		next := act[:0]
		for _, a := range act {
			lg := logits[a.row*d.vd : (a.row+1)*d.vd]
			if !d.pick(a, lg) || len(a.r.Draft) == a.max {
				continue
			}
			pos := len(a.hist) - 1
			if !d.kv.Allocate(a.r.ID, nil, pos, pos+1) {
				continue
			}
			x := a.hist[pos]
			b.Tokens = append(b.Tokens, x)
			b.Pos = append(b.Pos, int32(pos))
			b.Seq = append(b.Seq, a.r.ID)
			b.Logits = append(b.Logits, true)
			d.seqs[a.r.ID] = append(d.seqs[a.r.ID], x)
			next = append(next, a)
		}
		act = next
	}
	return nil
}

// pick draws the next draft token of a from the draft's logits row lg,
// unless the draft's confidence is below p-min; false when a stops.
func (d *Draft) pick(a *drafting, lg []float32) bool {
	n := min(d.vd, d.vt)
	lg = lg[:n] // ids the target does not have are never proposed
	r := a.r
	if d.pmin > 0 {
		if x := sample.Greedy(lg); d.softmaxAt(lg, x) < float64(d.pmin) {
			return false
		}
	}
	d.scratch = append(d.scratch[:0], lg...)
	var x int32
	var q []float32
	if r.Sampler == nil {
		x = sample.Greedy(d.scratch)
	} else {
		x, q = r.Sampler.SampleProbs(d.scratch, a.hist)
	}
	if q != nil && r.Sampler.Params().Temperature != 0 {
		row := len(r.Probs)
		r.Probs = slices.Grow(r.Probs, d.vt)[:row+d.vt]
		clear(r.Probs[row+copy(r.Probs[row:], q):])
	}
	r.Draft = append(r.Draft, x)
	a.hist = append(a.hist, x)
	return true
}

// softmaxAt is token x's probability under the plain softmax of lg.
func (d *Draft) softmaxAt(lg []float32, x int32) float64 {
	m := slices.Max(lg)
	var s float64
	for _, l := range lg {
		s += math.Exp(float64(l - m))
	}
	return math.Exp(float64(lg[x]-m)) / s
}

func (d *Draft) Truncate(id int32, n int) {
	if have, ok := d.seqs[id]; ok && len(have) > n {
		d.kv.Truncate(id, n)
		d.seqs[id] = have[:n]
	}
}

func (d *Draft) Free(id int32) {
	d.kv.Free(id)
	delete(d.seqs, id)
}

func commonPrefix(a, b []int32) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}
