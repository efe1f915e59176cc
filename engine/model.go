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
	return Config{
		ModelName: name,
		NLayer:    c.NLayer, NKVHead: nkv, HeadDim: kd, KVLatent: vd == 0,
		VocabSize: c.VocabSize, ContextLen: c.ContextLen,
		SlidingWindow: c.SlidingWindow,
		KVRope:        &kvcache.Rotary{Freqs: c.Freqs(), Neox: c.RopeNeox, HeadDim: c.HeadDim},
		Ops:           m.Ops(),
	}
}

var _ Forwarder = (*model.Model)(nil)
