package kvcache

import (
	"errors"
	"fmt"

	"pagoda/model"
)

// The step's plan is the seam between the KV manager (block tables,
// policies' decisions) and the KV storage (pages, store, attend): Plan,
// on the manager's side, writes where every row of a batch lives and what
// it attends into a model.KVPlan; load, on the storage's side, reads only
// that plan and the batch's positions. A storage on another process gets
// the plan with the step and needs no sequence tables of its own.

// Begin implements model.KVCache: it loads the step's plan (b.KV, or one
// it makes with Plan when the batch carries none) into the storage, and
// lets the policies that keep state size it for the step.
func (c *Cache) Begin(b *model.Batch) error {
	pl := b.KV
	if pl == nil {
		if err := c.Plan(b.Pos, b.Seq, nil, &c.own); err != nil {
			return err
		}
		pl = &c.own
	}
	if len(c.layers) == 0 {
		return errors.New("kvcache: a KV manager without storage (NewManager) cannot run a step")
	}
	if err := c.load(b, pl); err != nil {
		return err
	}
	for gi, g := range c.groups {
		// Each policy that keeps state sizes it for its own sequences.
		if sp, ok := g.Policy.(stepper); ok {
			sp.beginStep(func(seq int32) bool { return !c.Policies.routed(gi) || c.Policies.bound[seq] == nil })
		}
		for _, bp := range c.Policies.policies {
			if sp, ok := bp.groups[gi].(stepper); ok && c.Policies.routed(gi) {
				sp.beginStep(func(seq int32) bool { return c.Policies.bound[seq] == bp })
			}
		}
	}
	return nil
}

// Plan resolves the slot of every row (positions pos of sequences seq, in
// batch order) through the block tables and asks each group's policy what
// every row attends, writing it into dst. It reports an error for a row
// the caller allocated no slot for, or whose block a policy released.
//
// A step that carries speculation trees gives parent: row i with
// parent[i] ≥ 0 is a tree node that attends what row parent[i] (an
// earlier row of its sequence, at a lower position) attends, and itself —
// the tree attention mask, over nodes stored at consecutive positions
// after the sequence. Rows with parent[i] < 0, and every row when parent
// is nil, attend as the policy says.
func (c *Cache) Plan(pos, seq, parent []int32, dst *model.KVPlan) error {
	if parent != nil && len(parent) != len(pos) {
		return fmt.Errorf("kvcache: %d tree parents for %d rows", len(parent), len(pos))
	}
	dst.Reset()
	var blocks []int32
	for i, p := range pos {
		id := seq[i]
		if i == 0 || seq[i-1] != id {
			t := c.tables[id]
			if t == nil {
				return fmt.Errorf("kvcache: sequence %d has no blocks", id)
			}
			blocks = t.blocks
			dst.Runs = append(dst.Runs, int32(i))
			dst.TableOff = append(dst.TableOff, int32(len(dst.Tables)))
			dst.Tables = append(dst.Tables, blocks...)
		}
		blk := int(p) / c.bs
		if p < 0 || blk >= len(blocks) {
			return fmt.Errorf("kvcache: sequence %d position %d outside its %d blocks", id, p, len(blocks))
		}
		if blocks[blk] == released {
			return fmt.Errorf("kvcache: sequence %d position %d is in a block released by the cache policy", id, p)
		}
		dst.Slots = append(dst.Slots, blocks[blk]*int32(c.bs)+p%int32(c.bs))
		if parent != nil && parent[i] >= 0 {
			if q := parent[i]; int(q) >= i || seq[q] != id || pos[q] >= p {
				return fmt.Errorf("kvcache: tree row %d (sequence %d position %d) has parent row %d", i, id, p, q)
			}
		}
	}
	dst.Runs = append(dst.Runs, int32(len(pos)))
	dst.TableOff = append(dst.TableOff, int32(len(dst.Tables)))
	for gi := range c.groups {
		if err := c.planSpans(gi, pos, seq, parent, dst); err != nil {
			return err
		}
	}
	if c.Link != nil {
		c.Link.Take(dst)
	}
	return nil
}

// planSpans writes group gi's spans of every row into dst.
func (c *Cache) planSpans(gi int, pos, seq, parent []int32, dst *model.KVPlan) error {
	T := len(pos)
	base := len(dst.SpanOff)
	dst.SpanOff = append(dst.SpanOff, int32(len(dst.Spans)/2))
	var spans []Span
	for i, p := range pos {
		if parent != nil && parent[i] >= 0 {
			// The parent's spans, then this node: every ancestor's
			// position and the sequence before the tree, nothing of the
			// siblings' branches.
			q := int(parent[i])
			a, e := 2*dst.SpanOff[base+q], 2*dst.SpanOff[base+q+1]
			dst.Spans = append(dst.Spans, dst.Spans[a:e]...)
			if n := len(dst.Spans); n > int(2*dst.SpanOff[base+i]) && dst.Spans[n-1] == p {
				dst.Spans[n-1] = p + 1
			} else {
				dst.Spans = append(dst.Spans, p, p+1)
			}
			dst.SpanOff = append(dst.SpanOff, int32(len(dst.Spans)/2))
			continue
		}
		pol := c.Policies.of(gi, seq[i])
		spans = pol.Visible(seq[i], int(p), spans[:0])
		for k, s := range spans {
			if s.From < 0 || s.To > int(p)+1 || s.From >= s.To || (k > 0 && s.From < spans[k-1].To) {
				return fmt.Errorf("kvcache: policy %T gives position %d of sequence %d the span %v", pol, p, seq[i], s)
			}
			dst.Spans = append(dst.Spans, int32(s.From), int32(s.To))
		}
		dst.SpanOff = append(dst.SpanOff, int32(len(dst.Spans)/2))
	}
	if len(dst.SpanOff)-base != T+1 {
		panic("kvcache: span offsets miscounted")
	}
	return nil
}

// load prepares the storage for a forward pass over b as pl plans it,
// checking that the plan addresses pages of this storage consistently
// (it may come from another process).
func (kv *Storage) load(b *model.Batch, pl *model.KVPlan) error {
	if kv.closed {
		return ErrClosed
	}
	T, G := len(b.Pos), len(kv.groups)
	nr := len(pl.Runs) - 1
	if nr < 0 || len(pl.TableOff) != nr+1 || len(pl.Slots) != T || len(pl.SpanOff) != G*(T+1) || pl.Runs[nr] != int32(T) {
		return fmt.Errorf("kvcache: a plan of %d runs, %d slots, %d span offsets for %d rows and %d layer groups",
			nr, len(pl.Slots), len(pl.SpanOff), T, G)
	}
	st := &kv.step
	st.rows, st.seqs = st.rows[:0], st.seqs[:0]
	npages := int32(kv.npages)
	for r := range nr {
		lo, hi := pl.Runs[r], pl.Runs[r+1]
		tl, th := pl.TableOff[r], pl.TableOff[r+1]
		if lo >= hi || tl > th || th > int32(len(pl.Tables)) {
			return fmt.Errorf("kvcache: plan run %d is malformed", r)
		}
		s := stepSeq{id: b.Seq[lo], blocks: pl.Tables[tl:th], maxHole: -1, rows: int(hi - lo)}
		for j, pg := range s.blocks {
			if pg < released || pg >= npages {
				return fmt.Errorf("kvcache: plan gives sequence %d page %d of %d", s.id, pg, npages)
			}
			if pg == released {
				s.maxHole = j
			}
		}
		for i := lo; i < hi; i++ {
			pos, slot := b.Pos[i], pl.Slots[i]
			blk := int(pos) / kv.bs
			if b.Seq[i] != s.id || pos < 0 || blk >= len(s.blocks) || s.blocks[blk] == released ||
				slot != s.blocks[blk]*int32(kv.bs)+pos%int32(kv.bs) {
				return fmt.Errorf("kvcache: plan row %d (sequence %d position %d) has slot %d outside its table", i, b.Seq[i], pos, slot)
			}
			st.rows = append(st.rows, stepRow{pos: pos, seq: int32(len(st.seqs)), page: slot / int32(kv.bs), slot: slot % int32(kv.bs)})
			kv.written[slot/int32(kv.bs)]++
		}
		st.seqs = append(st.seqs, s)
	}
	if len(st.vis) != G {
		st.vis = make([]groupVis, G)
	}
	for gi := range kv.groups {
		if err := kv.loadSpans(&st.vis[gi], pl, gi, b.Pos); err != nil {
			return err
		}
	}
	return nil
}

// loadSpans copies group gi's spans of the plan into v, checking that
// every row's spans are ordered and causal.
func (kv *Storage) loadSpans(v *groupVis, pl *model.KVPlan, gi int, pos []int32) error {
	T := len(pos)
	off := pl.SpanOff[gi*(T+1) : (gi+1)*(T+1)]
	v.off, v.spans = append(v.off[:0], 0), v.spans[:0]
	for i := range T {
		a, e := int(off[i]), int(off[i+1])
		if a > e || 2*e > len(pl.Spans) {
			return fmt.Errorf("kvcache: plan spans of row %d are malformed", i)
		}
		for k := a; k < e; k++ {
			s := Span{int(pl.Spans[2*k]), int(pl.Spans[2*k+1])}
			if s.From < 0 || s.To > int(pos[i])+1 || s.From >= s.To || (k > a && s.From < v.spans[len(v.spans)-1].To) {
				return fmt.Errorf("kvcache: plan gives position %d the span %v", pos[i], s)
			}
			v.spans = append(v.spans, s)
		}
		v.off = append(v.off, int32(len(v.spans)))
	}
	return nil
}
