package model

import (
	"fmt"

	"pagoda/arch"
)

// part is one piece of a layer block as the forward pass runs it: it reads
// the residual stream m.buf.x (T rows of NEmbd) and adds its output to it.
// Forward calls each part once per layer, so the per-token loops stay
// inside the part, free of interface calls.
type part interface {
	forward(m *Model, li int, b *Batch, kv KVCache)
}

// newBlock picks the forward pass of each part the architecture declares
// for this config: one attention part, and a feed-forward part per layer
// (deepseek2's leading layers are dense, the rest MoE); a new kind of part
// adds its file and a case here.
func newBlock(a *arch.Arch, c *Config) (attn part, ffns []part, err error) {
	switch p := a.Attn.(type) {
	case arch.Attention:
		attn = selfAttention{}
	case arch.MLA:
		attn = mlaAttention{}
	default:
		return nil, nil, fmt.Errorf("architecture %s: attention part %T has no forward pass", a.Name, p)
	}
	d := c.dims()
	ffns = make([]part, c.NLayer)
	for l := range ffns {
		switch p := a.FFNAt(d, l).(type) {
		case arch.DenseFFN:
			if p.Gated {
				ffns[l] = swiGLU{}
			} else {
				ffns[l] = siluMLP{}
			}
		case arch.MoE:
			ffns[l] = moeFFN{}
		case nil:
			return nil, nil, fmt.Errorf("architecture %s: layer %d has no feed-forward part (expert_count %d)", a.Name, l, c.NExpert)
		default:
			return nil, nil, fmt.Errorf("architecture %s: feed-forward part %T has no forward pass", a.Name, p)
		}
	}
	return attn, ffns, nil
}
