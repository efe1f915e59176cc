package hf

import (
	"fmt"
	"path/filepath"
	"strings"

	"pagoda/quant"
	"pagoda/safetensors"
)

// QuantLinear reads the GPTQ/AWQ layer stored in place of the float weight
// weightName (model.layers.0.self_attn.q_proj.weight): base.qweight,
// base.qzeros, base.scales and, for GPTQ, base.g_idx, repacked into
// quant.GQ4/GQ8 rows. The layer's shape comes from qweight (GPTQ: rows ×
// 32/bits input columns; AWQ: 8 output columns a word); the caller checks
// it against the model. found is false when the checkpoint has no
// base.qweight (or c is not quantized). Errors name the safetensors file
// and tensor.
func (c *Config) QuantLinear(set *safetensors.Set, weightName string) (r *quant.Repacked, found bool, err error) {
	base, ok := strings.CutSuffix(weightName, ".weight")
	if c.Quant == nil || !ok {
		return nil, false, nil
	}
	q := c.Quant
	get := func(suffix string) *quant.PackedTensor {
		t, ok := set.Tensor(base + suffix)
		if !ok {
			return nil
		}
		return &quant.PackedTensor{Name: t.Name, DType: t.DType, Shape: t.Shape, Data: t.Data}
	}
	l := quant.Linear{QWeight: get(".qweight"), QZeros: get(".qzeros"), Scales: get(".scales"), GIdx: get(".g_idx")}
	if l.QWeight == nil {
		return nil, false, nil
	}
	file := fileOf(set, l.QWeight.Name)
	for _, p := range []struct {
		t      *quant.PackedTensor
		suffix string
	}{{l.QZeros, ".qzeros"}, {l.Scales, ".scales"}} {
		if p.t == nil {
			return nil, true, fmt.Errorf("%s: tensor %q missing (%s checkpoint, beside %q)", file, base+p.suffix, q.Method, l.QWeight.Name)
		}
	}
	if len(l.QWeight.Shape) != 2 || l.QWeight.Shape[0] <= 0 || l.QWeight.Shape[1] <= 0 || l.QWeight.Shape[0] > 1<<24 || l.QWeight.Shape[1] > 1<<24 {
		return nil, true, fmt.Errorf("%s: tensor %q: shape %v, want 2 positive dimensions", file, l.QWeight.Name, l.QWeight.Shape)
	}
	in, out := int(l.QWeight.Shape[0]), int(l.QWeight.Shape[1])
	if q.Method == "awq" {
		out *= 8
	} else {
		in *= 32 / q.Bits
	}
	r, err = q.Repack(l, out, in)
	if err != nil {
		return nil, true, fmt.Errorf("%s: %v", file, err)
	}
	return r, true, nil
}

// fileOf is the base name of the safetensors file holding tensor name.
func fileOf(set *safetensors.Set, name string) string {
	for _, f := range set.Files {
		if _, ok := f.Tensor(name); ok {
			return filepath.Base(f.Path)
		}
	}
	return "safetensors"
}
