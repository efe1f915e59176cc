package model

import (
	"fmt"

	"pagoda/arch"
	"pagoda/kernels"
	"pagoda/quant"
)

// Shard is the part of a full weight one tensor-parallel rank holds: the
// rows [Lo, Hi) of Full (a Column or Vocab split: output rows) or its
// columns [Lo, Hi) (a Row split: input columns). On one process every
// weight is the whole: Rank 0 of Ranks 1, [0, Full).
type Shard struct {
	Axis        arch.Split
	Rank, Ranks int
	Lo, Hi      int
	Full        int
}

// shardOf is rank's contiguous range of full along axis: equal parts,
// the first ranks one larger when full does not divide (vocabularies).
func shardOf(axis arch.Split, full, rank, ranks int) Shard {
	if ranks <= 1 || axis == arch.Replicated {
		return Shard{Axis: axis, Rank: rank, Ranks: max(ranks, 1), Hi: full, Full: full}
	}
	return Shard{Axis: axis, Rank: rank, Ranks: ranks, Lo: rank * full / ranks, Hi: (rank + 1) * full / ranks, Full: full}
}

// Linear is one projection y = x·Wᵀ + bias (+ Scale·B·A·x with an
// adapter) as a rank holds it: W is its shard of the full matrix in the
// stored format (any type the kernels run), Bias its part of the bias (a
// column-parallel layer's rows; a row-parallel layer's whole bias, which
// only rank 0 adds so the all-reduce counts it once).
type Linear struct {
	W     *kernels.Matrix
	Bias  []float32
	Shard Shard
	// LoRA is an optional low-rank adapter, nil when none.
	LoRA *LoRA
}

// LoRA is a low-rank adapter y += Scale·B·(A·x), in F32: A is r × in and
// B out × r over this rank's shard (a column-parallel layer's B holds its
// output rows, a row-parallel layer's A its input columns; each rank's
// B·A·x is then a partial the all-reduce sums, as the base product's).
type LoRA struct {
	A, B  *kernels.Matrix
	Scale float32
}

// In and Out are the full matrix's input and output widths.
func (l *Linear) In() int {
	if l.Shard.Axis == arch.Row {
		return l.Shard.Full
	}
	return l.W.Cols
}

// Out is the full matrix's output width (see In).
func (l *Linear) Out() int {
	if l.Shard.Axis == arch.Column || l.Shard.Axis == arch.Vocab {
		return l.Shard.Full
	}
	return l.W.Rows
}

// Attach gives the layer an adapter from the full (unsharded) matrices: a
// is r × In() and b Out() × r, row-major; scale is alpha/r as the adapter's
// config gives it. The layer keeps only its shard's part. A nil a and b
// detach.
func (l *Linear) Attach(a, b []float32, r int, scale float32) error {
	if a == nil && b == nil {
		l.LoRA = nil
		return nil
	}
	in, out := l.In(), l.Out()
	if r <= 0 || len(a) != r*in || len(b) != out*r {
		return fmt.Errorf("adapter: A has %d values and B %d, want rank %d × %d and %d × %d", len(a), len(b), r, in, out, r)
	}
	sh := l.Shard
	switch sh.Axis {
	case arch.Column, arch.Vocab:
		b = b[sh.Lo*r : sh.Hi*r]
	case arch.Row:
		part := make([]float32, 0, r*(sh.Hi-sh.Lo))
		for i := 0; i < r; i++ {
			part = append(part, a[i*in+sh.Lo:i*in+sh.Hi]...)
		}
		a = part
	}
	l.LoRA = &LoRA{A: f32Matrix(a, r, len(a)/r), B: f32Matrix(b, len(b)/r, r), Scale: scale}
	return nil
}

// shardMatrix cuts rank's shard out of a whole bound matrix. A Column or
// Vocab split takes whole rows, a view of the same bytes (of a mapped
// file, only the shard's pages are ever read). A Row split takes a range
// of every row's columns, copied, which for a block-quantized type must
// fall on block boundaries.
func shardMatrix(name string, m *kernels.Matrix, sh Shard) (*kernels.Matrix, error) {
	switch sh.Axis {
	case arch.Column, arch.Vocab:
		if sh.Lo == 0 && sh.Hi == m.Rows {
			return m, nil
		}
		v := *m
		v.Rows, v.Data = sh.Hi-sh.Lo, m.Data[sh.Lo*m.RowBytes:sh.Hi*m.RowBytes:sh.Hi*m.RowBytes]
		return kernels.NewMatrix(v.Type, v.Rows, v.Cols, v.Data)
	case arch.Row:
		if sh.Lo == 0 && sh.Hi == m.Cols {
			return m, nil
		}
		if m.Perm != nil || !m.Type.Known() {
			return nil, fmt.Errorf("tensor %q: a %s matrix cannot be split by columns for tensor parallelism", name, m.Type)
		}
		bs := m.Type.BlockSize()
		if sh.Lo%bs != 0 || sh.Hi%bs != 0 {
			return nil, fmt.Errorf("tensor %q: %s blocks hold %d columns, so its %d columns do not split across %d ranks on block boundaries (rank %d would start at column %d)",
				name, m.Type, bs, m.Cols, sh.Ranks, sh.Rank, sh.Lo)
		}
		off, err := quant.RowSize(m.Type, sh.Lo)
		if err != nil {
			return nil, fmt.Errorf("tensor %q: %v", name, err)
		}
		rb, err := quant.RowSize(m.Type, sh.Hi-sh.Lo)
		if err != nil {
			return nil, fmt.Errorf("tensor %q: %v", name, err)
		}
		data := make([]byte, m.Rows*rb)
		for r := 0; r < m.Rows; r++ {
			copy(data[r*rb:(r+1)*rb], m.Data[r*m.RowBytes+off:])
		}
		return kernels.NewMatrix(m.Type, m.Rows, sh.Hi-sh.Lo, data)
	}
	return m, nil
}

// project runs a projection whose output feeds the residual stream: a
// row-parallel layer's partial sums are all-reduced here, so every rank
// adds the whole.
func (m *Model) project(l *Linear, x, out []float32, rows int) {
	m.be.MatMul(l, x, out, rows)
	if l.Shard.Axis == arch.Row && l.Shard.Ranks > 1 {
		m.be.AllReduce(out[:rows*l.W.Rows])
	}
}

// logits runs the output head: with a vocab-split head each rank computes
// its slice of the vocabulary and the slices are gathered.
func (m *Model) logits(x, out []float32, rows int) {
	o := &m.W.out
	if o.Shard.Axis != arch.Vocab || o.Shard.Ranks <= 1 {
		m.be.MatMul(o, x, out, rows)
		return
	}
	m.buf.part = grow(m.buf.part, rows*o.W.Rows)
	m.be.MatMul(o, x, m.buf.part, rows)
	m.be.AllGather(m.buf.part, out, rows)
}
