package model

import (
	"fmt"

	"pagoda/arch"
	"pagoda/kernels"
)

// tpRank is which rank of how many tensor-parallel ranks a model is; the
// zero value (or ranks 1) is the whole model on one process.
type tpRank struct {
	rank, ranks int
	// kv, when set, is the K/V rows this rank holds where the model has
	// fewer KV heads than ranks: the one KV head its query heads share,
	// replicated on every rank that needs it (as vLLM does).
	kv *Shard
}

// newTPRank is the rank o asks for, checked against c.
func newTPRank(c *Config, o Options) (tpRank, error) {
	tp := tpRank{rank: o.Rank, ranks: max(o.Ranks, 1)}
	if err := checkTP(c, tp); err != nil {
		return tp, err
	}
	if tp.ranks > 1 && o.Group == nil {
		return tp, fmt.Errorf("tensor parallel: rank %d of %d needs a Group to reduce with", tp.rank, tp.ranks)
	}
	return tp.withKV(c), nil
}

// withKV is tp with its K/V rows set for c: when c has fewer KV heads
// than ranks, rank r's query heads all read KV head r/(ranks/NKVHead).
func (tp tpRank) withKV(c *Config) tpRank {
	if tp.ranks <= 1 || c.NKVHead >= tp.ranks || c.NKVHead <= 0 {
		return tp
	}
	h := tp.rank / (tp.ranks / c.NKVHead)
	tp.kv = &Shard{Axis: arch.Column, Rank: tp.rank, Ranks: tp.ranks, Lo: h * c.HeadDim, Hi: (h + 1) * c.HeadDim, Full: c.NKVHead * c.HeadDim}
	return tp
}

// kvRole is whether a tensor is a K or V projection or bias.
func kvRole(r arch.Role) bool {
	return r == arch.AttnK || r == arch.AttnV || r == arch.AttnKBias || r == arch.AttnVBias
}

// checkTP refuses the shapes the split cannot serve yet, with the reason,
// before anything is read.
func checkTP(c *Config, tp tpRank) error {
	r := tp.ranks
	if r <= 1 {
		return nil
	}
	switch {
	case tp.rank < 0 || tp.rank >= r:
		return fmt.Errorf("tensor parallel: rank %d out of range [0, %d)", tp.rank, r)
	case c.NExpert > 0 && c.MLA:
		return fmt.Errorf("tensor parallel: %s's mixture of experts and multi-head latent attention do not split yet (expert parallelism is not implemented; the latent KV cache has no heads to split)", c.Arch)
	case c.NExpert > 0:
		return fmt.Errorf("tensor parallel: mixture-of-experts models (%s) do not split yet (expert parallelism is not implemented)", c.Arch)
	case c.MLA:
		return fmt.Errorf("tensor parallel: multi-head latent attention (%s) does not split yet (the latent KV cache has no heads to split)", c.Arch)
	case c.QKNormFull:
		return fmt.Errorf("tensor parallel: %s's q/k norm spans all heads, which would need a reduce inside attention", c.Arch)
	case c.NHead%r != 0:
		return fmt.Errorf("tensor parallel: %d query heads do not split whole across %d ranks", c.NHead, r)
	case c.NKVHead < r && r%c.NKVHead != 0:
		return fmt.Errorf("tensor parallel: %d KV heads cannot be replicated evenly across %d ranks (the ranks must be a multiple of the KV heads)", c.NKVHead, r)
	case c.NKVHead >= r && c.NKVHead%r != 0:
		return fmt.Errorf("tensor parallel: %d KV heads do not split whole across %d ranks", c.NKVHead, r)
	case c.FFN < r:
		return fmt.Errorf("tensor parallel: feed-forward width %d is narrower than %d ranks", c.FFN, r)
	}
	return nil
}

// shardSlot replaces a whole bound tensor with rank's shard of it, by the
// split its declaration names. The token embedding splits by vocabulary
// like the output head (a tied head is the same shard): a rank looks up
// the tokens in its range and the ranks' rows are summed. A row
// split copies its columns, after which the whole tensor's file pages are
// given back (a source that maps its file).
func shardSlot(src source, t arch.Named, s slot, tp tpRank) error {
	switch t.Split {
	case arch.Replicated:
		return nil
	case arch.Expert:
		return fmt.Errorf("tensor %q: expert split not implemented", t.Name)
	}
	switch {
	case s.vec != nil && *s.vec != nil:
		if t.Split != arch.Column {
			return fmt.Errorf("tensor %q: a vector cannot take a %v split", t.Name, t.Split)
		}
		sh := tp.rangeOf(t, len(*s.vec))
		*s.vec = (*s.vec)[sh.Lo:sh.Hi:sh.Hi]
	case s.mat != nil && *s.mat != nil:
		m := *s.mat
		sh := tp.rangeOf(t, splitLen(t, m))
		sm, err := shardMatrix(t.Name, m, sh)
		if err != nil {
			return err
		}
		if rel, ok := src.(releaser); ok && t.Split == arch.Row && sm != m {
			rel.release(m.Data)
		}
		*s.mat = sm
	case s.stack != nil && *s.stack != nil:
		return fmt.Errorf("tensor %q: a stack cannot take a %v split", t.Name, t.Split)
	}
	return nil
}

// rangeOf is this rank's part of a tensor whose split axis is full long:
// its even share, or for a KV projection the KV heads it holds.
func (tp tpRank) rangeOf(t arch.Named, full int) Shard {
	if tp.kv != nil && kvRole(t.Role) {
		return *tp.kv
	}
	return shardOf(t.Split, full, tp.rank, tp.ranks)
}

// splitLen is the length of m's axis that t's split cuts: its rows
// (output features, vocabulary) or, for a row-parallel split, its columns.
func splitLen(t arch.Named, m *kernels.Matrix) int {
	if t.Split == arch.Row {
		return m.Cols
	}
	return m.Rows
}

// boundSlot is a tensor bound to the file, not yet cut to a rank's shard.
type boundSlot struct {
	t arch.Named
	s slot
}

// shardBytes is what the weight matrices of w will hold once the bound
// tensors are cut to this rank's shards (a split axis cut to [Lo, Hi)
// keeps that share of the bytes: shards are whole quantization blocks)
// and the combined MLA projections split.
func shardBytes(w *Weights, bound []boundSlot, tp tpRank) int64 {
	n := w.weightBytes()
	for _, l := range w.Layers {
		if l.KVB != nil {
			// An older file's combined MLA attn_kv_b becomes per-head
			// F32 KB and VB (splitKVB), its every value 4 bytes.
			n += int64(l.KVB.Rows) * int64(l.KVB.Cols) * 4
		}
	}
	if tp.ranks <= 1 {
		return n
	}
	for _, b := range bound {
		if b.s.mat == nil || *b.s.mat == nil || b.t.Split == arch.Replicated {
			continue
		}
		m := *b.s.mat
		full := splitLen(b.t, m)
		sh := tp.rangeOf(b.t, full)
		all := int64(len(m.Data))
		n += all*int64(sh.Hi-sh.Lo)/int64(full) - all
	}
	return n
}

// linears gives every dense layer its Linear projections over the bound
// (sharded) matrices; c is the full model's config, whose widths the
// shards are ranges of.
func (w *Weights) linears(c *Config, tp tpRank) {
	sh := func(axis arch.Split, full int) Shard { return shardOf(axis, full, tp.rank, tp.ranks) }
	qd, kvd := c.NHead*c.HeadDim, c.NKVHead*c.HeadDim
	for i := range w.Layers {
		l := &w.Layers[i]
		if l.Q != nil && l.K != nil && l.V != nil {
			l.q = Linear{W: l.Q, Bias: l.QBias, Shard: sh(arch.Column, qd)}
			kvs := sh(arch.Column, kvd)
			if tp.kv != nil {
				kvs = *tp.kv
			}
			l.k = Linear{W: l.K, Bias: l.KBias, Shard: kvs}
			l.v = Linear{W: l.V, Bias: l.VBias, Shard: kvs}
			l.qkv = []*Linear{&l.q, &l.k, &l.v}
		}
		if l.O != nil {
			l.o = Linear{W: l.O, Shard: sh(arch.Row, l.O.Cols*max(tp.ranks, 1))}
		}
		if l.Up != nil && l.Down != nil {
			l.up = Linear{W: l.Up, Shard: sh(arch.Column, c.FFN)}
			l.down = Linear{W: l.Down, Shard: sh(arch.Row, c.FFN)}
			if l.Gate != nil {
				l.gate = Linear{W: l.Gate, Shard: sh(arch.Column, c.FFN)}
				l.gateUp = []*Linear{&l.gate, &l.up}
			}
		}
	}
	w.out = Linear{W: w.Output, Shard: sh(arch.Vocab, c.VocabSize)}
	w.embd = sh(arch.Vocab, c.VocabSize)
}

// localize turns the full model's config into what one rank computes: its
// heads and its slice of the feed-forward width (the residual stream and
// the vocabulary stay whole).
func (c *Config) localize(tp tpRank) {
	if tp.ranks <= 1 {
		return
	}
	c.NHead /= tp.ranks
	c.NKVHead = max(1, c.NKVHead/tp.ranks)
	ffn := shardOf(arch.Column, c.FFN, tp.rank, tp.ranks)
	c.FFN = ffn.Hi - ffn.Lo
}
