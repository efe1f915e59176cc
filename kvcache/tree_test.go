package kvcache

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"pagoda/model"
)

// TestTreeAttention stores a sequence of 5 tokens and a tree of 4 draft
// nodes after it (0 and 1 children of the last token, 2 a child of 0, 3
// a child of 2), attends every node in one step, and checks each against
// exact attention over the sequence and the node's own ancestors only.
// Then it moves the path 0→2→3 into the positions after the sequence and
// checks the rows came along bit for bit, in f16 and q8_0.
func TestTreeAttention(t *testing.T) {
	const L, nh, nkv, hd = 5, 4, 2, 32
	parent := []int32{-1, -1, 0, 2} // within the tree; -1: the sequence's last token
	for _, f := range []Format{F16, Q8_0} {
		t.Run(f.String(), func(t *testing.T) {
			c, err := New(Config{NLayer: 1, NKVHead: nkv, HeadDim: hd, BlockSize: 4, NumBlocks: 8, KFormat: f, VFormat: f})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			r := rand.New(rand.NewPCG(1, 2))
			n := L + len(parent)
			if !c.Allocate(0, nil, 0, n) {
				t.Fatal("no blocks")
			}
			keys, vals := make([][]float32, n), make([][]float32, n)
			for i := range n {
				keys[i], vals[i] = randRow(r, nkv*hd), randRow(r, nkv*hd)
			}
			// Read back as stored, so the reference sees what attention reads.
			pos, seq, rows := make([]int32, n), make([]int32, n), make([]int32, n)
			for i := range n {
				pos[i], rows[i] = int32(i), -1
			}
			for i, p := range parent {
				rows[L+i] = L + p // a root child's parent row is the last token's, L-1
			}
			var pl model.KVPlan
			if err := c.Plan(pos, seq, rows, &pl); err != nil {
				t.Fatal(err)
			}
			b := &model.Batch{Tokens: make([]int32, n), Pos: pos, Seq: seq, KV: &pl}
			if err := c.Begin(b); err != nil {
				t.Fatal(err)
			}
			for i := range n {
				c.Store(0, i, keys[i], vals[i])
			}
			for i := range n {
				c.layers[0].k.Get(int(pl.Slots[i])/4, int(pl.Slots[i])%4, keys[i])
				c.layers[0].v.Get(int(pl.Slots[i])/4, int(pl.Slots[i])%4, vals[i])
			}
			ap := model.AttnParams{NHead: nh, NKVHead: nkv, HeadDim: hd, Scale: 0.2}
			q := randRow(r, n*nh*hd)
			out := make([]float32, n*nh*hd)
			c.Attend(0, 0, n, q, out, ap)
			for i := range parent {
				vis := []int{}
				for a := int32(i); a >= 0; a = parent[a] {
					vis = append(vis, L+int(a))
				}
				for p := L - 1; p >= 0; p-- {
					vis = append(vis, p)
				}
				slices.Sort(vis)
				row := L + i
				want := refAttend(keys, vals, vis, q[row*nh*hd:(row+1)*nh*hd], nh, nkv, hd, hd, ap.Scale)
				closeTo(t, fmt.Sprintf("tree node %d spans %v", i, pl.Spans[2*pl.SpanOff[row]:2*pl.SpanOff[row+1]]), out[row*nh*hd:(row+1)*nh*hd], want, 1e-4)
			}
			// Compact the path 0→2→3 to positions L, L+1, L+2.
			var moves []int32
			for j, node := range []int{0, 2, 3} {
				moves = append(moves, pl.Slots[L+node], pl.Slots[L+j])
			}
			want := [][]float32{keys[L], keys[L+2], keys[L+3]}
			if err := c.MoveSlots(moves); err != nil {
				t.Fatal(err)
			}
			got := make([]float32, nkv*hd)
			for j := range want {
				s := pl.Slots[L+j]
				c.layers[0].k.Get(int(s)/4, int(s)%4, got)
				if !slices.Equal(got, want[j]) {
					t.Fatalf("moved row %d differs", j)
				}
			}
			if !c.cfg.ExactSlotMoves() {
				t.Error("exact formats refuse slot moves")
			}
			if err := c.MoveSlots([]int32{0, 1 << 20}); err == nil {
				t.Error("a move outside the pages was accepted")
			}
			if err := c.Plan(pos, seq, []int32{-1, 3, -1, -1, -1, -1, -1, -1, -1}, &pl); err == nil {
				t.Error("a parent after its child was accepted")
			}
		})
	}
}
