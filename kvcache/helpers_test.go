package kvcache

import (
	"fmt"

	"pagoda/model"
)

// oneRow prepares a one-row batch: the token at position pos of seq.
func oneRow(c *Cache, seq, pos int32) {
	if err := c.Begin(&model.Batch{Tokens: []int32{0}, Pos: []int32{pos}, Seq: []int32{seq}}); err != nil {
		panic(fmt.Sprint(err))
	}
}

// storeTok stores one token's K/V the way a forward pass of one row does.
func storeTok(c *Cache, layer int, seq, pos int32, k, v []float32) {
	oneRow(c, seq, pos)
	c.Store(layer, 0, k, v)
}

// attendTok attends from position n-1 of seq over positions below n.
func attendTok(c *Cache, layer int, seq, n int32, q, out []float32, p model.AttnParams) {
	oneRow(c, seq, n-1)
	c.Attend(layer, 0, 1, q, out, p)
}
