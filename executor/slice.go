package executor

import (
	"fmt"

	"pagoda/model"
)

// Slice is the step of rows [lo, hi) of in alone, with its KV plan cut to
// them: what a pipeline sends as one micro-batch. Its logits marks are
// explicit (a nil marks slice of in means its last row), so the slices'
// logits, concatenated in row order, are in's. Rows of one sequence may
// fall in two slices: run one after the other, the later rows find the
// earlier ones' K/V stored, as within one step. The slot moves go with
// the first slice (they precede every row), and so do the plan's notes;
// the rotary positions and the
// hidden-state request with each.
func (in *StepInput) Slice(lo, hi int) (*StepInput, error) {
	if err := in.check(); err != nil {
		return nil, err
	}
	T := len(in.Tokens)
	if lo < 0 || hi > T || lo >= hi {
		return nil, fmt.Errorf("executor: rows [%d, %d) of a step of %d", lo, hi, T)
	}
	out := &StepInput{Tokens: in.Tokens[lo:hi], Pos: in.Pos[lo:hi], Seq: in.Seq[lo:hi], Logits: make([]bool, hi-lo), Hidden: in.Hidden, TopK: in.TopK}
	if in.Rope != nil {
		out.Rope = in.Rope[lo:hi]
	}
	if lo == 0 {
		out.Moves = in.Moves
	}
	if in.Logits != nil {
		copy(out.Logits, in.Logits[lo:hi])
	} else if hi == T {
		out.Logits[hi-lo-1] = true
	}
	if in.KV != nil {
		p, err := slicePlan(in.KV, T, lo, hi)
		if err != nil {
			return nil, err
		}
		if lo == 0 {
			p.Notes = in.KV.Notes
		}
		out.KV = p
	}
	return out, nil
}

// slicePlan cuts a plan of T rows to rows [lo, hi): the runs that meet
// them (a run cut in two keeps its whole block table), their slots, and
// each layer group's spans.
func slicePlan(p *model.KVPlan, T, lo, hi int) (*model.KVPlan, error) {
	nr := len(p.Runs) - 1
	if nr < 0 || len(p.TableOff) != nr+1 || len(p.Slots) != T || len(p.SpanOff)%(T+1) != 0 {
		return nil, fmt.Errorf("executor: a KV plan of %d runs, %d slots, %d span offsets for %d rows", nr, len(p.Slots), len(p.SpanOff), T)
	}
	q := &model.KVPlan{Slots: p.Slots[lo:hi]}
	for r := range nr {
		a, b := int(p.Runs[r]), int(p.Runs[r+1])
		if b <= lo || a >= hi {
			continue
		}
		tl, th := p.TableOff[r], p.TableOff[r+1]
		if tl < 0 || tl > th || int(th) > len(p.Tables) {
			return nil, fmt.Errorf("executor: KV plan run %d is malformed", r)
		}
		q.Runs = append(q.Runs, int32(max(a, lo)-lo))
		q.TableOff = append(q.TableOff, int32(len(q.Tables)))
		q.Tables = append(q.Tables, p.Tables[tl:th]...)
	}
	q.Runs = append(q.Runs, int32(hi-lo))
	q.TableOff = append(q.TableOff, int32(len(q.Tables)))
	for g := range len(p.SpanOff) / (T + 1) {
		off := p.SpanOff[g*(T+1) : (g+1)*(T+1)]
		a, b := int(off[lo]), int(off[hi])
		if a < 0 || a > b || 2*b > len(p.Spans) {
			return nil, fmt.Errorf("executor: KV plan spans of group %d are malformed", g)
		}
		base := int32(len(q.Spans) / 2)
		for i := lo; i <= hi; i++ {
			q.SpanOff = append(q.SpanOff, base+off[i]-off[lo])
		}
		q.Spans = append(q.Spans, p.Spans[2*a:2*b]...)
	}
	return q, nil
}
