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

// newBlock picks the forward pass of each part the architecture declares;
// a new kind of part (MoE, MLA) adds its file and a case here.
func newBlock(a *arch.Arch) (attn, ffn part, err error) {
	switch p := a.Attn.(type) {
	case arch.Attention:
		attn = selfAttention{}
	default:
		return nil, nil, fmt.Errorf("architecture %s: attention part %T has no forward pass", a.Name, p)
	}
	switch p := a.FFN.(type) {
	case arch.DenseFFN:
		if p.Gated {
			ffn = swiGLU{}
		} else {
			ffn = siluMLP{}
		}
	default:
		return nil, nil, fmt.Errorf("architecture %s: feed-forward part %T has no forward pass", a.Name, p)
	}
	return attn, ffn, nil
}
