//go:build amd64 && !purego

package kernels

//go:noescape
func quantQ80AVX512(x *float32, nblk int, q *int8, qstride int, st *float32, ststride int, k float32)

//go:noescape
func quantQ8KAVX512(x *float32, nsb int, q *int8, qstride int, st *float32, ststride int, k float32, blk32, nodx bool)

// quantRowFast quantizes one activation row straight into its tile slots
// (see act.go) when an assembly quantizer fits the layout.
func quantRowFast(pk *packed, row []float32, q []int8, st []float32, n, nt int) bool {
	if len(row) == 0 {
		return false
	}
	switch {
	case pk.block == 32 && pk.act == actQ8_0:
		quantQ80AVX512(&row[0], len(row)/32, &q[n*32], nt*32, &st[n*2], nt*8, pk.k)
		return true
	case pk.act == actQ8_K:
		bs := pk.block
		quantQ8KAVX512(&row[0], len(row)/256, &q[n*bs], nt*bs, &st[n*2], nt*8, pk.k, bs == 32, pk.nodx)
		return true
	}
	return false
}
