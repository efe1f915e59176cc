package kvcache

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"pagoda/kernels"
	"pagoda/model"
)

// TestOnlineBlocks: attention over contexts of several online-softmax
// blocks (kvcache's onlineSlots), prefilled in chunks that cut blocks and
// pages anywhere, equals attention in float64 over the values the format
// stores, for group sizes that take the tiled scores (4, 8) and one that
// does not (1), with and without a sliding window, in pages of 16 and
// 32; and each query attended alone gives its chunk's bits.
func TestOnlineBlocks(t *testing.T) {
	const n = 300
	for _, sh := range []struct{ nh, nkv, d int }{{8, 1, 64}, {8, 2, 32}, {4, 4, 16}} {
		for _, f := range []DType{F32, F16} {
			for _, bs := range []int{16, 32} {
				for _, w := range []int{0, 150} {
					name := fmt.Sprintf("h%d-kv%d-d%d/%v/bs%d/w%d", sh.nh, sh.nkv, sh.d, f, bs, w)
					t.Run(name, func(t *testing.T) {
						p := model.AttnParams{NHead: sh.nh, NKVHead: sh.nkv, HeadDim: sh.d, Scale: 0.35, Window: w}
						checkOnline(t, p, f, bs, n)
					})
				}
			}
		}
	}
}

func checkOnline(t *testing.T, p model.AttnParams, f DType, bs, n int) {
	r := rand.New(rand.NewPCG(uint64(bs), uint64(p.HeadDim)))
	c, err := New(Config{NLayer: 1, NKVHead: p.NKVHead, HeadDim: p.HeadDim, BlockSize: bs, NumBlocks: n/bs + 2, DType: f})
	if err != nil {
		t.Fatal(err)
	}
	kvd := p.NKVHead * p.HeadDim
	var keys, vals, qs, sk, sv [][]float32
	for i := 0; i < n; i++ {
		k, v := randRow(r, kvd), randRow(r, kvd)
		keys, vals, qs = append(keys, k), append(vals, v), append(qs, randRow(r, p.NHead*p.HeadDim))
		sk, sv = append(sk, stored(f, k)), append(sv, stored(f, v))
	}
	if !c.Allocate(0, nil, 0, n) {
		t.Fatal("allocate")
	}
	var whole [][]float32
	for from := 0; from < n; from += 37 {
		whole = append(whole, prefill(t, c, []int{0}, 0, from, min(from+37, n), keys, vals, qs, p, p.HeadDim)...)
	}
	for i := 0; i < n; i++ {
		closeTo(t, fmt.Sprintf("position %d", i), whole[i], naiveAttend(sk, sv, i+1, qs[i], p), 2e-5)
	}
	for i := 0; i < n; i += 7 {
		one := make([]float32, p.NHead*p.HeadDim)
		attendTok(c, 0, 0, int32(i+1), qs[i], one, p)
		for j := range one {
			if one[j] != whole[i][j] {
				t.Fatalf("position %d: alone %v, in its chunk %v", i, one[j], whole[i][j])
			}
		}
	}
}

// stored is row as format f keeps it.
func stored(f DType, row []float32) []float32 {
	out := append([]float32(nil), row...)
	switch f {
	case F16:
		h := make([]uint16, len(row))
		kernels.F32ToF16RowRef(h, row)
		kernels.F16ToF32RowRef(out, h)
	case BF16:
		h := make([]uint16, len(row))
		kernels.F32ToBF16RowRef(h, row)
		kernels.BF16ToF32RowRef(out, h)
	}
	return out
}
