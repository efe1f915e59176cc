package quant

import (
	"encoding/binary"
	"fmt"
	"math"
)

// EncodeLinear quantizes w (out×in, row-major float32) round-to-nearest
// into the checkpoint layout c describes, as AutoGPTQ (v1 or v2 zeros) or
// AutoAWQ (GEMM) would store it: qweight, qzeros, scales (F16) and, for
// GPTQ, g_idx, named base.qweight etc. order is GPTQ's act-order: the
// columns in quantization order, group g holding order[g·gs:(g+1)·gs]
// (nil for the natural order). It returns the layer and its weights as
// GPTQ dequantizes them, float32(q − z)·s, in the original column order.
//
// It writes the layouts independently of Repack (AutoAWQ's pack order
// forward, GPTQ v1's stored z − 1), so tests of the reader against it are
// tests of both. It is not GPTQ's error-compensating algorithm: the codes
// are plain rounding. v1 cannot store a zero point of 0 (AutoGPTQ's
// z − 1 would wrap), so asymmetric v1 layers keep z ≥ 1.
func EncodeLinear(c *QuantConfig, base string, w []float32, out, in int, order []int) (Linear, []float32, error) {
	gs := c.GroupSize
	if gs == -1 {
		gs = in
	}
	per := 32 / c.Bits
	if len(w) != out*in || in%gs != 0 || in%per != 0 || out%per != 0 || (c.Method == "awq" && out%8 != 0) {
		return Linear{}, nil, fmt.Errorf("encode %s: %d×%d weights (%d values) do not fit group size %d, %d bits", base, out, in, len(w), gs, c.Bits)
	}
	if order == nil {
		order = make([]int, in)
		for i := range order {
			order[i] = i
		}
	}
	if len(order) != in {
		return Linear{}, nil, fmt.Errorf("encode %s: order has %d columns, want %d", base, len(order), in)
	}
	ng := in / gs
	maxq := 1<<c.Bits - 1
	codes := make([]int, out*in) // [n][k]
	zeros := make([]int, ng*out) // [g][n]
	scales := make([]uint16, ng*out)
	gidx := make([]int32, in)
	deq := make([]float32, out*in)
	for g := 0; g < ng; g++ {
		cols := order[g*gs : (g+1)*gs]
		for _, k := range cols {
			gidx[k] = int32(g)
		}
		for n := 0; n < out; n++ {
			lo, hi := float32(0), float32(0)
			for _, k := range cols {
				lo, hi = min(lo, w[n*in+k]), max(hi, w[n*in+k])
			}
			var s float32
			var z int
			if c.Sym {
				a := max(-lo, hi)
				s = 2 * a / float32(maxq)
				z = (maxq + 1) / 2
			} else {
				s = (hi - lo) / float32(maxq)
			}
			sh := F32ToF16(s)
			if s == 0 || F16ToF32(sh) == 0 {
				sh = F32ToF16(1e-3)
			}
			s = F16ToF32(sh)
			if !c.Sym {
				z = int(math.Round(float64(-lo / s)))
				z = max(c.ZeroOffset, min(maxq, z))
			}
			scales[g*out+n], zeros[g*out+n] = sh, z
			for _, k := range cols {
				q := int(math.Round(float64(w[n*in+k]/s))) + z
				q = max(0, min(maxq, q))
				codes[n*in+k] = q
				deq[n*in+k] = float32(q-z) * s
			}
		}
	}
	i32 := func(name string, shape []int64, words []uint32) *PackedTensor {
		b := make([]byte, 4*len(words))
		for i, v := range words {
			binary.LittleEndian.PutUint32(b[4*i:], v)
		}
		return &PackedTensor{Name: base + name, DType: "I32", Shape: shape, Data: b}
	}
	var l Linear
	sb := make([]byte, 2*len(scales))
	for i, v := range scales {
		binary.LittleEndian.PutUint16(sb[2*i:], v)
	}
	l.Scales = &PackedTensor{Name: base + ".scales", DType: "F16", Shape: []int64{int64(ng), int64(out)}, Data: sb}
	if c.Method == "awq" {
		// AutoAWQ: word c of a row packs columns 8c+order_map[i] at nibble i.
		orderMap := [8]int{0, 2, 4, 6, 1, 3, 5, 7}
		qw := make([]uint32, in*out/8)
		for k := 0; k < in; k++ {
			for cw := 0; cw < out/8; cw++ {
				for i, j := range orderMap {
					qw[k*(out/8)+cw] |= uint32(codes[(8*cw+j)*in+k]) << (4 * i)
				}
			}
		}
		qz := make([]uint32, ng*out/8)
		for g := 0; g < ng; g++ {
			for cw := 0; cw < out/8; cw++ {
				for i, j := range orderMap {
					qz[g*(out/8)+cw] |= uint32(zeros[g*out+8*cw+j]) << (4 * i)
				}
			}
		}
		l.QWeight = i32(".qweight", []int64{int64(in), int64(out / 8)}, qw)
		l.QZeros = i32(".qzeros", []int64{int64(ng), int64(out / 8)}, qz)
		return l, deq, nil
	}
	mask := uint32(maxq)
	qw := make([]uint32, in/per*out)
	for k := 0; k < in; k++ {
		for n := 0; n < out; n++ {
			qw[k/per*out+n] |= uint32(codes[n*in+k]) << (c.Bits * (k % per))
		}
	}
	qz := make([]uint32, ng*out/per)
	for g := 0; g < ng; g++ {
		for n := 0; n < out; n++ {
			stored := uint32(zeros[g*out+n]-c.ZeroOffset) & mask
			qz[g*(out/per)+n/per] |= stored << (c.Bits * (n % per))
		}
	}
	l.QWeight = i32(".qweight", []int64{int64(in / per), int64(out)}, qw)
	l.QZeros = i32(".qzeros", []int64{int64(ng), int64(out / per)}, qz)
	gw := make([]uint32, in)
	for k, g := range gidx {
		gw[k] = uint32(g)
	}
	l.GIdx = i32(".g_idx", []int64{int64(in)}, gw)
	return l, deq, nil
}
