//go:build amd64 && !purego

package kernels

// addZeroFix adds Σ_b zfix[r,b]·dx·Σq to out for a packed GQ8 product, as
// one small float product (rows × blocks by blocks × batch): the
// activation statistics hold c = 128·dx·Σq per block (act.go).
func (o *Ops) addZeroFix(p *Pool, pk *packed, a *actBuf, out []float32, rows, batch int) {
	nb := pk.nb
	cb, tb := gatherPool.Get().(*[]float32), gatherPool.Get().(*[]float32)
	defer gatherPool.Put(cb)
	defer gatherPool.Put(tb)
	c, tmp := growF32(cb, batch*nb), growF32(tb, batch*rows)
	for b := 0; b < batch; b++ {
		t, n := b/actTile, b%actTile
		nt := min(actTile, batch-t*actTile)
		st := a.st[t*actTile*nb*2:]
		for blk := 0; blk < nb; blk++ {
			c[b*nb+blk] = st[(blk*nt+n)*2+1] * (1.0 / 128)
		}
	}
	o.matMulFloat(p, pk.zfix, c, tmp, batch)
	for i, v := range tmp {
		out[i] += v
	}
}
