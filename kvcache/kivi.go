package kvcache

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"

	"pagoda/kernels"
	"pagoda/quant"
)

// KIVI is the asymmetric min-max KV quantization of KIVI (Liu et al.,
// 2024): keys per channel over groups of G tokens, values per token over
// groups of channels, Bits bits a code, each group with an f16 scale and
// minimum, x ≈ min + scale·code. The most recent R tokens of a sequence
// stay in f16 until a whole group of G has left that window; then the
// group is quantized at once.
//
// Here a group of keys is one page: the cache's block size must be G.
// The f16 residual rows live beside the pool (ExtraBytes), one page's
// worth at a time, and go back when the page is quantized. A page shared
// by several sequences (a fork, a prefix hit) is quantized when the first
// of them moves its group out of the window — quantization is a function
// of the page's rows alone, so all of them then read the same codes, some
// a few tokens early. A finished sequence's residual pages keep their f16
// rows (a prefix hit on them is exact) until the pool reuses them.
type KIVI struct {
	Bits  int // 2 or 4
	G     int // tokens per key group = the cache's block size (default 32)
	R     int // residual tokens kept in f16, a multiple of G (default 128)
	VG    int // channels per value group (0 = the head dim)
	KAxis Axis
	VAxis Axis
	role  byte // 'k' or 'v' once the cache has placed it (ForKeys/ForValues)
}

// Axis is what one scale and minimum cover.
type Axis uint8

const (
	// PerChannel: one scale per channel over the page's tokens (KIVI's keys).
	PerChannel Axis = iota + 1
	// PerToken: one scale per token over a group of channels (KIVI's values).
	PerToken
)

func (a Axis) String() string {
	if a == PerChannel {
		return "channel"
	}
	return "token"
}

// DefaultKIVI is kivi<bits> with the paper's defaults.
func DefaultKIVI(bits int) KIVI {
	return KIVI{Bits: bits, G: 32, R: 128, KAxis: PerChannel, VAxis: PerToken}
}

// parseKIVI reads "kivi2" or "kivi4" with options
// ":g=32,r=128,vg=32,k=channel|token,v=token|channel".
// kiviOptionHelp says what each numeric KIVI option counts.
var kiviOptionHelp = map[string]string{
	"g":  "tokens per key group",
	"r":  "recent tokens kept in f16",
	"vg": "channels per value group, 0 for the head width",
}

func parseKIVI(s string) (KIVI, error) {
	name, opts, _ := strings.Cut(strings.ToLower(s), ":")
	var f KIVI
	switch name {
	case "kivi2":
		f = DefaultKIVI(2)
	case "kivi4":
		f = DefaultKIVI(4)
	default:
		return f, fmt.Errorf("kvcache: unknown KIVI format %q (want kivi2 or kivi4)", name)
	}
	if opts != "" {
		seen := map[string]bool{}
		for _, kv := range strings.Split(opts, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return f, fmt.Errorf("kvcache: %s: option %q is not key=value", s, kv)
			}
			if seen[k] {
				return f, fmt.Errorf("kvcache: %s: option %s given twice", s, k)
			}
			seen[k] = true
			switch k {
			case "g", "r", "vg":
				n, err := strconv.Atoi(v)
				least := map[string]int{"g": 1, "r": 0, "vg": 0}[k]
				if err != nil || n < least || n > 1<<20 {
					return f, fmt.Errorf("kvcache: %s: %s=%q must be a whole number in [%d, %d] (%s)", s, k, v, least, 1<<20, kiviOptionHelp[k])
				}
				*map[string]*int{"g": &f.G, "r": &f.R, "vg": &f.VG}[k] = n
			case "k", "v":
				var a Axis
				switch v {
				case "channel":
					a = PerChannel
				case "token":
					a = PerToken
				default:
					return f, fmt.Errorf("kvcache: %s: %s=%q: want channel or token", s, k, v)
				}
				if k == "k" {
					f.KAxis = a
				} else {
					f.VAxis = a
				}
			default:
				return f, fmt.Errorf("kvcache: %s: unknown option %q (want g, r, vg, k, v)", s, k)
			}
		}
	}
	if f.R%f.G != 0 {
		return f, fmt.Errorf("kvcache: %s: residual r=%d is not a multiple of the group g=%d", s, f.R, f.G)
	}
	return f, nil
}

func (f KIVI) String() string {
	s := "kivi" + strconv.Itoa(f.Bits)
	def := DefaultKIVI(f.Bits)
	var o []string
	if f.G != def.G {
		o = append(o, "g="+strconv.Itoa(f.G))
	}
	if f.R != def.R {
		o = append(o, "r="+strconv.Itoa(f.R))
	}
	if f.VG != 0 {
		o = append(o, "vg="+strconv.Itoa(f.VG))
	}
	if f.KAxis != def.KAxis {
		o = append(o, "k="+f.KAxis.String())
	}
	if f.VAxis != def.VAxis {
		o = append(o, "v="+f.VAxis.String())
	}
	if len(o) > 0 {
		s += ":" + strings.Join(o, ",")
	}
	return s
}

// ForKeys and ForValues place the format: keys and values quantize along
// different axes, so the cache asks which it is storing.
func (f KIVI) ForKeys() Format   { f.role = 'k'; return f }
func (f KIVI) ForValues() Format { f.role = 'v'; return f }

// GroupSize is the tokens per page the format needs.
func (f KIVI) GroupSize() int { return f.G }

func (f KIVI) axis() Axis {
	if f.role == 'v' {
		return f.VAxis
	}
	return f.KAxis
}

// chanGroup is the channels one per-token scale covers.
func (f KIVI) chanGroup(dim int) int {
	if f.role == 'v' && f.VG > 0 {
		return f.VG
	}
	return dim
}

// RowBytes implements Format: the packed codes of one token.
func (f KIVI) RowBytes(heads, dim int) int { return heads * dim * f.Bits / 8 }

// PageMetaBytes implements Format: an f16 scale and minimum per channel
// (per-channel axis) or per token and channel group (per-token axis).
func (f KIVI) PageMetaBytes(tokens, heads, dim int) int {
	if f.axis() == PerChannel {
		return heads * dim * 4
	}
	return tokens * heads * (dim / f.chanGroup(dim)) * 4
}

// ResidualBytes is the most full-precision storage one sequence holds
// beyond its pages: up to R+G−1 tokens of f16 rows.
func (f KIVI) ResidualBytes(heads, dim int) int { return (f.R + f.G - 1) * heads * dim * 2 }

func (f KIVI) checkDim(dim int) error {
	if f.Bits != 2 && f.Bits != 4 {
		return fmt.Errorf("kvcache: %v: %d bits (want 2 or 4)", f, f.Bits)
	}
	if dim*f.Bits%8 != 0 {
		return fmt.Errorf("kvcache: %v needs a head dim whose codes fill whole bytes, not %d", f, dim)
	}
	if cg := f.chanGroup(dim); dim%cg != 0 {
		return fmt.Errorf("kvcache: %v: value channel group vg=%d does not divide the head dim %d", f, cg, dim)
	}
	return nil
}

// checkBlock rejects a block size other than the key group.
func (f KIVI) checkBlock(bs int) error {
	if bs != f.G {
		return fmt.Errorf("kvcache: %v quantizes groups of g=%d tokens, one block each: the block size must be %d, not %d (or give g=%d)", f, f.G, f.G, bs, bs)
	}
	return nil
}

// NewPages implements Format.
func (f KIVI) NewPages(n, tokens, heads, dim int, ops *kernels.Ops, mem *PageMem) Pages {
	if err := f.checkDim(dim); err != nil {
		panic(err)
	}
	if ops == nil {
		ops = kernels.Best()
	}
	rowLen := heads * dim
	p := &kiviPages{f: f, axis: f.axis(), heads: heads, dim: dim, tokens: tokens, rowLen: rowLen, ops: ops,
		cg: f.chanGroup(dim), codeRow: f.RowBytes(heads, dim), levels: float32(int(1)<<f.Bits - 1), planes: ops.AttnPlanes(f.Bits)}
	p.codePage = tokens * p.codeRow
	p.metaPage = f.PageMetaBytes(tokens, heads, dim) / 2
	p.codes = PageArray[byte](mem, n*p.codePage)
	p.meta = PageArray[uint16](mem, n*p.metaPage)
	p.state = PageArray[int32](mem, n)
	for i := range p.state {
		p.state[i] = pageEmpty
	}
	return p
}

// Page states: a slab index (>= 0) while the page is in the residual
// window, or one of these.
const (
	pageEmpty     = -2
	pageQuantized = -1
)

// kiviPages stores one layer's K or V as KIVI codes, and the residual
// pages' f16 rows in slabs of a page each.
type kiviPages struct {
	f                  KIVI
	axis               Axis
	heads, dim, tokens int
	rowLen, cg         int
	codeRow, codePage  int
	metaPage           int
	levels             float32
	codes              []byte
	meta               []uint16 // scale, min pairs
	state              []int32
	slabs              [][]uint16
	freeSlabs          []int32
	ops                *kernels.Ops
	planes             kernels.PlaneAttn // codes read in place, channels split into 8/Bits planes
	scratch            sync.Pool         // *kiviScratch
}

// ExtraBytes implements extraBytes: the f16 slabs in use.
func (p *kiviPages) ExtraBytes() int64 {
	return int64(len(p.slabs)-len(p.freeSlabs)) * int64(p.tokens*p.rowLen*2)
}

// slab returns page's f16 rows, making the page residual first. Rows
// [0, keep) of a quantized page (rewritten after a rollback) are
// expanded so they keep their values; a page reused by another sequence
// starts at slot 0 and keeps nothing.
func (p *kiviPages) slab(page, keep int) []uint16 {
	if s := p.state[page]; s >= 0 {
		return p.slabs[s]
	}
	var id int32
	if n := len(p.freeSlabs); n > 0 {
		id, p.freeSlabs = p.freeSlabs[n-1], p.freeSlabs[:n-1]
	} else {
		id = int32(len(p.slabs))
		p.slabs = append(p.slabs, make([]uint16, p.tokens*p.rowLen))
	}
	sl := p.slabs[id]
	if p.state[page] == pageQuantized && keep > 0 {
		row := make([]float32, p.rowLen)
		for t := 0; t < keep; t++ {
			p.dequant(page, t, row)
			p.ops.F32ToF16Row(sl[t*p.rowLen:(t+1)*p.rowLen], row)
		}
	}
	p.state[page] = id
	return sl
}

func (p *kiviPages) Put(page, slot int, row []float32) {
	sl := p.slab(page, slot)
	p.ops.F32ToF16Row(sl[slot*p.rowLen:(slot+1)*p.rowLen], row[:p.rowLen])
}

// PutSeq implements seqPutter: it stores the row of position pos of the
// sequence whose block table is blocks, then quantizes the page whose
// group has just left the residual window of R tokens.
func (p *kiviPages) PutSeq(blocks []int32, pos int, row []float32) {
	p.Put(int(blocks[pos/p.tokens]), pos%p.tokens, row)
	old := pos + 1 - p.f.R // tokens older than the window
	if old <= 0 || old%p.tokens != 0 {
		return
	}
	if page := blocks[old/p.tokens-1]; page != released && p.state[page] >= 0 {
		p.quantize(int(page))
	}
}

// quantize turns residual page into codes and frees its slab.
func (p *kiviPages) quantize(page int) {
	sl := p.slabs[p.state[page]]
	x := make([]float32, p.tokens*p.rowLen)
	p.ops.F16ToF32Row(x, sl)
	codes := p.codes[page*p.codePage : (page+1)*p.codePage]
	clear(codes)
	meta := p.meta[page*p.metaPage : (page+1)*p.metaPage]
	if p.axis == PerChannel {
		for c := 0; c < p.rowLen; c++ {
			mn, mx := float32(math.Inf(1)), float32(math.Inf(-1))
			for t := 0; t < p.tokens; t++ {
				v := x[t*p.rowLen+c]
				mn, mx = min(mn, v), max(mx, v)
			}
			sc, m0 := p.params(meta[2*c:], mn, mx)
			for t := 0; t < p.tokens; t++ {
				p.setCode(codes[t*p.codeRow:], c, code(x[t*p.rowLen+c], m0, sc, p.levels))
			}
		}
	} else {
		ng := p.rowLen / p.cg
		for t := 0; t < p.tokens; t++ {
			for g := 0; g < ng; g++ {
				xs := x[t*p.rowLen+g*p.cg : t*p.rowLen+(g+1)*p.cg]
				mn, mx := float32(math.Inf(1)), float32(math.Inf(-1))
				for _, v := range xs {
					mn, mx = min(mn, v), max(mx, v)
				}
				sc, m0 := p.params(meta[2*(t*ng+g):], mn, mx)
				for i, v := range xs {
					p.setCode(codes[t*p.codeRow:], g*p.cg+i, code(v, m0, sc, p.levels))
				}
			}
		}
	}
	p.freeSlabs = append(p.freeSlabs, p.state[page])
	p.state[page] = pageQuantized
}

// params stores the f16 scale and minimum of a group spanning [mn, mx]
// and returns them as stored, so codes are chosen against what is read.
func (p *kiviPages) params(dst []uint16, mn, mx float32) (scale, m0 float32) {
	dst[0] = quant.F32ToF16((mx - mn) / p.levels)
	dst[1] = quant.F32ToF16(mn)
	return quant.F16ToF32(dst[0]), quant.F16ToF32(dst[1])
}

// code is round((v−m0)/scale) clamped to [0, levels].
func code(v, m0, scale, levels float32) byte {
	if !(scale > 0) {
		return 0
	}
	q := float32(math.Round(float64((v - m0) / scale)))
	return byte(min(max(q, 0), levels))
}

func (p *kiviPages) setCode(row []byte, c int, q byte) {
	if p.f.Bits == 4 {
		row[c/2] |= q << (4 * (c % 2))
	} else {
		row[c/4] |= q << (2 * (c % 4))
	}
}

func (p *kiviPages) getCode(row []byte, c int) float32 {
	if p.f.Bits == 4 {
		return float32(row[c/2] >> (4 * (c % 2)) & 15)
	}
	return float32(row[c/4] >> (2 * (c % 4)) & 3)
}

// dequant reads slot t of quantized page into row.
func (p *kiviPages) dequant(page, t int, row []float32) {
	codes := p.codes[page*p.codePage+t*p.codeRow:]
	meta := p.meta[page*p.metaPage : (page+1)*p.metaPage]
	ng := p.rowLen / p.cg
	for c := 0; c < p.rowLen; c++ {
		var mi int
		if p.axis == PerChannel {
			mi = 2 * c
		} else {
			mi = 2 * (t*ng + c/p.cg)
		}
		row[c] = quant.F16ToF32(meta[mi+1]) + quant.F16ToF32(meta[mi])*p.getCode(codes, c)
	}
}

func (p *kiviPages) Get(page, slot int, row []float32) {
	if s := p.state[page]; s >= 0 {
		p.ops.F16ToF32Row(row[:p.rowLen], p.slabs[s][slot*p.rowLen:(slot+1)*p.rowLen])
		return
	}
	if p.state[page] == pageEmpty {
		clear(row[:p.rowLen])
		return
	}
	p.dequant(page, slot, row)
}

// Scores implements Pages. A quantized page is read in place: for keys
// per channel, q·k_t = Σ_c (q_c·scale_c)·code_tc + Σ_c q_c·min_c, the
// first factor and the second sum computed once per page; per token,
// q·k_t = Σ_g scale_tg·Σ_{c∈g} q_c·code_tc + min_tg·Σ_{c∈g} q_c.
func (p *kiviPages) Scores(s []float32, ss int, q []float32, page, head, from, to int) {
	if st := p.state[page]; st >= 0 {
		sl := p.slabs[st]
		lo := from*p.rowLen + head*p.dim
		for j := 0; j*p.dim < len(q); j++ {
			p.ops.AttnScoresF16(s[j*ss:j*ss+to-from], q[j*p.dim:(j+1)*p.dim], sl[lo:lo+(to-from-1)*p.rowLen+p.dim], p.rowLen)
		}
		return
	}
	meta := p.meta[page*p.metaPage : (page+1)*p.metaPage]
	base := head * p.dim
	sc := p.getScratch()
	defer p.scratch.Put(sc)
	qs, mf := sc.a, sc.c
	ng := p.rowLen / p.cg
	// Per channel: the head's scales and minimums, once per page and
	// head for all the queries of the GQA group.
	if p.axis == PerChannel {
		p.ops.F16ToF32Row(mf, meta[2*base:2*(base+p.dim)])
	}
	for j := 0; j*p.dim < len(q); j++ {
		qj := q[j*p.dim : (j+1)*p.dim]
		out := s[j*ss : j*ss+to-from]
		if p.axis == PerChannel {
			var qm float32
			P := 8 / p.f.Bits
			pl := p.dim / P
			for c, v := range qj {
				qs[c%P*pl+c/P] = v * mf[2*c] // straight into the planes
				qm += v * mf[2*c+1]
			}
			p.planes.Scores(out, qs, p.headRows(page, head, from, to), p.codeRow)
			for i := range out {
				out[i] += qm
			}
			continue
		}
		// Per token: Σ_{c∈g} q_c once per group, the codes unpacked into
		// qs and dotted with the SIMD kernel.
		sq := sc.d[:p.dim/p.cg]
		for g := range sq {
			sq[g] = 0
			for _, v := range qj[g*p.cg : (g+1)*p.cg] {
				sq[g] += v
			}
		}
		g0 := base / p.cg
		for t := from; t < to; t++ {
			p.unpack(qs, page, t, base)
			var acc float32
			for g := range sq {
				mi := 2 * (t*ng + g0 + g)
				acc += quant.F16ToF32(meta[mi])*p.ops.DotF32(qj[g*p.cg:(g+1)*p.cg], qs[g*p.cg:(g+1)*p.cg]) + quant.F16ToF32(meta[mi+1])*sq[g]
			}
			out[t-from] = acc
		}
	}
}

// Mix implements Pages: per token, out_c += w_t·scale_tg·code_tc and
// Σ_t w_t·min_tg once per channel group; per channel, out_c +=
// scale_c·Σ_t w_t·code_tc + min_c·Σ_t w_t.
func (p *kiviPages) Mix(out, w []float32, ws int, page, head, from, to int) {
	if s := p.state[page]; s >= 0 {
		sl := p.slabs[s]
		lo := from*p.rowLen + head*p.dim
		for j := 0; j*p.dim < len(out); j++ {
			p.ops.AttnMixF16(out[j*p.dim:(j+1)*p.dim], w[j*ws:j*ws+to-from], sl[lo:lo+(to-from-1)*p.rowLen+p.dim], p.rowLen)
		}
		return
	}
	meta := p.meta[page*p.metaPage : (page+1)*p.metaPage]
	base := head * p.dim
	ng := p.rowLen / p.cg
	sc := p.getScratch()
	defer p.scratch.Put(sc)
	acc := sc.a
	for j := 0; j*p.dim < len(out); j++ {
		oj := out[j*p.dim : (j+1)*p.dim]
		wj := w[j*ws : j*ws+to-from]
		if p.axis == PerChannel {
			var W float32
			x := sc.b
			for _, a := range wj {
				W += a
			}
			clear(x)
			p.planes.Mix(x, wj, p.headRows(page, head, from, to), p.codeRow)
			p.fromPlanes(acc, x)
			for c := range oj {
				oj[c] += quant.F16ToF32(meta[2*(base+c)])*acc[c] + quant.F16ToF32(meta[2*(base+c)+1])*W
			}
			continue
		}
		if p.cg == p.dim {
			// One scale a token and head: the plane kernel adds
			// (w_t·scale_t)·codes, the minimums are one sum.
			ws := sc.d[:to-from]
			var m float32
			for t := from; t < to; t++ {
				mi := 2 * (t*ng + head)
				ws[t-from] = wj[t-from] * quant.F16ToF32(meta[mi])
				m += wj[t-from] * quant.F16ToF32(meta[mi+1])
			}
			clear(acc)
			p.planes.Mix(acc, ws, p.headRows(page, head, from, to), p.codeRow)
			p.addPlanes(oj, acc, m)
			continue
		}
		// Per token: unpack the head's codes once, add scale·codes with
		// the SIMD axpy, and gather the minimums per channel group.
		mg := sc.d[:p.dim/p.cg]
		clear(mg)
		g0 := base / p.cg
		for t := from; t < to; t++ {
			p.unpack(acc, page, t, base)
			a := wj[t-from]
			for g := range mg {
				mi := 2 * (t*ng + g0 + g)
				p.ops.AxpyF32(oj[g*p.cg:(g+1)*p.cg], a*quant.F16ToF32(meta[mi]), acc[g*p.cg:(g+1)*p.cg])
				mg[g] += a * quant.F16ToF32(meta[mi+1])
			}
		}
		for g, m := range mg {
			for c := g * p.cg; c < (g+1)*p.cg; c++ {
				oj[c] += m
			}
		}
	}
}

// kiviScratch is one Scores or Mix call's working memory: Attend runs
// concurrently, and a stack buffer handed to a kernel through a function
// value would escape to the heap on every call.
type kiviScratch struct{ a, b, c, d []float32 }

func (p *kiviPages) getScratch() *kiviScratch {
	if sc, ok := p.scratch.Get().(*kiviScratch); ok {
		return sc
	}
	return &kiviScratch{a: make([]float32, p.dim), b: make([]float32, p.dim), c: make([]float32, 2*p.dim),
		d: make([]float32, max(p.tokens, p.dim/p.cg))}
}

// headRows is the code bytes of head's rows [from, to) of page.
func (p *kiviPages) headRows(page, head, from, to int) []byte {
	lo := page*p.codePage + from*p.codeRow + head*p.dim*p.f.Bits/8
	return p.codes[lo : lo+(to-from-1)*p.codeRow+p.dim*p.f.Bits/8]
}

// toPlanes splits x by channel c mod P (P = 8/Bits codes a byte) into
// planes, the layout the plane kernels read.
func (p *kiviPages) toPlanes(planes, x []float32) {
	P := 8 / p.f.Bits
	pl := len(x) / P
	for j := 0; j < pl; j++ {
		for k := 0; k < P; k++ {
			planes[k*pl+j] = x[j*P+k]
		}
	}
}

// fromPlanes is the inverse of toPlanes.
func (p *kiviPages) fromPlanes(x, planes []float32) {
	P := 8 / p.f.Bits
	pl := len(x) / P
	for j := 0; j < pl; j++ {
		for k := 0; k < P; k++ {
			x[j*P+k] = planes[k*pl+j]
		}
	}
}

// addPlanes adds planes, re-interleaved, plus m to every channel of out.
func (p *kiviPages) addPlanes(out, planes []float32, m float32) {
	P := 8 / p.f.Bits
	pl := len(out) / P
	for j := 0; j < pl; j++ {
		for k := 0; k < P; k++ {
			out[j*P+k] += planes[k*pl+j] + m
		}
	}
}

// unpack writes the codes of slot t's channels base..base+len(x) as
// floats, a byte at a time through a table of its 2 or 4 codes.
func (p *kiviPages) unpack(x []float32, page, t, base int) {
	codes := p.codes[page*p.codePage+t*p.codeRow:]
	if p.f.Bits == 4 {
		b := codes[base/2 : base/2+len(x)/2]
		for i, v := range b {
			*(*[2]float32)(x[2*i:]) = nibbleCodes[v]
		}
		return
	}
	b := codes[base/4 : base/4+len(x)/4]
	for i, v := range b {
		*(*[4]float32)(x[4*i:]) = crumbCodes[v]
	}
}

// nibbleCodes and crumbCodes are a byte's 4-bit and 2-bit codes, low first.
var nibbleCodes, crumbCodes = func() (n [256][2]float32, c [256][4]float32) {
	for v := range 256 {
		n[v] = [2]float32{float32(v & 15), float32(v >> 4)}
		c[v] = [4]float32{float32(v & 3), float32(v >> 2 & 3), float32(v >> 4 & 3), float32(v >> 6)}
	}
	return
}()

func (p *kiviPages) CopyPage(dst, src int) {
	switch s := p.state[src]; {
	case s >= 0:
		d := p.slab(dst, 0)
		copy(d, p.slabs[s])
	default:
		if d := p.state[dst]; d >= 0 {
			p.freeSlabs = append(p.freeSlabs, d)
		}
		p.state[dst] = s
		copy(p.codes[dst*p.codePage:(dst+1)*p.codePage], p.codes[src*p.codePage:(src+1)*p.codePage])
		copy(p.meta[dst*p.metaPage:(dst+1)*p.metaPage], p.meta[src*p.metaPage:(src+1)*p.metaPage])
	}
}
