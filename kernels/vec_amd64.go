//go:build amd64 && !purego

package kernels

import "unsafe"

//go:noescape
func dotF32AVX512(a *float32, b unsafe.Pointer, n int) float32

//go:noescape
func dotF16AVX512(a *float32, b unsafe.Pointer, n int) float32

//go:noescape
func dotBF16AVX512(a *float32, b unsafe.Pointer, n int) float32

//go:noescape
func axpyF32AVX512(out *float32, a float32, x unsafe.Pointer, n int)

//go:noescape
func axpyF16AVX512(out *float32, a float32, x unsafe.Pointer, n int)

//go:noescape
func axpyBF16AVX512(out *float32, a float32, x unsafe.Pointer, n int)

//go:noescape
func widenF16AVX512(dst *float32, src unsafe.Pointer, n int)

//go:noescape
func widenBF16AVX512(dst *float32, src unsafe.Pointer, n int)

//go:noescape
func narrowF16AVX512(dst unsafe.Pointer, src *float32, n int)

func f32ToF16Vec(dst []uint16, src []float32) {
	if len(dst) == 0 {
		return
	}
	_ = src[len(dst)-1]
	narrowF16AVX512(unsafe.Pointer(&dst[0]), &src[0], len(dst))
}

func f16ToF32Vec(dst []float32, src []uint16) {
	if len(dst) == 0 {
		return
	}
	_ = src[len(dst)-1]
	widenF16AVX512(&dst[0], unsafe.Pointer(&src[0]), len(dst))
}

func bf16ToF32Vec(dst []float32, src []uint16) {
	if len(dst) == 0 {
		return
	}
	_ = src[len(dst)-1]
	widenBF16AVX512(&dst[0], unsafe.Pointer(&src[0]), len(dst))
}

// The wrappers keep the references' bounds behaviour: the second operand
// must be at least as long as the first.

func dotF32Vec(a, b []float32) float32 {
	if len(a) == 0 {
		return 0
	}
	_ = b[len(a)-1]
	return dotF32AVX512(&a[0], unsafe.Pointer(&b[0]), len(a))
}

func dotF16Vec(q []float32, k []uint16) float32 {
	if len(q) == 0 {
		return 0
	}
	_ = k[len(q)-1]
	return dotF16AVX512(&q[0], unsafe.Pointer(&k[0]), len(q))
}

func dotBF16Vec(q []float32, k []uint16) float32 {
	if len(q) == 0 {
		return 0
	}
	_ = k[len(q)-1]
	return dotBF16AVX512(&q[0], unsafe.Pointer(&k[0]), len(q))
}

func axpyF32Vec(out []float32, a float32, x []float32) {
	if len(out) == 0 {
		return
	}
	_ = x[len(out)-1]
	axpyF32AVX512(&out[0], a, unsafe.Pointer(&x[0]), len(out))
}

func axpyF16Vec(out []float32, a float32, v []uint16) {
	if len(out) == 0 {
		return
	}
	_ = v[len(out)-1]
	axpyF16AVX512(&out[0], a, unsafe.Pointer(&v[0]), len(out))
}

func axpyBF16Vec(out []float32, a float32, v []uint16) {
	if len(out) == 0 {
		return
	}
	_ = v[len(out)-1]
	axpyBF16AVX512(&out[0], a, unsafe.Pointer(&v[0]), len(out))
}

//go:noescape
func scoresF32AVX512(s *float32, q *float32, kr unsafe.Pointer, n, d, stride int)

//go:noescape
func scoresF16AVX512(s *float32, q *float32, kr unsafe.Pointer, n, d, stride int)

//go:noescape
func scoresBF16AVX512(s *float32, q *float32, kr unsafe.Pointer, n, d, stride int)

//go:noescape
func mixF32AVX512(out *float32, w *float32, v unsafe.Pointer, n, d, stride int)

//go:noescape
func mixF16AVX512(out *float32, w *float32, v unsafe.Pointer, n, d, stride int)

//go:noescape
func mixBF16AVX512(out *float32, w *float32, v unsafe.Pointer, n, d, stride int)

//go:noescape
func scores4F32AVX512(s *float32, q *float32, kr unsafe.Pointer, n, d, stride, ss int)

//go:noescape
func scores4F16AVX512(s *float32, q *float32, kr unsafe.Pointer, n, d, stride, ss int)

//go:noescape
func scores4BF16AVX512(s *float32, q *float32, kr unsafe.Pointer, n, d, stride, ss int)

//go:noescape
func mix4F32AVX512(out *float32, w *float32, v unsafe.Pointer, n, d, stride, ws int)

//go:noescape
func mix4F16AVX512(out *float32, w *float32, v unsafe.Pointer, n, d, stride, ws int)

//go:noescape
func mix4BF16AVX512(out *float32, w *float32, v unsafe.Pointer, n, d, stride, ws int)

// Tiled attention (attntile.go).

//go:noescape
func tileKF32AVX512(kt *float32, kr unsafe.Pointer, stride, d int)

//go:noescape
func tileKF16AVX512(kt *float32, kr unsafe.Pointer, stride, d int)

//go:noescape
func tileKBF16AVX512(kt *float32, kr unsafe.Pointer, stride, d int)

//go:noescape
func scoresTile1AVX512(s *float32, off, ss int, q *float32, qs int, kt *float32, d, mask int)

//go:noescape
func scoresTile2AVX512(s *float32, off, ss int, q *float32, qs int, kt *float32, d, mask int)

//go:noescape
func scoresTile3AVX512(s *float32, off, ss int, q *float32, qs int, kt *float32, d, mask int)

//go:noescape
func scoresTile4AVX512(s *float32, off, ss int, q *float32, qs int, kt *float32, d, mask int)

//go:noescape
func scoresTile5AVX512(s *float32, off, ss int, q *float32, qs int, kt *float32, d, mask int)

//go:noescape
func scoresTile6AVX512(s *float32, off, ss int, q *float32, qs int, kt *float32, d, mask int)

//go:noescape
func scoresTile7AVX512(s *float32, off, ss int, q *float32, qs int, kt *float32, d, mask int)

//go:noescape
func scoresTile8AVX512(s *float32, off, ss int, q *float32, qs int, kt *float32, d, mask int)

//go:noescape
func mix5F32AVX512(out *float32, w *float32, v unsafe.Pointer, n, d, stride, ws int)

//go:noescape
func mix6F32AVX512(out *float32, w *float32, v unsafe.Pointer, n, d, stride, ws int)

//go:noescape
func mix7F32AVX512(out *float32, w *float32, v unsafe.Pointer, n, d, stride, ws int)

//go:noescape
func mix8F32AVX512(out *float32, w *float32, v unsafe.Pointer, n, d, stride, ws int)

//go:noescape
func mix5F16AVX512(out *float32, w *float32, v unsafe.Pointer, n, d, stride, ws int)

//go:noescape
func mix6F16AVX512(out *float32, w *float32, v unsafe.Pointer, n, d, stride, ws int)

//go:noescape
func mix7F16AVX512(out *float32, w *float32, v unsafe.Pointer, n, d, stride, ws int)

//go:noescape
func mix8F16AVX512(out *float32, w *float32, v unsafe.Pointer, n, d, stride, ws int)

//go:noescape
func mix5BF16AVX512(out *float32, w *float32, v unsafe.Pointer, n, d, stride, ws int)

//go:noescape
func mix6BF16AVX512(out *float32, w *float32, v unsafe.Pointer, n, d, stride, ws int)

//go:noescape
func mix7BF16AVX512(out *float32, w *float32, v unsafe.Pointer, n, d, stride, ws int)

//go:noescape
func mix8BF16AVX512(out *float32, w *float32, v unsafe.Pointer, n, d, stride, ws int)

//go:noescape
func mix1F32AVX512(out *float32, w *float32, v unsafe.Pointer, n, d, stride, ws int)

//go:noescape
func mix2F32AVX512(out *float32, w *float32, v unsafe.Pointer, n, d, stride, ws int)

//go:noescape
func mix3F32AVX512(out *float32, w *float32, v unsafe.Pointer, n, d, stride, ws int)

//go:noescape
func mix1F16AVX512(out *float32, w *float32, v unsafe.Pointer, n, d, stride, ws int)

//go:noescape
func mix2F16AVX512(out *float32, w *float32, v unsafe.Pointer, n, d, stride, ws int)

//go:noescape
func mix3F16AVX512(out *float32, w *float32, v unsafe.Pointer, n, d, stride, ws int)

//go:noescape
func mix1BF16AVX512(out *float32, w *float32, v unsafe.Pointer, n, d, stride, ws int)

//go:noescape
func mix2BF16AVX512(out *float32, w *float32, v unsafe.Pointer, n, d, stride, ws int)

//go:noescape
func mix3BF16AVX512(out *float32, w *float32, v unsafe.Pointer, n, d, stride, ws int)

// The exported wrappers have checked the bounds.

func scoresF32Vec(s, q, k []float32, stride int) {
	if len(s) > 0 && len(q) > 0 {
		scoresF32AVX512(&s[0], &q[0], unsafe.Pointer(&k[0]), len(s), len(q), 4*stride)
	} else {
		clear(s)
	}
}

func scoresF16Vec(s, q []float32, k []uint16, stride int) {
	if len(s) > 0 && len(q) > 0 {
		scoresF16AVX512(&s[0], &q[0], unsafe.Pointer(&k[0]), len(s), len(q), 2*stride)
	} else {
		clear(s)
	}
}

func scoresBF16Vec(s, q []float32, k []uint16, stride int) {
	if len(s) > 0 && len(q) > 0 {
		scoresBF16AVX512(&s[0], &q[0], unsafe.Pointer(&k[0]), len(s), len(q), 2*stride)
	} else {
		clear(s)
	}
}

func mixF32Vec(out, w, v []float32, stride int) {
	if len(w) > 0 && len(out) > 0 {
		mixF32AVX512(&out[0], &w[0], unsafe.Pointer(&v[0]), len(w), len(out), 4*stride)
	}
}

func mixF16Vec(out, w []float32, v []uint16, stride int) {
	if len(w) > 0 && len(out) > 0 {
		mixF16AVX512(&out[0], &w[0], unsafe.Pointer(&v[0]), len(w), len(out), 2*stride)
	}
}

func mixBF16Vec(out, w []float32, v []uint16, stride int) {
	if len(w) > 0 && len(out) > 0 {
		mixBF16AVX512(&out[0], &w[0], unsafe.Pointer(&v[0]), len(w), len(out), 2*stride)
	}
}

func setFloatAVX512(o *Ops) {
	o.attnScoresF32 = scoresF32Vec
	o.attnScoresF16 = scoresF16Vec
	o.attnScoresBF16 = scoresBF16Vec
	o.attnMixF32 = mixF32Vec
	o.attnMixF16 = mixF16Vec
	o.attnMixBF16 = mixBF16Vec
	o.h4 = heads4{scores4F32AVX512, scores4F16AVX512, scores4BF16AVX512, mix4F32AVX512, mix4F16AVX512, mix4BF16AVX512}
	o.tile = tiles{
		tileF32: tileKF32AVX512, tileF16: tileKF16AVX512, tileBF16: tileKBF16AVX512,
		scores: [9]func(s *float32, off, ss int, q *float32, qs int, kt *float32, d, mask int){nil,
			scoresTile1AVX512, scoresTile2AVX512, scoresTile3AVX512, scoresTile4AVX512,
			scoresTile5AVX512, scoresTile6AVX512, scoresTile7AVX512, scoresTile8AVX512},
	}
	o.tile.softmaxOnline = softmaxOnlineAVX512
	o.tile.mixF32[1], o.tile.mixF16[1], o.tile.mixBF16[1] = mix1F32AVX512, mix1F16AVX512, mix1BF16AVX512
	o.tile.mixF32[2], o.tile.mixF16[2], o.tile.mixBF16[2] = mix2F32AVX512, mix2F16AVX512, mix2BF16AVX512
	o.tile.mixF32[3], o.tile.mixF16[3], o.tile.mixBF16[3] = mix3F32AVX512, mix3F16AVX512, mix3BF16AVX512
	o.tile.mixF32[4], o.tile.mixF16[4], o.tile.mixBF16[4] = mix4F32AVX512, mix4F16AVX512, mix4BF16AVX512
	o.tile.mixF32[5], o.tile.mixF16[5], o.tile.mixBF16[5] = mix5F32AVX512, mix5F16AVX512, mix5BF16AVX512
	o.tile.mixF32[6], o.tile.mixF16[6], o.tile.mixBF16[6] = mix6F32AVX512, mix6F16AVX512, mix6BF16AVX512
	o.tile.mixF32[7], o.tile.mixF16[7], o.tile.mixBF16[7] = mix7F32AVX512, mix7F16AVX512, mix7BF16AVX512
	o.tile.mixF32[8], o.tile.mixF16[8], o.tile.mixBF16[8] = mix8F32AVX512, mix8F16AVX512, mix8BF16AVX512
	o.dotF32 = dotF32Vec
	o.dotF16 = dotF16Vec
	o.dotBF16 = dotBF16Vec
	o.axpyF32 = axpyF32Vec
	o.axpyF16 = axpyF16Vec
	o.axpyBF16 = axpyBF16Vec
	o.f16ToF32Row = f16ToF32Vec
	o.f32ToF16Row = f32ToF16Vec
	o.bf16ToF32Row = bf16ToF32Vec
}
