//go:build amd64 && !purego

package kernels

// The assembly is kvquant_amd64.s, written by gen_kvquant.go with its
// declarations in kvquant_stubs_amd64.go.

// blockAttnFor picks the assembly of the named instruction set, checked
// like the references so a bad layout panics rather than reads wild.
func blockAttnFor(isa string, f blockFmt) BlockAttn {
	scores, mix := blockAsm(isa, f)
	if scores == nil {
		return blockRef(f)
	}
	bb := blockFmtBytes[f]
	s4, m4 := blockAsm4(isa, f)
	return BlockAttn{
		scores4: s4, mix4: m4, bb: bb, rows: blockRowsAsm(isa, f),
		Scores: func(s, q []float32, k []byte, stride int) {
			checkBlockRows("Scores", len(s), len(q), len(k), stride, bb)
			if len(s) == 0 {
				return
			}
			if len(q) == 0 {
				clear(s)
				return
			}
			scores(&s[0], &q[0], &k[0], len(s), len(q)/32, stride)
		},
		Mix: func(out, w []float32, v []byte, stride int) {
			checkBlockRows("Mix", len(w), len(out), len(v), stride, bb)
			if len(w) == 0 || len(out) == 0 {
				return
			}
			mix(&w[0], &out[0], &v[0], len(w), len(out)/32, stride)
		},
	}
}

// planeAttnFor picks the AVX-512 or AVX2 plane kernels for rows of whole
// 16-byte chunks, and the references otherwise.
func planeAttnFor(isa string, bits int) PlaneAttn {
	ref := planeAttnRef(bits)
	scores, mix := planeAsm(isa, bits)
	if scores == nil {
		return ref
	}
	return PlaneAttn{
		Scores: func(s, planes []float32, codes []byte, stride int) {
			rb := len(planes) * bits / 8
			if rb%16 != 0 || rb == 0 {
				ref.Scores(s, planes, codes, stride)
				return
			}
			checkPlaneRows("Scores", len(s), len(planes), len(codes), stride, bits)
			if len(s) > 0 {
				scores(&s[0], &planes[0], &codes[0], len(s), rb/16, stride)
			}
		},
		Mix: func(planes, w []float32, codes []byte, stride int) {
			rb := len(planes) * bits / 8
			if rb%16 != 0 || rb == 0 {
				ref.Mix(planes, w, codes, stride)
				return
			}
			checkPlaneRows("Mix", len(w), len(planes), len(codes), stride, bits)
			if len(w) > 0 {
				mix(&w[0], &planes[0], &codes[0], len(w), rb/16, stride)
			}
		},
	}
}
