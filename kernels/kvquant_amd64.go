//go:build amd64 && !purego

package kernels

// The assembly in kvquant_amd64.s: n rows of nb blocks, stride bytes apart.
// a is s (scores) or w (mix), b is q (scores) or out (mix).

//go:noescape
func scoresQ80AVX512(a, b *float32, k *byte, n, nb, stride int)

//go:noescape
func mixQ80AVX512(a, b *float32, k *byte, n, nb, stride int)

//go:noescape
func scoresQ40AVX512(a, b *float32, k *byte, n, nb, stride int)

//go:noescape
func mixQ40AVX512(a, b *float32, k *byte, n, nb, stride int)

//go:noescape
func scoresQ80AVX2(a, b *float32, k *byte, n, nb, stride int)

//go:noescape
func mixQ80AVX2(a, b *float32, k *byte, n, nb, stride int)

//go:noescape
func scoresQ40AVX2(a, b *float32, k *byte, n, nb, stride int)

//go:noescape
func mixQ40AVX2(a, b *float32, k *byte, n, nb, stride int)

// blockAttnFor picks the assembly of the named instruction set, checked
// like the references so a bad layout panics rather than reads wild.
func blockAttnFor(isa string, bb int) BlockAttn {
	var scores, mix func(a, b *float32, k *byte, n, nb, stride int)
	switch {
	case isa == "avx512" && bb == Q8_0Bytes:
		scores, mix = scoresQ80AVX512, mixQ80AVX512
	case isa == "avx512" && bb == Q4_0Bytes:
		scores, mix = scoresQ40AVX512, mixQ40AVX512
	case isa == "avx2" && bb == Q8_0Bytes:
		scores, mix = scoresQ80AVX2, mixQ80AVX2
	case isa == "avx2" && bb == Q4_0Bytes:
		scores, mix = scoresQ40AVX2, mixQ40AVX2
	default:
		return blockAttnRef(bb)
	}
	return BlockAttn{
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

//go:noescape
func scoresPlanes4AVX512(a, b *float32, k *byte, n, nb, stride int)

//go:noescape
func scoresPlanes2AVX512(a, b *float32, k *byte, n, nb, stride int)

//go:noescape
func mixPlanes4AVX512(a, b *float32, k *byte, n, nb, stride int)

//go:noescape
func mixPlanes2AVX512(a, b *float32, k *byte, n, nb, stride int)

// planeAttnFor picks the AVX-512 plane kernels for rows of whole 16-byte
// chunks, and the references otherwise.
func planeAttnFor(isa string, bits int) PlaneAttn {
	ref := planeAttnRef(bits)
	if isa != "avx512" {
		return ref
	}
	scores, mix := scoresPlanes4AVX512, mixPlanes4AVX512
	if bits == 2 {
		scores, mix = scoresPlanes2AVX512, mixPlanes2AVX512
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
