package eagle

import (
	"fmt"

	"pagoda/train"
)

// DepthAccuracy is the draft's top-1 agreement with the target's greedy
// next token on held, per depth 1..depths, as the draft runs at
// inference: depth 1 from the target's true features (the draft's KV holds
// the sequence up to the start), depth k from the draft's own predicted
// features of depths 1..k−1, the tokens fed being the sequence's. At a
// start j the depth-k prediction is of token j+k+1, compared with the
// argmax of the target's head on its feature at j+k.
func (d *Draft) DepthAccuracy(held *Data, depths int) ([]float64, error) {
	if err := d.ensureHead(); err != nil {
		return nil, err
	}
	s := d.Shape
	dd, V, kvd := s.D, s.Vocab, s.KVHeads*s.HeadDim
	hits, tot := make([]int, depths), make([]int, depths)
	var p, q pass
	var logits, tl []float32
	for si, seq := range held.Seqs {
		f := held.Feats[si]
		T := len(seq)
		if T < 2 {
			continue
		}
		n := T - 1
		p.size(s, n)
		pos, par, ctx := make([]int32, n), make([]int32, n), make([]int32, n)
		for j := range n {
			pos[j], par[j] = int32(j), int32(j-1)
			if err := d.embed(seq[j+1], p.xin[j*2*dd:j*2*dd+dd]); err != nil {
				return nil, err
			}
			copy(p.xin[j*2*dd+dd:(j+1)*2*dd], f[j*dd:(j+1)*dd])
		}
		d.forward(&p, &d.w, pos, ctx, par, nil, nil, p.k, p.v, 0)
		// The greedy tokens of the target at every position.
		tl = grow(tl, T*V)
		train.MatMul(d.pool, tl, f, d.headF, T, dd, V)
		want := make([]int, T)
		for j := range T {
			want[j] = argmax(tl[j*V : (j+1)*V])
		}
		prev := append([]float32(nil), p.out[:n*dd]...)
		ck, cv := append([]float32(nil), p.k[:n*kvd]...), append([]float32(nil), p.v[:n*kvd]...)
		tk, tv := make([]float32, depths*n*kvd), make([]float32, depths*n*kvd)
		tpar := make([]int32, depths*n)
		for k := 1; k <= depths; k++ {
			m := T - k // starts j in [0, T-k): token j+k+1 ≤ T... compared at feature j+k ≤ T-1
			if m <= 0 {
				break
			}
			logits = grow(logits, m*V)
			train.MatMul(d.pool, logits, prev, d.headF, m, dd, V)
			for j := range m {
				if argmax(logits[j*V:(j+1)*V]) == want[j+k] {
					hits[k-1]++
				}
				tot[k-1]++
			}
			if k == depths || T-k-1 <= 0 {
				break
			}
			// Next depth: starts j < T-k-1, row at position j+k fed token
			// j+k+1 and the predicted feature of j+k.
			m2 := T - k - 1
			q.size(s, m2)
			qpos, qctx := make([]int32, m2), make([]int32, m2)
			base := (k - 1) * n
			for j := range m2 {
				qpos[j], qctx[j] = int32(j+k), int32(j+1)
				if k == 1 {
					tpar[base+j] = -1
				} else {
					tpar[base+j] = int32((k-2)*n + j)
				}
				if err := d.embed(seq[j+k+1], q.xin[j*2*dd:j*2*dd+dd]); err != nil {
					return nil, err
				}
				copy(q.xin[j*2*dd+dd:(j+1)*2*dd], prev[j*dd:(j+1)*dd])
			}
			d.forward(&q, &d.w, qpos, qctx, tpar, ck, cv, tk, tv, base)
			prev = append(prev[:0], q.out[:m2*dd]...)
		}
	}
	acc := make([]float64, 0, depths)
	for k := range depths {
		if tot[k] == 0 {
			break
		}
		acc = append(acc, float64(hits[k])/float64(tot[k]))
	}
	if len(acc) == 0 {
		return nil, fmt.Errorf("eagle: held-out sequences too short to measure")
	}
	return acc, nil
}

// unigram is the held-out agreement of always guessing the target's most
// frequent greedy token on data: the baseline a draft must beat.
func (d *Draft) unigram(data, held *Data) float64 {
	s := d.Shape
	count := make([]int, s.Vocab)
	var tl []float32
	for i, seq := range data.Seqs {
		tl = grow(tl, len(seq)*s.Vocab)
		train.MatMul(d.pool, tl, data.Feats[i], d.headF, len(seq), s.D, s.Vocab)
		for j := range seq {
			count[argmax(tl[j*s.Vocab:(j+1)*s.Vocab])]++
		}
	}
	best := 0
	for t, c := range count {
		if c > count[best] {
			best = t
		}
	}
	hit, tot := 0, 0
	for i, seq := range held.Seqs {
		tl = grow(tl, len(seq)*s.Vocab)
		train.MatMul(d.pool, tl, held.Feats[i], d.headF, len(seq), s.D, s.Vocab)
		for j := 1; j < len(seq); j++ {
			if argmax(tl[j*s.Vocab:(j+1)*s.Vocab]) == best {
				hit++
			}
			tot++
		}
	}
	if tot == 0 {
		return 0
	}
	return float64(hit) / float64(tot)
}
