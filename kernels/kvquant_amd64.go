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
