//go:build amd64 && !purego

package kernels

import (
	"sync"

	"golang.org/x/sys/cpu"
)

// gemmKernel multiplies one packed 16-row group (nb blocks) by one tile of
// quantized activations, writing 16 sums per tile row to out.
type gemmKernel func(w *byte, x *int8, st *float32, out *float32, nb int)

func init() {
	if cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VL && cpu.X86.HasAVX512VNNI {
		isaNames = append([]string{"avx512"}, isaNames...)
	}
	SetISA(isaNames[0])
}

func usesPacked() bool { return packedOn }

func setSIMD(name string) {
	packedOn = false
	switch name {
	case "avx512":
		packedOn = true
		matMul = matMulAVX512
		setFloatAVX512()
		setOpsAVX512()
	}
}

var actPool = sync.Pool{New: func() any { return new(actBuf) }}

func matMulAVX512(p *Pool, w *Matrix, x, out []float32, batch int) {
	pk := w.packedOf()
	if pk.kind == packNone {
		matMulFloatAVX512(p, w, x, out, batch)
		return
	}
	if batch <= 0 {
		return
	}
	_ = x[batch*w.Cols-1]
	_ = out[batch*w.Rows-1]
	a := actPool.Get().(*actBuf)
	defer actPool.Put(a)
	quantizeActs(p, pk, x, batch, w.Cols, a)

	var fns *[9]gemmKernel
	switch pk.kind {
	case packQ8C:
		fns = &gemmQ8CFns
	case packQ4C:
		fns = &gemmQ4CFns
	case packQ4SM:
		fns = &gemmQ4SMFns
	case packQ8S16:
		fns = &gemmQ8S16_Fns
	default:
		fns = &gemmSM16_Fns
	}
	cols, rows, nb := w.Cols, w.Rows, pk.nb
	tiles := (batch + actTile - 1) / actTile
	// Tiles of activations per pass over the weights: enough to reuse each
	// packed group from L1/L2 many times, few enough that the activation
	// chunk stays in L2.
	chunk := max(1, (256<<10)/(cols*actTile+1))
	p.For(pk.groups, 1, func(lo, hi int) {
		var tmp [actTile * 16]float32
		for t0 := 0; t0 < tiles; t0 += chunk {
			t1 := min(tiles, t0+chunk)
			for g := lo; g < hi; g++ {
				wp := &pk.data[g*pk.groupBytes]
				nr := min(16, rows-g*16)
				for t := t0; t < t1; t++ {
					r0 := t * actTile
					nt := min(actTile, batch-r0)
					fns[nt](wp, &a.q[r0*cols], &a.st[r0*nb*2], &tmp[0], nb)
					for n := 0; n < nt; n++ {
						copy(out[(r0+n)*rows+g*16:(r0+n)*rows+g*16+nr], tmp[16*n:16*n+nr])
					}
				}
			}
		}
	})
}
