package kernels

import (
	"encoding/binary"
	"math"
	"sync/atomic"

	"pagoda/quant"
)

// Packed weight layouts for the VNNI micro-kernels. Rows are taken in groups
// of 16 (one 32-bit lane per row of a 512-bit register) and columns in
// blocks; within a (group, block) tile, chunk k holds columns 4k..4k+3 of
// all 16 rows, row r at bytes 4r..4r+3, so one VPDPBUSD against 4 broadcast
// activation bytes advances 16 row sums at once, and a whole block ends with
// 16 finished sums side by side — no horizontal reductions. Weights are the
// unsigned operand: Q8_0 is stored with its sign bit flipped (q+128) and the
// activation sums correct for the offset.
//
//	packQ8C:  block 32: 8 chunks × 64 B (u8 = q+128), then 16 f16 scales d.
//	          w = d·(u − 128)
//	packQ4C:  block 32: 4 chunks × 64 B, low nibble = column 4k+j, high
//	          nibble = column 16+4k+j (Q4_0's own byte order), 16 f16 d.
//	          w = d·(u − 8)
//	packQ8S16: block 16: 4 chunks × 64 B (u8), then 16 f32 scales S.
//	          w = S·(u − K) (Q6_K: K 32, Q3_K: K 4)
//	packQ4SM: block 32: nibbles as packQ4C, then 16 f32 S and 16 f32 M.
//	          w = S·u + M (Q4_K, Q4_1)
//	packQ4K:  Q4_K only, per 256-column super-block: 16 f16 d, 16 f16 dmin,
//	          then 8 × [256 B nibbles as packQ4C, 16 B scales, 16 B minima]:
//	          0.58 B/weight against packQ4SM's 0.75 (AVX-512 only).
//	packQ6K:  Q6_K only, per 256-column super-block: 16 f16 d, then 16 ×
//	          [128 B low nibbles, 64 B high bit pairs, 16 B int8 scales]:
//	          0.82 B/weight like Q6_K itself (AVX-512 only; else packQ8S16).
//	packQ5C:  Q5_0 only, block 32: [256 B low nibbles as packQ4C, 64 B
//	          fifth-bit plane, 16 f16 d]: 0.69 B/weight like Q5_0 (AVX-512
//	          only). w = d·(u − 16)
//	packQ5K:  Q5_K only: packQ4K with a 64 B fifth-bit plane after each
//	          block's nibbles: 0.70 B/weight (AVX-512 only).
//	packSM16: block 16: 4 chunks × 64 B (u8), then 16 f32 scales S and 16
//	          f32 offsets M. w = S·u + M. Any block format fits (K-quants).
type packKind uint8

const (
	packNone packKind = iota
	packQ8C
	packQ4C
	packSM16
	packQ4SM
	packQ8S16
	packQ4K
	packQ6K
	packQ5C
	packQ5K
)

// actKind is how activations are quantized for a weight type: like ggml's
// vec_dot_type for it.
type actKind uint8

const (
	actQ8_0 actKind = iota // per 32: f16-rounded scale amax/127, round half away
	actQ8_K                // per 256: f32 scale −max/127, round half even
)

type packed struct {
	kind  packKind
	act   actKind
	block int     // columns per kernel block
	k     float32 // implicit offset K (Q8_0 128, Q5_0 16, Q4_0 8, Q6_K 32, Q3_K 4); 1 for the S/M kinds
	// nodx: each block's offset term is K·Σq without the activations'
	// scale (Q8_K's is the same over a super-block, and the kernel
	// applies it once per super-block).
	nodx       bool
	groups     int
	nb         int // blocks per row
	groupBytes int
	data       []byte
	// zfix, for GQ8 matrices with zero points other than 128 packed as
	// packQ8C, is s·(128 − z) per row and block: the product adds
	// Σ_b zfix·dx·Σq to each output (gptq.go).
	zfix *Matrix
	// mem owns data when it lies outside the Go heap (allocWeights): it
	// is released once no packed layout holds it.
	mem *weightMem
}

// tileBytes is the size of one (16-row group, block) tile.
func (k packKind) tileBytes() int {
	switch k {
	case packQ8C:
		return 512 + 32
	case packQ4C:
		return 256 + 32
	case packSM16, packQ4SM:
		return 256 + 128
	case packQ8S16:
		return 256 + 64
	case packQ4K:
		return 288 + 64/8 // the super-block header spread over its 8 blocks
	case packQ6K:
		return 208 + 32/16
	case packQ5C:
		return 352
	case packQ5K:
		return 352 + 64/8
	}
	return 0
}

var noPack = &packed{kind: packNone}

// kernelArg is the loop count the AVX-512 kernels take: blocks, or
// super-blocks for packQ4K.
func (pk *packed) kernelArg() int {
	switch pk.kind {
	case packQ4K, packQ5K:
		return pk.nb / 8
	case packQ6K:
		return pk.nb / 16
	}
	return pk.nb
}

var le = binary.LittleEndian

// pack builds m's packed layout for the AVX-512 or (avx2) the AVX2 kernels,
// or noPack when the type has none.
func pack(p *Pool, m *Matrix, avx2 bool) *packed {
	pk := planPack(m, avx2)
	if pk == noPack {
		return noPack
	}
	pk.data, pk.mem = allocWeights(pk.size())
	fillPack(p, m, pk)
	settleWeights(pk.data)
	return pk
}

// size is the packed layout's length in bytes.
func (pk *packed) size() int { return pk.groups * pk.groupBytes }

// planPack describes m's packed layout, without its bytes, or returns
// noPack when the type has none.
func planPack(m *Matrix, avx2 bool) *packed {
	var pk packed
	switch m.Type {
	case quant.Q8_0:
		pk = packed{kind: packQ8C, act: actQ8_0, block: 32, k: 128}
	case quant.Q4_0:
		pk = packed{kind: packQ4C, act: actQ8_0, block: 32, k: 8}
	case quant.Q4_K:
		pk = packed{kind: packQ4K, act: actQ8_K, block: 32, k: 1}
		if avx2 {
			pk.kind = packQ4SM
		}
	case quant.Q4_1:
		pk = packed{kind: packQ4SM, act: actQ8_0, block: 32, k: 1}
	case quant.Q6_K:
		pk = packed{kind: packQ6K, act: actQ8_K, block: 16, k: 32, nodx: true}
		if avx2 {
			pk = packed{kind: packQ8S16, act: actQ8_K, block: 16, k: 32}
		}
	case quant.Q3_K:
		pk = packed{kind: packQ8S16, act: actQ8_K, block: 16, k: 4}
	case quant.Q5_K:
		pk = packed{kind: packQ5K, act: actQ8_K, block: 32, k: 1}
		if avx2 {
			pk = packed{kind: packSM16, act: actQ8_K, block: 16, k: 1}
		}
	case quant.Q2_K:
		pk = packed{kind: packSM16, act: actQ8_K, block: 16, k: 1}
	case quant.Q5_0:
		pk = packed{kind: packQ5C, act: actQ8_0, block: 32, k: 16}
		if avx2 {
			pk = packed{kind: packSM16, act: actQ8_0, block: 16, k: 1}
		}
	case quant.Q5_1:
		pk = packed{kind: packSM16, act: actQ8_0, block: 16, k: 1}
	case quant.GQ4, quant.GQ8:
		pk = packGQ(m)
	default:
		return noPack
	}
	if m.Cols%32 != 0 || (pk.act == actQ8_K && m.Cols%256 != 0) || m.Rows == 0 {
		return noPack
	}
	pk.groups = (m.Rows + 15) / 16
	pk.nb = m.Cols / pk.block
	pk.groupBytes = pk.nb * pk.kind.tileBytes()
	return &pk
}

// fillPack writes m's rows into pk.data (pk from planPack, data zeroed and
// pk.size() bytes long), across the pool.
func fillPack(p *Pool, m *Matrix, pk *packed) {
	p.For(pk.groups, 4, func(lo, hi int) {
		var dec *smRow
		if pk.kind == packSM16 || pk.kind == packQ4SM || pk.kind == packQ8S16 {
			dec = newSMRow(m.Cols)
		}
		for g := lo; g < hi; g++ {
			dst := pk.data[g*pk.groupBytes : (g+1)*pk.groupBytes]
			for r := 0; r < 16; r++ {
				row := g*16 + r
				if row >= m.Rows {
					break // padding rows stay zero: zero scale, zero sum
				}
				src := m.Row(row)
				switch pk.kind {
				case packQ8C:
					if m.Type == quant.GQ8 {
						packRowGQ8C(dst, src, r, pk.nb)
						break
					}
					packRowQ8C(dst, src, r, pk.nb)
				case packQ4C:
					packRowQ4C(dst, src, r, pk.nb)
				case packSM16:
					dec.decode(m.Type, src)
					packRowSM16(dst, dec, r, pk.nb)
				case packQ4SM:
					dec.decode(m.Type, src)
					packRowQ4SM(dst, dec, r, pk.nb)
				case packQ8S16:
					dec.decode(m.Type, src)
					packRowQ8S16(dst, dec, r, pk.nb)
				case packQ4K:
					packRowQ4K(dst, src, r, pk.nb/8)
				case packQ6K:
					packRowQ6K(dst, src, r, pk.nb/16)
				case packQ5C:
					packRowQ5C(dst, src, r, pk.nb)
				case packQ5K:
					packRowQ5K(dst, src, r, pk.nb/8)
				}
			}
		}
	})
	if m.Type == quant.GQ8 && !gqZerosAll(m, 128) {
		pk.zfix = gqZeroFix(m)
	}
}

// PackedOnly reports whether o's matrix products read m only through a
// packed layout already built (by Prepack or PrepackStack), never m.Data:
// a loader may then let the pages under m.Data go (they are read again,
// from the file, should anything still want them).
func (o *Ops) PackedOnly(m *Matrix) bool {
	if !o.packed {
		return false
	}
	p := atomic.LoadPointer(&m.pk[packSlot(o.avx2)])
	return p != nil && (*packed)(p) != noPack
}

func packRowQ8C(dst, src []byte, r, nb int) {
	for b := 0; b < nb; b++ {
		s := src[b*34 : b*34+34]
		t := dst[b*544 : b*544+544]
		t[512+2*r], t[513+2*r] = s[0], s[1]
		for k := 0; k < 8; k++ {
			le.PutUint32(t[k*64+r*4:], le.Uint32(s[2+4*k:])^0x80808080)
		}
	}
}

func packRowQ4C(dst, src []byte, r, nb int) {
	for b := 0; b < nb; b++ {
		s := src[b*18 : b*18+18]
		t := dst[b*288 : b*288+288]
		t[256+2*r], t[257+2*r] = s[0], s[1]
		for k := 0; k < 4; k++ {
			le.PutUint32(t[k*64+r*4:], le.Uint32(s[2+4*k:]))
		}
	}
}

func packRowSM16(dst []byte, d *smRow, r, nb int) {
	for b := 0; b < nb; b++ {
		t := dst[b*384 : b*384+384]
		for k := 0; k < 4; k++ {
			le.PutUint32(t[k*64+r*4:], le.Uint32(d.q[16*b+4*k:]))
		}
		binary.LittleEndian.PutUint32(t[256+4*r:], math.Float32bits(d.s[b]))
		binary.LittleEndian.PutUint32(t[320+4*r:], math.Float32bits(d.m[b]))
	}
}

func packRowQ8S16(dst []byte, d *smRow, r, nb int) {
	for b := 0; b < nb; b++ {
		t := dst[b*320 : b*320+320]
		for k := 0; k < 4; k++ {
			le.PutUint32(t[k*64+r*4:], le.Uint32(d.q[16*b+4*k:]))
		}
		binary.LittleEndian.PutUint32(t[256+4*r:], math.Float32bits(d.s[b]))
	}
}

func packRowQ4K(dst, src []byte, r, nsb int) {
	for i := 0; i < nsb; i++ {
		s := src[i*144 : i*144+144]
		t := dst[i*2368 : i*2368+2368]
		t[2*r], t[2*r+1] = s[0], s[1]     // d
		t[32+2*r], t[33+2*r] = s[2], s[3] // dmin
		qs := s[16:144]
		for sb := 0; sb < 8; sb++ {
			blk := t[64+sb*288 : 64+sb*288+288]
			sc, m := scaleMinK4(sb, s[4:16])
			blk[256+r], blk[272+r] = sc, m
			// Sub-block 2j is the low nibbles of qs[32j:32j+32], 2j+1 the
			// high ones; the packed byte pairs column c with c+16.
			q := qs[32*(sb/2):]
			for k := 0; k < 4; k++ {
				lo, hi := le.Uint32(q[4*k:]), le.Uint32(q[16+4*k:])
				var v uint32
				if sb%2 == 0 {
					v = lo&0x0f0f0f0f | (hi&0x0f0f0f0f)<<4
				} else {
					v = lo>>4&0x0f0f0f0f | hi&0xf0f0f0f0
				}
				le.PutUint32(blk[k*64+r*4:], v)
			}
		}
	}
}

func packRowQ5K(dst, src []byte, r, nsb int) {
	for i := 0; i < nsb; i++ {
		s := src[i*176 : i*176+176]
		t := dst[i*2880 : i*2880+2880]
		t[2*r], t[2*r+1] = s[0], s[1]     // d
		t[32+2*r], t[33+2*r] = s[2], s[3] // dmin
		qh, qs := s[16:48], s[48:176]
		for sb := 0; sb < 8; sb++ {
			blk := t[64+sb*352 : 64+sb*352+352]
			sc, m := scaleMinK4(sb, s[4:16])
			blk[320+r], blk[336+r] = sc, m
			q := qs[32*(sb/2):]
			for k := 0; k < 4; k++ {
				lo, hi := le.Uint32(q[4*k:]), le.Uint32(q[16+4*k:])
				var v uint32
				if sb%2 == 0 {
					v = lo&0x0f0f0f0f | (hi&0x0f0f0f0f)<<4
				} else {
					v = lo>>4&0x0f0f0f0f | hi&0xf0f0f0f0
				}
				le.PutUint32(blk[k*64+r*4:], v)
			}
			// Byte (r, j) of the plane: bit k is the fifth bit of column
			// 4k+j of this sub-block, bit sb of qh[column].
			for j := 0; j < 4; j++ {
				var v byte
				for k := 0; k < 8; k++ {
					v |= (qh[4*k+j] >> sb & 1) << k
				}
				blk[256+r*4+j] = v
			}
		}
	}
}

func packRowQ5C(dst, src []byte, r, nb int) {
	for b := 0; b < nb; b++ {
		s := src[b*22 : b*22+22]
		t := dst[b*352 : b*352+352]
		t[320+2*r], t[321+2*r] = s[0], s[1]
		qh := le.Uint32(s[2:])
		qs := s[6:22]
		for k := 0; k < 4; k++ {
			le.PutUint32(t[k*64+r*4:], le.Uint32(qs[4*k:]))
		}
		// Byte (r, j) of the plane: bit k is the fifth bit of column 4k+j.
		for j := 0; j < 4; j++ {
			var v byte
			for k := 0; k < 8; k++ {
				v |= byte(qh>>(4*k+j)&1) << k
			}
			t[256+r*4+j] = v
		}
	}
}

func packRowQ6K(dst, src []byte, r, nsb int) {
	var q [256]uint8
	for i := 0; i < nsb; i++ {
		s := src[i*210 : i*210+210]
		t := dst[i*3360 : i*3360+3360]
		t[2*r], t[2*r+1] = s[208], s[209] // d
		ql, qh := s[:128], s[128:192]
		for n := 0; n < 2; n++ {
			l0, h0, y := ql[64*n:], qh[32*n:], q[128*n:]
			for l := 0; l < 32; l++ {
				y[l] = l0[l]&0xf | (h0[l]&3)<<4
				y[l+32] = l0[l+32]&0xf | (h0[l]>>2&3)<<4
				y[l+64] = l0[l]>>4 | (h0[l]>>4&3)<<4
				y[l+96] = l0[l+32]>>4 | (h0[l]>>6&3)<<4
			}
		}
		for b := 0; b < 16; b++ {
			blk := t[32+b*208 : 32+b*208+208]
			v := q[16*b : 16*b+16]
			for j := 0; j < 4; j++ {
				blk[r*4+j] = v[j]&0xf | (v[8+j]&0xf)<<4
				blk[64+r*4+j] = v[4+j]&0xf | (v[12+j]&0xf)<<4
				blk[128+r*4+j] = v[j]>>4 | (v[4+j]>>4)<<2 | (v[8+j]>>4)<<4 | (v[12+j]>>4)<<6
			}
			blk[192+r] = s[192+b]
		}
	}
}

func packRowQ4SM(dst []byte, d *smRow, r, nb int) {
	for b := 0; b < nb; b++ {
		t := dst[b*384 : b*384+384]
		q := d.q[32*b : 32*b+32]
		for k := 0; k < 4; k++ {
			le.PutUint32(t[k*64+r*4:], le.Uint32(q[4*k:])|le.Uint32(q[16+4*k:])<<4)
		}
		binary.LittleEndian.PutUint32(t[256+4*r:], math.Float32bits(d.s[2*b]))
		binary.LittleEndian.PutUint32(t[320+4*r:], math.Float32bits(d.m[2*b]))
	}
}

// smRow is one weight row decoded to w = s[i/16]·q[i] + m[i/16] with q
// unsigned. The products s, m are exact in float32 for every format here
// (an f16 scale times a ≤ 8-bit integer), so packing loses nothing.
type smRow struct {
	q    []uint8
	s, m []float32
}

func newSMRow(n int) *smRow {
	return &smRow{q: make([]uint8, n), s: make([]float32, n/16), m: make([]float32, n/16)}
}

func h16(b []byte) float32 { return f16ToF32(binary.LittleEndian.Uint16(b)) }

func scaleMinK4(j int, q []byte) (sc, m uint8) {
	if j < 4 {
		return q[j] & 63, q[j+4] & 63
	}
	return q[j+4]&0xf | (q[j-4]>>6)<<4, q[j+4]>>4 | (q[j]>>6)<<4
}

func (d *smRow) decode(t quant.Type, src []byte) {
	switch t {
	case quant.Q4_1, quant.Q5_0, quant.Q5_1:
		d.decodeLegacy(t, src)
	case quant.Q2_K:
		for i := 0; i < len(d.q)/256; i++ {
			d.decodeQ2K(src[i*84:], i)
		}
	case quant.Q3_K:
		for i := 0; i < len(d.q)/256; i++ {
			d.decodeQ3K(src[i*110:], i)
		}
	case quant.Q4_K:
		for i := 0; i < len(d.q)/256; i++ {
			d.decodeQ4K(src[i*144:], i)
		}
	case quant.Q5_K:
		for i := 0; i < len(d.q)/256; i++ {
			d.decodeQ5K(src[i*176:], i)
		}
	case quant.Q6_K:
		for i := 0; i < len(d.q)/256; i++ {
			d.decodeQ6K(src[i*210:], i)
		}
	case quant.GQ4, quant.GQ8:
		d.decodeGQ(t, src)
	}
}

func (d *smRow) decodeLegacy(t quant.Type, src []byte) {
	ts := t.TypeSize()
	for i := 0; i < len(d.q)/32; i++ {
		b := src[i*ts : (i+1)*ts]
		q := d.q[32*i : 32*i+32]
		var s, m float32
		switch t {
		case quant.Q4_1:
			s, m = h16(b), h16(b[2:])
			for j := 0; j < 16; j++ {
				q[j], q[j+16] = b[4+j]&0xf, b[4+j]>>4
			}
		case quant.Q5_0, quant.Q5_1:
			off := 2
			s = h16(b)
			if t == quant.Q5_1 {
				m = h16(b[2:])
				off = 4
			} else {
				m = -16 * s
			}
			qh := binary.LittleEndian.Uint32(b[off:])
			qs := b[off+4:]
			for j := 0; j < 16; j++ {
				q[j] = qs[j]&0xf | uint8(qh>>j&1)<<4
				q[j+16] = qs[j]>>4 | uint8(qh>>(j+16)&1)<<4
			}
		}
		d.s[2*i], d.s[2*i+1] = s, s
		d.m[2*i], d.m[2*i+1] = m, m
	}
}

func (d *smRow) decodeQ2K(b []byte, i int) {
	sc := b[:16]
	qs := b[16:80]
	dd, dmin := h16(b[80:]), h16(b[82:])
	q := d.q[256*i:]
	for n := 0; n < 2; n++ {
		for shift := 0; shift < 4; shift++ {
			for l := 0; l < 32; l++ {
				q[128*n+32*shift+l] = qs[32*n+l] >> (2 * shift) & 3
			}
		}
	}
	for j := 0; j < 16; j++ {
		d.s[16*i+j] = dd * float32(sc[j]&0xf)
		d.m[16*i+j] = -dmin * float32(sc[j]>>4)
	}
}

func (d *smRow) decodeQ3K(b []byte, i int) {
	hm := b[:32]
	qs := b[32:96]
	raw := b[96:108]
	dd := h16(b[108:])
	var sc [16]int8
	// ggml's kmask shuffle of the twelve 6-bit scale bytes.
	aux0 := binary.LittleEndian.Uint32(raw)
	aux1 := binary.LittleEndian.Uint32(raw[4:])
	tmp := binary.LittleEndian.Uint32(raw[8:])
	const k1, k2 = 0x03030303, 0x0f0f0f0f
	a := [4]uint32{
		aux0&k2 | (tmp>>0&k1)<<4,
		aux1&k2 | (tmp>>2&k1)<<4,
		aux0>>4&k2 | (tmp>>4&k1)<<4,
		aux1>>4&k2 | (tmp>>6&k1)<<4,
	}
	for j := 0; j < 16; j++ {
		sc[j] = int8(a[j/4]>>(8*(j%4))) - 32
	}
	q := d.q[256*i:]
	for n := 0; n < 2; n++ {
		for shift := 0; shift < 4; shift++ {
			m := uint8(1) << (4*n + shift)
			for l := 0; l < 32; l++ {
				v := qs[32*n+l] >> (2 * shift) & 3
				if hm[l]&m != 0 {
					v += 4
				}
				q[128*n+32*shift+l] = v // 0..7, weight = v − 4
			}
		}
	}
	for j := 0; j < 16; j++ {
		s := dd * float32(sc[j])
		d.s[16*i+j] = s
		d.m[16*i+j] = -4 * s
	}
}

func (d *smRow) decodeQ4K(b []byte, i int) {
	dd, dmin := h16(b), h16(b[2:])
	scales := b[4:16]
	qs := b[16:144]
	q := d.q[256*i:]
	for j := 0; j < 4; j++ {
		for l := 0; l < 32; l++ {
			q[64*j+l] = qs[32*j+l] & 0xf
			q[64*j+32+l] = qs[32*j+l] >> 4
		}
	}
	for j := 0; j < 8; j++ {
		sc, m := scaleMinK4(j, scales)
		s, mm := dd*float32(sc), -dmin*float32(m)
		d.s[16*i+2*j], d.s[16*i+2*j+1] = s, s
		d.m[16*i+2*j], d.m[16*i+2*j+1] = mm, mm
	}
}

func (d *smRow) decodeQ5K(b []byte, i int) {
	dd, dmin := h16(b), h16(b[2:])
	scales := b[4:16]
	qh := b[16:48]
	qs := b[48:176]
	q := d.q[256*i:]
	for j := 0; j < 4; j++ {
		u1, u2 := uint8(1)<<(2*j), uint8(2)<<(2*j)
		for l := 0; l < 32; l++ {
			lo, hi := qs[32*j+l]&0xf, qs[32*j+l]>>4
			if qh[l]&u1 != 0 {
				lo += 16
			}
			if qh[l]&u2 != 0 {
				hi += 16
			}
			q[64*j+l], q[64*j+32+l] = lo, hi
		}
	}
	for j := 0; j < 8; j++ {
		sc, m := scaleMinK4(j, scales)
		s, mm := dd*float32(sc), -dmin*float32(m)
		d.s[16*i+2*j], d.s[16*i+2*j+1] = s, s
		d.m[16*i+2*j], d.m[16*i+2*j+1] = mm, mm
	}
}

func (d *smRow) decodeQ6K(b []byte, i int) {
	ql := b[:128]
	qh := b[128:192]
	sc := b[192:208]
	dd := h16(b[208:])
	q := d.q[256*i:]
	for n := 0; n < 2; n++ {
		l0, h0, y := ql[64*n:], qh[32*n:], q[128*n:]
		for l := 0; l < 32; l++ {
			y[l] = l0[l]&0xf | (h0[l]&3)<<4
			y[l+32] = l0[l+32]&0xf | (h0[l]>>2&3)<<4
			y[l+64] = l0[l]>>4 | (h0[l]>>4&3)<<4
			y[l+96] = l0[l+32]>>4 | (h0[l]>>6&3)<<4
		}
	}
	for j := 0; j < 16; j++ {
		s := dd * float32(int8(sc[j]))
		d.s[16*i+j] = s
		d.m[16*i+j] = -32 * s
	}
}
