package kernels

import "math"

// Activations are quantized to 8 bits per element, exactly as ggml's
// vec_dot_type for the weight (quantize_row_q8_0_ref / quantize_row_q8_K_ref),
// and laid out for the micro-kernels: rows in tiles of up to actTile, and
// within a tile block by block, the tile's rows side by side, so one pointer
// walks the whole tile:
//
//	q:  tile base = row0·cols; then [block][row in tile][block bytes]
//	st: tile base = row0·nb·2; then [block][row in tile]{dx, c}
//
// c = K·dx·Σq over the block: for the implicit-offset kinds K is the
// weights' offset (128 or 8), for the S/M kinds 1.
const actTile = 8

type actBuf struct {
	q  []int8
	st []float32
}

func (a *actBuf) grow(nq, nst int) {
	if cap(a.q) < nq {
		a.q = make([]int8, nq)
	}
	if cap(a.st) < nst {
		a.st = make([]float32, nst)
	}
	a.q, a.st = a.q[:nq], a.st[:nst]
}

// quantizeActs fills a with the rows of x (batch rows of cols) for pk,
// through the assembly quantizers where asm is set and one fits.
func quantizeActs(p *Pool, pk *packed, x []float32, batch, cols int, a *actBuf, asm bool) {
	nb := cols / pk.block
	a.grow(batch*cols, batch*nb*2)
	tiles := (batch + actTile - 1) / actTile
	work := func(lo, hi int) {
		var rq [256]int8
		var rd [256 / 16]float32 // scale per 16 elements
		for t := lo; t < hi; t++ {
			r0 := t * actTile
			nt := min(actTile, batch-r0)
			q := a.q[r0*cols : (r0+nt)*cols]
			st := a.st[r0*nb*2 : (r0+nt)*nb*2]
			for n := 0; n < nt; n++ {
				row := x[(r0+n)*cols : (r0+n+1)*cols]
				if asm && quantRowFast(pk, row, q, st, n, nt) {
					continue
				}
				for c0 := 0; c0 < cols; c0 += 256 {
					seg := min(256, cols-c0)
					xs := row[c0 : c0+seg]
					if pk.act == actQ8_K {
						quantRowQ8K(xs, rq[:seg], rd[:seg/16])
					} else {
						quantRowQ8_0(xs, rq[:seg], rd[:seg/16])
					}
					bs := pk.block
					for j := 0; j < seg; j += bs {
						b := (c0 + j) / bs
						blk := rq[j : j+bs]
						copy(q[(b*nt+n)*bs:(b*nt+n+1)*bs], blk)
						var sum int32
						for _, v := range blk {
							sum += int32(v)
						}
						dx := rd[j/16]
						c := pk.k * dx * float32(sum)
						if pk.nodx {
							c = pk.k * float32(sum)
						}
						st[(b*nt+n)*2] = dx
						st[(b*nt+n)*2+1] = c
					}
				}
			}
		}
	}
	if batch*cols < 1<<15 {
		work(0, tiles)
		return
	}
	p.For(tiles, 1, work)
}

// quantRowQ8_0 quantizes len(x) (a multiple of 32) elements like
// quantize_row_q8_0_ref: d = amax/127 stored as f16, q = roundf(x/d).
// d[i] receives the (f16-rounded) scale of each 16 elements.
func quantRowQ8_0(x []float32, q []int8, d []float32) {
	for b := 0; b < len(x); b += 32 {
		xs := x[b : b+32]
		var amax float32
		for _, v := range xs {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		dd := amax / 127
		var id float32
		if dd != 0 {
			id = 1 / dd
		}
		qs := q[b : b+32]
		for j, v := range xs {
			// roundf (half away from zero); f − trunc(f) is exact here.
			f := v * id
			i := int32(f)
			if r := f - float32(i); r >= 0.5 {
				i++
			} else if r <= -0.5 {
				i--
			}
			qs[j] = int8(i)
		}
		dh := f16ToF32(f32ToF16(dd))
		d[b/16], d[b/16+1] = dh, dh
	}
}

// quantRowQ8K quantizes len(x) (a multiple of 256) elements like
// quantize_row_q8_K_ref: scale from the signed element of largest magnitude,
// q = nearest_int(−127/max · x), d = 1/iscale.
func quantRowQ8K(x []float32, q []int8, d []float32) {
	for b := 0; b < len(x); b += 256 {
		xs := x[b : b+256]
		var amax, mx float32
		for _, v := range xs {
			if a := float32(math.Abs(float64(v))); a > amax {
				amax, mx = a, v
			}
		}
		qs := q[b : b+256]
		ds := d[b/16 : b/16+16]
		if amax == 0 {
			clear(qs)
			clear(ds)
			continue
		}
		iscale := -127 / mx
		for j, v := range xs {
			f := iscale*v + 12582912
			qs[j] = int8(min(127, int32(math.Float32bits(f)&0x007fffff)-0x00400000))
		}
		dd := 1 / iscale
		for j := range ds {
			ds[j] = dd
		}
	}
}
