package hf

import (
	"fmt"
	"path/filepath"
	"strings"

	"pagoda/quant"
	"pagoda/safetensors"
)

// QuantLayer is one GPTQ/AWQ layer of a checkpoint: its tensors, its
// shape (Out×In, from qweight: GPTQ packs 32/bits input columns a word,
// AWQ 8 output columns) and the safetensors file holding qweight.
type QuantLayer struct {
	quant.Linear
	Out, In int
	File    string
}

// FindQuantLayer finds the GPTQ/AWQ layer stored in place of the float
// weight weightName (model.layers.0.self_attn.q_proj.weight): base.qweight,
// base.qzeros, base.scales and base.g_idx. found is false when the
// checkpoint has no base.qweight (or c is not quantized). Errors name the
// file and tensor.
func (c *Config) FindQuantLayer(set *safetensors.Set, weightName string) (ql *QuantLayer, found bool, err error) {
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
	return &QuantLayer{Linear: l, Out: out, In: in, File: file}, true, nil
}

// QuantLinear is FindQuantLayer's layer repacked into quant.GQ4/GQ8 rows.
func (c *Config) QuantLinear(set *safetensors.Set, weightName string) (r *quant.Repacked, found bool, err error) {
	ql, found, err := c.FindQuantLayer(set, weightName)
	if !found || err != nil {
		return nil, found, err
	}
	r, err = c.Quant.Repack(ql.Linear, ql.Out, ql.In)
	if err != nil {
		return nil, true, fmt.Errorf("%s: %v", ql.File, err)
	}
	return r, true, nil
}

// IsQuantPart reports whether hfName is a GPTQ/AWQ layer's qzeros, scales
// or g_idx beside a qweight in set (readers take those with the qweight).
func (c *Config) IsQuantPart(set *safetensors.Set, hfName string) bool {
	if c.Quant == nil {
		return false
	}
	for _, suf := range []string{".qzeros", ".scales", ".g_idx"} {
		if base, ok := strings.CutSuffix(hfName, suf); ok {
			_, ok := set.Tensor(base + ".qweight")
			return ok
		}
	}
	return false
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
