//go:build amd64 && !purego

package kernels

import (
	"sync"

	"golang.org/x/sys/cpu"
)

// gemmKernel multiplies one packed 16-row group (nb blocks) by one tile of
// quantized activations, writing 16 sums per tile row to out, the rows os
// bytes apart.
type gemmKernel func(w *byte, x *int8, st *float32, out *float32, nb, os int)

// gemmKernel2 is the AVX2 form: one 8-row half of a group, up to 4
// activation rows of a tile whose blocks are xs bytes (stats ss bytes) apart.
type gemmKernel2 func(w *byte, x *int8, st *float32, out *float32, nb, half, xs, ss int)

// availableISAs builds one kernel set per instruction set the CPU has, best
// first.
func availableISAs() []*Ops {
	sets := []*Ops{newGeneric()}
	if cpu.X86.HasAVX2 && cpu.X86.HasFMA && cpu.X86.HasF16C {
		sets = append([]*Ops{newSIMD("avx2")}, sets...)
	}
	if cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VL && cpu.X86.HasAVX512VNNI {
		sets = append([]*Ops{newSIMD("avx512")}, sets...)
	}
	return sets
}

// newSIMD is the named set: the references with the accelerated kernels
// swapped in.
func newSIMD(name string) *Ops {
	o := newGeneric()
	o.name = name
	switch name {
	case "avx512":
		o.packed, o.asmQuant = true, true
		setFloatAVX512(o)
		setOpsAVX512(o)
		o.peak.loop = vnniPeakLoop
	case "avx2":
		o.packed, o.avx2 = true, true
		setFloatAVX2(o)
		setOpsAVX2(o)
	}
	o.rope = RoPE
	o.matMul = o.matMulPacked
	o.matMulN = o.matMulNPacked
	return o
}

var actPool = sync.Pool{New: func() any { return new(actBuf) }}

// mmJob is one packed matrix product of a (possibly shared) parallel region.
type mmJob struct {
	w    *Matrix
	pk   *packed
	a    *actBuf
	out  []float32
	fns  *[9]gemmKernel
	fns2 *[5]gemmKernel2
}

func kernels2For(k packKind) *[5]gemmKernel2 {
	switch k {
	case packQ8C:
		return &gemmQ8C_avx2
	case packQ4C:
		return &gemmQ4C_avx2
	case packQ4SM:
		return &gemmQ4SM_avx2
	case packQ8S16:
		return &gemmQ8S16_avx2
	}
	return &gemmSM16_avx2
}

func kernelsFor(k packKind) *[9]gemmKernel {
	switch k {
	case packQ8C:
		return &gemmQ8CFns
	case packQ4C:
		return &gemmQ4CFns
	case packQ4SM:
		return &gemmQ4SMFns
	case packQ8S16:
		return &gemmQ8S16_Fns
	case packQ4K:
		return &gemmQ4KFns
	case packQ6K:
		return &gemmQ6KFns
	case packQ5C:
		return &gemmQ5CFns
	case packQ5K:
		return &gemmQ5KFns
	}
	return &gemmSM16_Fns
}

func (o *Ops) matMulPacked(p *Pool, w *Matrix, x, out []float32, batch int) {
	if w.Perm != nil && batch > 0 {
		xp := gatherCols(w, x, batch)
		defer putGather(xp)
		x = *xp
	}
	pk := w.packedFor(o.avx2)
	if pk.kind == packNone {
		o.matMulFloat(p, w, x, out, batch)
		return
	}
	if batch <= 0 {
		return
	}
	_ = x[batch*w.Cols-1]
	_ = out[batch*w.Rows-1]
	a := actPool.Get().(*actBuf)
	defer actPool.Put(a)
	quantizeActs(p, pk, x, batch, w.Cols, a, o.asmQuant)
	jobs := [1]mmJob{{w, pk, a, out, kernelsFor(pk.kind), kernels2For(pk.kind)}}
	o.runJobs(p, jobs[:], batch)
	if pk.zfix != nil {
		o.addZeroFix(p, pk, a, out, w.Rows, batch)
	}
}

// matMulNPacked quantizes x once per activation format and runs all the
// packed products in one parallel region (one hand-off, balanced across
// matrices); float matrices go one by one.
func (o *Ops) matMulNPacked(p *Pool, ws []*Matrix, x []float32, outs [][]float32, batch int) {
	if batch <= 0 {
		return
	}
	var jobs []mmJob
	var bufs []*actBuf
	var sigs []*packed
	var perms [][]int32
	var gathered []*[]float32
	var gatheredBy [][]int32
	defer func() {
		for _, a := range bufs {
			actPool.Put(a)
		}
		for _, g := range gathered {
			putGather(g)
		}
	}()
	x0 := x
	for i, w := range ws {
		x := x0
		if w.Perm != nil {
			// Matrices of one input share one act-order permutation
			// (the loader dedupes them): gather once per permutation.
			x = nil
			for j, g := range gathered {
				if samePerm(gatheredBy[j], w.Perm) {
					x = *g
				}
			}
			if x == nil {
				xp := gatherCols(w, x0, batch)
				gathered = append(gathered, xp)
				gatheredBy = append(gatheredBy, w.Perm)
				x = *xp
			}
		}
		pk := w.packedFor(o.avx2)
		if pk.kind == packNone {
			o.matMulFloat(p, w, x, outs[i], batch)
			continue
		}
		_ = x[batch*w.Cols-1]
		_ = outs[i][batch*w.Rows-1]
		var a *actBuf
		for j, s := range sigs {
			if s.act == pk.act && s.block == pk.block && s.k == pk.k && s.nodx == pk.nodx && samePerm(perms[j], w.Perm) {
				a = bufs[j]
			}
		}
		if a == nil {
			a = actPool.Get().(*actBuf)
			quantizeActs(p, pk, x, batch, w.Cols, a, o.asmQuant)
			bufs = append(bufs, a)
			sigs = append(sigs, pk)
			perms = append(perms, w.Perm)
		}
		jobs = append(jobs, mmJob{w, pk, a, outs[i], kernelsFor(pk.kind), kernels2For(pk.kind)})
	}
	if len(jobs) > 0 {
		o.runJobs(p, jobs, batch)
	}
	for _, j := range jobs {
		if j.pk.zfix != nil {
			o.addZeroFix(p, j.pk, j.a, j.out, j.w.Rows, batch)
		}
	}
}

func (o *Ops) runJobs(p *Pool, jobs []mmJob, batch int) {
	total := 0
	for _, j := range jobs {
		total += j.pk.groups
	}
	tiles := (batch + actTile - 1) / actTile
	// Tiles of activations per pass over the weights: enough to reuse each
	// packed group from L1/L2 many times, few enough that the activation
	// chunk stays in L2.
	chunk := max(1, (256<<10)/(jobs[0].w.Cols*actTile+1))
	avx2 := o.avx2
	p.For(total, 1, func(lo, hi int) {
		// A scratch tile, for the AVX2 kernels and a matrix's last, partial
		// group only: it escapes (the kernels are called through function
		// values), so a tile declared here would be a heap allocation per
		// piece, on every decode step.
		var tmp *[actTile * 16]float32
		for t0 := 0; t0 < tiles; t0 += chunk {
			t1 := min(tiles, t0+chunk)
			ji, base := 0, 0
			for u := lo; u < hi; u++ {
				for u-base >= jobs[ji].pk.groups {
					base += jobs[ji].pk.groups
					ji++
				}
				j := &jobs[ji]
				g := u - base
				cols, rows, nb := j.w.Cols, j.w.Rows, j.pk.nb
				wp := &j.pk.data[g*j.pk.groupBytes]
				nr := min(16, rows-g*16)
				for t := t0; t < t1; t++ {
					r0 := t * actTile
					nt := min(actTile, batch-r0)
					if tmp == nil && (avx2 || nr < 16) {
						tmp = new([actTile * 16]float32)
					}
					if avx2 {
						bb := cols / nb // activation bytes per row per block
						for half := 0; half*8 < nr; half++ {
							for s := 0; s < nt; s += 4 {
								j.fns2[min(4, nt-s)](wp, &j.a.q[r0*cols+s*bb], &j.a.st[r0*nb*2+s*2], &tmp[s*16+half*8], nb, half, nt*bb, nt*8)
							}
						}
					} else if nr == 16 {
						// A whole group: the kernel writes the rows' outputs in place.
						j.fns[nt](wp, &j.a.q[r0*cols], &j.a.st[r0*nb*2], &j.out[r0*rows+g*16], j.pk.kernelArg(), 4*rows)
						continue
					} else {
						j.fns[nt](wp, &j.a.q[r0*cols], &j.a.st[r0*nb*2], &tmp[0], j.pk.kernelArg(), 64)
					}
					for n := 0; n < nt; n++ {
						copy(j.out[(r0+n)*rows+g*16:(r0+n)*rows+g*16+nr], tmp[16*n:16*n+nr])
					}
				}
			}
		}
	})
}
