package eagle

import (
	"math"

	"pagoda/kernels"
	"pagoda/train"
)

// A pass runs rows of draft input through the layer. Which earlier rows a
// row attends is given the way speculation trees are: a prefix of the
// sequence's cache (ctx[i] rows) plus the row's ancestors in a "tree
// area" of rows computed in this or earlier passes (par[r] is row r's
// parent there, -1 for none), itself included. A training batch is a tree
// area of chains (one per sequence, no cache); a sequence's catch-up over
// new features is one chain after its cache; an EAGLE-2 expansion step
// appends the frontier's rows to the area, each following its parent.

// pass holds one forward's activations, kept for the backward.
type pass struct {
	n                                  int
	xin, x, q, k, v, att, o, h1, hn, g []float32
	u, a, out                          []float32
	rstd                               []float32
	// backward scratch
	dx, dq, dk, dv, datt, dh1, dhn, dg, du, da, tmp []float32
	s1, s2                                          []float32
}

func grow(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n, n+n/4)
	}
	return s[:n]
}

func (p *pass) size(s Shape, n int) {
	d, qd, kvd := s.D, s.Heads*s.HeadDim, s.KVHeads*s.HeadDim
	p.n = n
	p.xin = grow(p.xin, n*2*d)
	p.x = grow(p.x, n*d)
	p.q = grow(p.q, n*qd)
	p.k = grow(p.k, n*kvd)
	p.v = grow(p.v, n*kvd)
	p.att = grow(p.att, n*qd)
	p.o = grow(p.o, n*d)
	p.h1 = grow(p.h1, n*d)
	p.hn = grow(p.hn, n*d)
	p.rstd = grow(p.rstd, n)
	p.g = grow(p.g, n*s.FFN)
	p.u = grow(p.u, n*s.FFN)
	p.a = grow(p.a, n*s.FFN)
	p.out = grow(p.out, n*d)
}

// The draft's matrices, indexing weights.q8.
const (
	mFC = iota
	mQ
	mK
	mV
	mO
	mGate
	mUp
	mDown
	nMats
)

// mul is matmul by one of the draft's matrices: its Q8_0 copy when the
// weights carry one (inference), else the float32 parameters (training).
func (w *weights) mul(pool *kernels.Pool, i int, out, x, f []float32, N, I, O int) {
	if w.q8 != nil && w.q8[i] != nil {
		kernels.MatMul(pool, w.q8[i], x[:N*I], out[:N*O], N)
		return
	}
	train.MatMul(pool, out, x, f, N, I, O)
}

// transpose writes dst (cols×rows) = srcᵀ (rows×cols).
func transpose(dst, src []float32, rows, cols int) {
	const blk = 32
	for r0 := 0; r0 < rows; r0 += blk {
		r1 := min(rows, r0+blk)
		for c0 := 0; c0 < cols; c0 += blk {
			c1 := min(cols, c0+blk)
			for r := r0; r < r1; r++ {
				row := src[r*cols : (r+1)*cols]
				for c := c0; c < c1; c++ {
					dst[c*rows+r] = row[c]
				}
			}
		}
	}
}

// backX sets dx (N×I) = dy (N×O) · w (O×I).
func (p *pass) backX(pool *kernels.Pool, dx, dy, w []float32, N, I, O int) {
	p.s1 = grow(p.s1, I*O)
	transpose(p.s1, w[:O*I], O, I)
	train.MatMul(pool, dx, dy, p.s1, N, O, I)
}

// backW adds dyᵀ (O×N) · x (N×I) to dw (O×I).
func (p *pass) backW(pool *kernels.Pool, dw, dy, x []float32, N, I, O int) {
	p.s1 = grow(p.s1, I*N)
	p.s2 = grow(p.s2, O*N)
	transpose(p.s1, x[:N*I], N, I)
	transpose(p.s2, dy[:N*O], N, O)
	p.tmp = grow(p.tmp, O*I)
	train.MatMul(pool, p.tmp, p.s2, p.s1, O, N, I)
	for i, v := range p.tmp {
		dw[i] += v
	}
}

// rope rotates one head's row at pos, backwards (by -pos) when inv: the
// adjoint of the rotation, which the backward pass needs.
func (d *Draft) rope(x []float32, pos int, inv bool) {
	n := len(d.freqs)
	if (pos+1)*n > len(d.cos) {
		d.ropeTable(pos + 1)
	}
	cs, sn := d.cos[pos*n:(pos+1)*n], d.sin[pos*n:(pos+1)*n]
	for i := range d.freqs {
		sf, cf := sn[i], cs[i]
		if inv {
			sf = -sf
		}
		a, b := 2*i, 2*i+1
		if d.neox {
			a, b = i, i+n
		}
		x0, x1 := x[a], x[b]
		x[a] = x0*cf - x1*sf
		x[b] = x0*sf + x1*cf
	}
}

// ropeTable extends the rotation table to cover positions below n
// (doubling, so that growth is rare).
func (d *Draft) ropeTable(n int) {
	n = max(n, 2*len(d.cos)/max(1, len(d.freqs)), 64)
	k := len(d.freqs)
	d.cos, d.sin = make([]float32, n*k), make([]float32, n*k)
	for p := range n {
		for i, f := range d.freqs {
			s, c := math.Sincos(float64(p) * float64(f))
			d.sin[p*k+i], d.cos[p*k+i] = float32(s), float32(c)
		}
	}
}

// forward runs p.n rows whose inputs p.xin (the [e; f] rows) are set.
// Row i is at position pos[i], sees ctx[i] rows of the cache (ck, cv) and
// its ancestors in the tree area (tk, tv, par), where it is row base+i:
// forward writes its K and V rows there. In training the area is p.k and
// p.v themselves (base 0).
func (d *Draft) forward(p *pass, w *weights, pos, ctx, par []int32, ck, cv, tk, tv []float32, base int) {
	s, n := d.Shape, p.n
	dd, qd, kvd := s.D, s.Heads*s.HeadDim, s.KVHeads*s.HeadDim
	pool := d.pool
	d.kvRows(p, w, pos, n)
	w.mul(pool, mQ, p.q, p.x, w.q, n, dd, qd)
	hd := s.HeadDim
	for i := range n {
		for h := range s.Heads {
			d.rope(p.q[i*qd+h*hd:i*qd+(h+1)*hd], int(pos[i]), false)
		}
	}
	if &tk[0] != &p.k[0] {
		copy(tk[base*kvd:(base+n)*kvd], p.k[:n*kvd])
		copy(tv[base*kvd:(base+n)*kvd], p.v[:n*kvd])
	}
	pool.For(n, 1, func(lo, hi int) {
		var sc []float32
		for i := lo; i < hi; i++ {
			c := int32(0)
			if ctx != nil {
				c = ctx[i]
			}
			sc = d.attendRow(p, i, c, par, ck, cv, tk, tv, base, sc)
		}
	})
	w.mul(pool, mO, p.o, p.att, w.o, n, qd, dd)
	for i := range p.h1[:n*dd] {
		p.h1[i] = p.x[i] + p.o[i]
	}
	for i := range n {
		x, out := p.h1[i*dd:(i+1)*dd], p.hn[i*dd:(i+1)*dd]
		var ss float64
		for _, v := range x {
			ss += float64(v) * float64(v)
		}
		r := float32(1 / math.Sqrt(ss/float64(dd)+float64(d.eps)))
		p.rstd[i] = r
		for j, v := range x {
			out[j] = v * r * w.norm[j]
		}
	}
	f := s.FFN
	w.mul(pool, mGate, p.g, p.hn, w.gate, n, dd, f)
	w.mul(pool, mUp, p.u, p.hn, w.up, n, dd, f)
	for i, g := range p.g[:n*f] {
		p.a[i] = g / (1 + float32(math.Exp(float64(-g)))) * p.u[i]
	}
	w.mul(pool, mDown, p.out, p.a, w.down, n, f, dd)
	for i := range p.out[:n*dd] {
		p.out[i] += p.h1[i]
	}
}

// kvRows computes the layer input p.x (the FC of xin) and the rotated K
// and V rows p.k, p.v of the pass's first n rows: all that a position
// leaves for later ones to attend. The layer has no input norm, so they
// need nothing else of the row.
func (d *Draft) kvRows(p *pass, w *weights, pos []int32, n int) {
	s := d.Shape
	dd, kvd, hd := s.D, s.KVHeads*s.HeadDim, s.HeadDim
	w.mul(d.pool, mFC, p.x, p.xin, w.fc, n, 2*dd, dd)
	for i := range n {
		row := p.x[i*dd : (i+1)*dd]
		for j, b := range w.fcb {
			row[j] += b
		}
	}
	w.mul(d.pool, mK, p.k, p.x, w.k, n, dd, kvd)
	w.mul(d.pool, mV, p.v, p.x, w.v, n, dd, kvd)
	for i := range n {
		for h := range s.KVHeads {
			d.rope(p.k[i*kvd+h*hd:i*kvd+(h+1)*hd], int(pos[i]), false)
		}
	}
}

// attendRow computes row i's attention output into p.att; sc is scratch.
func (d *Draft) attendRow(p *pass, i int, ctx int32, par []int32, ck, cv, tk, tv []float32, base int, sc []float32) []float32 {
	s := d.Shape
	hd, qd, kvd := s.HeadDim, s.Heads*s.HeadDim, s.KVHeads*s.HeadDim
	grp := s.Heads / s.KVHeads
	scale := float32(1 / math.Sqrt(float64(hd)))
	for h := range s.Heads {
		g := h / grp
		q := p.q[i*qd+h*hd : i*qd+(h+1)*hd]
		c := int(ctx)
		sc = grow(sc, c)
		if c > 0 {
			kernels.AttnScoresF32(sc, q, ck[g*hd:(c-1)*kvd+(g+1)*hd], kvd)
			for j := range sc {
				sc[j] *= scale
			}
		}
		for r := base + i; r >= 0; r = int(par[r]) {
			v := kernels.DotF32(q, tk[r*kvd+g*hd:r*kvd+(g+1)*hd]) * scale
			sc = append(sc, v)
		}
		kernels.Softmax(sc)
		out := p.att[i*qd+h*hd : i*qd+(h+1)*hd]
		clear(out)
		if c > 0 {
			kernels.AttnMixF32(out, sc[:c], cv[g*hd:(c-1)*kvd+(g+1)*hd], kvd)
		}
		j := c
		for r := base + i; r >= 0; r = int(par[r]) {
			axpy(out, sc[j], tv[r*kvd+g*hd:r*kvd+(g+1)*hd])
			j++
		}
	}
	return sc
}

func axpy(y []float32, a float32, x []float32) {
	for i, v := range x[:len(y)] {
		y[i] += a * v
	}
}

// backward adds the gradient of the loss to gw, given dout (p.n×D), the
// loss's gradient at the pass's outputs. Training passes only: no cache,
// the tree area is p.k/p.v.
func (d *Draft) backward(p *pass, w, gw *weights, dout []float32, pos, par []int32) {
	s, n := d.Shape, p.n
	dd, qd, kvd, f := s.D, s.Heads*s.HeadDim, s.KVHeads*s.HeadDim, s.FFN
	pool := d.pool
	p.dh1 = grow(p.dh1, n*dd)
	copy(p.dh1, dout[:n*dd])
	// MLP: out = h1 + down(silu(g)·u), g, u from hn = norm(h1).
	p.backW(pool, gw.down, dout, p.a, n, f, dd)
	p.da = grow(p.da, n*f)
	p.backX(pool, p.da, dout, w.down, n, f, dd)
	p.dg, p.du = grow(p.dg, n*f), grow(p.du, n*f)
	for i, g := range p.g[:n*f] {
		sg := 1 / (1 + float32(math.Exp(float64(-g))))
		si := g * sg
		p.du[i] = p.da[i] * si
		p.dg[i] = p.da[i] * p.u[i] * sg * (1 + g*(1-sg))
	}
	p.backW(pool, gw.gate, p.dg, p.hn, n, dd, f)
	p.backW(pool, gw.up, p.du, p.hn, n, dd, f)
	p.dhn = grow(p.dhn, n*dd)
	p.dx = grow(p.dx, n*dd)
	p.backX(pool, p.dhn, p.dg, w.gate, n, dd, f)
	p.backX(pool, p.dx, p.du, w.up, n, dd, f)
	for i := range n {
		x, dy, dn := p.h1[i*dd:(i+1)*dd], p.dhn[i*dd:(i+1)*dd], p.dx[i*dd:(i+1)*dd]
		r := p.rstd[i]
		var dot float32
		for j := range x {
			g := dy[j] + dn[j]
			gw.norm[j] += g * x[j] * r
			dot += g * w.norm[j] * x[j]
		}
		c := dot * r * r * r / float32(dd)
		dh := p.dh1[i*dd : (i+1)*dd]
		for j := range x {
			g := dy[j] + dn[j]
			dh[j] += g*w.norm[j]*r - c*x[j]
		}
	}
	// Attention: h1 = x + o(att).
	p.backW(pool, gw.o, p.dh1, p.att, n, qd, dd)
	p.datt = grow(p.datt, n*qd)
	p.backX(pool, p.datt, p.dh1, w.o, n, qd, dd)
	p.dq, p.dk, p.dv = grow(p.dq, n*qd), grow(p.dk, n*kvd), grow(p.dv, n*kvd)
	clear(p.dq)
	clear(p.dk)
	clear(p.dv)
	pool.For(s.KVHeads, 1, func(lo, hi int) {
		var sc []float32
		for g := lo; g < hi; g++ {
			sc = d.attendBack(p, g, par, sc)
		}
	})
	hd := s.HeadDim
	for i := range n {
		for h := range s.Heads {
			d.rope(p.dq[i*qd+h*hd:i*qd+(h+1)*hd], int(pos[i]), true)
		}
		for h := range s.KVHeads {
			d.rope(p.dk[i*kvd+h*hd:i*kvd+(h+1)*hd], int(pos[i]), true)
		}
	}
	p.backW(pool, gw.q, p.dq, p.x, n, dd, qd)
	p.backW(pool, gw.k, p.dk, p.x, n, dd, kvd)
	p.backW(pool, gw.v, p.dv, p.x, n, dd, kvd)
	// dx = dh1 + the three projections' input gradients.
	dx := p.dx
	copy(dx, p.dh1)
	p.dhn = grow(p.dhn, n*dd)
	for _, t := range []struct {
		dy, w []float32
		o     int
	}{{p.dq, w.q, qd}, {p.dk, w.k, kvd}, {p.dv, w.v, kvd}} {
		p.backX(pool, p.dhn, t.dy, t.w, n, dd, t.o)
		for i, v := range p.dhn {
			dx[i] += v
		}
	}
	p.backW(pool, gw.fc, dx, p.xin, n, 2*dd, dd)
	for i := range n {
		for j, v := range dx[i*dd : (i+1)*dd] {
			gw.fcb[j] += v
		}
	}
}

// attendBack is the attention backward of KV head g (and the query heads
// it serves) over all rows: from p.datt into p.dq, p.dk, p.dv.
func (d *Draft) attendBack(p *pass, g int, par []int32, sc []float32) []float32 {
	s := d.Shape
	hd, qd, kvd := s.HeadDim, s.Heads*s.HeadDim, s.KVHeads*s.HeadDim
	grp := s.Heads / s.KVHeads
	scale := float32(1 / math.Sqrt(float64(hd)))
	for i := range p.n {
		for h := g * grp; h < (g+1)*grp; h++ {
			q := p.q[i*qd+h*hd : i*qd+(h+1)*hd]
			da := p.datt[i*qd+h*hd : i*qd+(h+1)*hd]
			sc = sc[:0]
			mx := float32(math.Inf(-1))
			for r := i; r >= 0; r = int(par[r]) {
				v := kernels.DotF32(q, p.k[r*kvd+g*hd:r*kvd+(g+1)*hd]) * scale
				sc = append(sc, v)
				mx = max(mx, v)
			}
			var sum float32
			for j, v := range sc {
				e := float32(math.Exp(float64(v - mx)))
				sc[j] = e
				sum += e
			}
			// dp_j = da·v_j; ds_j = p_j(dp_j − Σ p dp).
			var pdp float32
			j := 0
			for r := i; r >= 0; r = int(par[r]) {
				sc[j] /= sum
				pdp += sc[j] * kernels.DotF32(da, p.v[r*kvd+g*hd:r*kvd+(g+1)*hd])
				j++
			}
			dq := p.dq[i*qd+h*hd : i*qd+(h+1)*hd]
			j = 0
			for r := i; r >= 0; r = int(par[r]) {
				vj := p.v[r*kvd+g*hd : r*kvd+(g+1)*hd]
				ds := sc[j] * (kernels.DotF32(da, vj) - pdp) * scale
				axpy(dq, ds, p.k[r*kvd+g*hd:r*kvd+(g+1)*hd])
				axpy(p.dk[r*kvd+g*hd:r*kvd+(g+1)*hd], ds, q)
				axpy(p.dv[r*kvd+g*hd:r*kvd+(g+1)*hd], sc[j], da)
				j++
			}
		}
	}
	return sc
}
