package convert

import (
	"encoding/binary"
	"fmt"

	"pagoda/hf"
	"pagoda/quant"
	"pagoda/safetensors"
)

// GPTQ/AWQ layers become the closest ggml type, chosen per layer:
//
//   - 4-bit, columns in order, every zero 8 (GPTQ sym): Q4_0, exactly —
//     Q4_0 is d·(q − 8) with the same f16 scale and nibble order.
//   - 4-bit, columns in order, other zeros (asym, AWQ): Q4_1 with d = s
//     (exact) and m = −z·s rounded to f16: each weight moves by at most
//     half an f16 ulp of z·s, ≤ 2^-11·16·s = s/128 (under 1% of the
//     quantization step s); 0 when z·s needs no more than 11 significant
//     bits (z a power of two, or s with trailing zero bits).
//   - 8-bit, columns in order, every zero 128 (GPTQ sym): Q8_0, exactly
//     (q − 128 is Q8_0's int8, s its scale).
//   - act-order layers whose groups interleave columns (ggml blocks are 32
//     consecutive columns of one scale), and 8-bit with other zeros: F16 of
//     the dequantized float32 value, within half an f16 ulp (2^-11
//     relative); four times Q4's bytes, but requantizing to a block type
//     would add a second, larger rounding on top of GPTQ's.
//
// llama q/k rows are reordered like float weights.
func hfQuantTensor(hc *hf.Config, set *safetensors.Set, weightName, ggufName string, permute bool, heads int) (*srcTensor, error) {
	ql, _, err := hc.FindQuantLayer(set, weightName)
	if err != nil {
		return nil, err
	}
	info, err := hc.Quant.Describe(ql.Linear, ql.Out, ql.In)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", ql.File, err)
	}
	gq := hc.Quant.Type()
	to := quant.F16
	switch {
	case info.Perm != nil:
	case gq == quant.GQ4 && info.Zero == 8:
		to = quant.Q4_0
	case gq == quant.GQ4:
		to = quant.Q4_1
	case gq == quant.GQ8 && info.Zero == 128:
		to = quant.Q8_0
	}
	rows, cols := ql.Out, ql.In
	if permute && (heads <= 0 || rows%heads != 0 || (rows/heads)%2 != 0) {
		return nil, fmt.Errorf("%d rows do not split into %d heads of even size", rows, heads)
	}
	st := &srcTensor{name: ggufName, typ: to, dims: []uint64{uint64(cols), uint64(rows)}}
	st.data = func() ([]byte, error) {
		r, err := hc.Quant.Repack(ql.Linear, rows, cols)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", ql.File, err)
		}
		data, err := gqToGGML(r, to)
		if err != nil {
			return nil, err
		}
		if permute {
			rb, _ := quant.RowSize(to, cols)
			data = hf.Unpermute(data, rb, rows, heads)
		}
		return data, nil
	}
	return st, nil
}

// gqToGGML converts repacked GQ4/GQ8 rows to type to (see above for which
// combinations are exact).
func gqToGGML(r *quant.Repacked, to quant.Type) ([]byte, error) {
	srb, _ := quant.RowSize(r.Type, r.Cols)
	drb, err := quant.RowSize(to, r.Cols)
	if err != nil {
		return nil, err
	}
	out := make([]byte, r.Rows*drb)
	ts := r.Type.TypeSize()
	var q [32]uint8
	row := make([]float32, r.Cols)
	for n := 0; n < r.Rows; n++ {
		src, dst := r.Data[n*srb:(n+1)*srb], out[n*drb:(n+1)*drb]
		if to == quant.F16 {
			if err := quant.Dequantize(r.Type, src, row); err != nil {
				return nil, err
			}
			for j, v := range row {
				k := j
				if r.Perm != nil {
					k = int(r.Perm[j])
				}
				binary.LittleEndian.PutUint16(dst[2*k:], quant.F32ToF16(v))
			}
			continue
		}
		if r.Perm != nil {
			return nil, fmt.Errorf("convert: permuted columns cannot become %s", to)
		}
		for b := 0; b < r.Cols/32; b++ {
			s, z := quant.GQBlock(r.Type, src[b*ts:(b+1)*ts], &q)
			switch to {
			case quant.Q4_0, quant.Q4_1:
				blk := dst[b*to.TypeSize() : (b+1)*to.TypeSize()]
				binary.LittleEndian.PutUint16(blk, s)
				off := 2
				if to == quant.Q4_1 {
					binary.LittleEndian.PutUint16(blk[2:], quant.F32ToF16(-float32(z)*quant.F16ToF32(s)))
					off = 4
				} else if z != 8 {
					return nil, fmt.Errorf("convert: zero point %d is not Q4_0's 8", z)
				}
				for j := 0; j < 16; j++ {
					blk[off+j] = q[j] | q[j+16]<<4
				}
			case quant.Q8_0:
				if z != 128 {
					return nil, fmt.Errorf("convert: zero point %d is not Q8_0's 128", z)
				}
				blk := dst[b*34 : (b+1)*34]
				binary.LittleEndian.PutUint16(blk, s)
				for j := 0; j < 32; j++ {
					blk[2+j] = q[j] ^ 0x80
				}
			default:
				return nil, fmt.Errorf("convert: no conversion of %s to %s", r.Type, to)
			}
		}
	}
	return out, nil
}
