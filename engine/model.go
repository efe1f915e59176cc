package engine

import (
	"pagoda/kvcache"
	"pagoda/model"
)

// ModelConfig fills the shape fields of a Config from a loaded model; the
// caller sets the serving limits on the result.
func ModelConfig(m *model.Model, name string) Config {
	c := m.Config
	nkv, kd, vd := c.KVShape()
	// MLA's cached row is a latent plus a shared rope key: rotating the
	// whole row as one head would be wrong, so policies that move positions
	// (StreamingLLM's sinks) find no rotary embedding and are refused.
	var rope *kvcache.Rotary
	if vd != 0 {
		rope = &kvcache.Rotary{Freqs: c.Freqs(), Neox: c.RopeNeox, HeadDim: c.HeadDim}
	}
	return Config{
		ModelName: name,
		NLayer:    c.NLayer, NKVHead: nkv, HeadDim: kd, KVLatent: vd == 0,
		VocabSize: c.VocabSize, ContextLen: c.ContextLen,
		SlidingWindow: c.SlidingWindow,
		KVRope:        rope,
		Ops:           m.Ops(),
	}
}

var _ Forwarder = (*model.Model)(nil)
