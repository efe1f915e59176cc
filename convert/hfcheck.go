package convert

import (
	"fmt"
	"slices"
	"strconv"

	"pagoda/arch"
	"pagoda/hf"
)

// checkHFShapes holds a Hugging Face checkpoint's tensors to what its
// config.json declares: every tensor the architecture needs at those
// sizes present with the declared shape, and no layer past
// num_hidden_layers. Without it a config edited or mismatched (another
// hidden_size, a layer fewer) converts into a GGUF that fails to load,
// or, with surplus layers dropped, one that runs a truncated model.
func checkHFShapes(hc *hf.Config, d arch.Dims, ts []*srcTensor) error {
	fail := func(format string, a ...any) error {
		return fmt.Errorf("config.json does not match the tensors: "+format, a...)
	}
	have := make(map[string]*srcTensor, len(ts))
	top, topName := -1, "" // the highest layer the checkpoint holds
	for _, t := range ts {
		have[t.name] = t
		if l, _, ok := arch.SplitLayer(t.name, "blk."); ok {
			if n, _ := strconv.Atoi(l); n > top {
				top, topName = n, t.name
			}
		}
	}
	if top >= hc.NumLayers {
		return fail("num_hidden_layers is %d but the checkpoint has layer %d (%s)", hc.NumLayers, top, hfName(hc, topName))
	}
	for _, want := range hc.Decl.Tensors(d, hc.NumLayers) {
		t := have[want.Name]
		if t == nil {
			if want.Optional {
				continue
			}
			if want.Layer > top {
				return fail("num_hidden_layers is %d but the checkpoint has no layer %d (%s missing)", hc.NumLayers, want.Layer, hfName(hc, want.Name))
			}
			return fail("%s is missing", hfName(hc, want.Name))
		}
		shape := want.Shape(d)
		if got := dimsInts(t.dims); !slices.Equal(got, shape) {
			return fail("%s has shape %v, but %s", hfName(hc, want.Name), hfShape(got), explainShape(hc, d, have, want.Tensor, got, shape))
		}
	}
	return nil
}

// explainShape names the config setting that, changed alone, would give
// every tensor the shape it has (else this one tensor); failing that, the
// settings in force.
func explainShape(hc *hf.Config, d arch.Dims, have map[string]*srcTensor, t arch.Tensor, got, want []int) string {
	settings := []struct {
		key string
		f   *int
	}{
		{"hidden_size", &d.Embd}, {"intermediate_size", &d.FFN}, {"num_attention_heads", &d.Heads},
		{"num_key_value_heads", &d.KVHeads}, {"head_dim", &d.HeadDim},
	}
	allFit := func() bool {
		for _, w := range hc.Decl.Tensors(d, hc.NumLayers) {
			if h := have[w.Name]; h != nil && !slices.Equal(dimsInts(h.dims), w.Shape(d)) {
				return false
			}
		}
		return true
	}
	local := ""
	for _, s := range settings {
		was := *s.f
		for v := 1; v <= slices.Max(got) && v <= 1<<20; v++ {
			*s.f = v
			if !slices.Equal(t.Shape(d), got) {
				continue
			}
			fit := fmt.Sprintf("%s is %d, which makes it %v (%s %d would fit)", s.key, was, hfShape(want), s.key, v)
			if allFit() {
				return fit
			}
			if local == "" {
				local = fit
			}
		}
		*s.f = was
	}
	if local != "" {
		return local
	}
	return fmt.Sprintf("hidden_size %d, intermediate_size %d, num_attention_heads %d, num_key_value_heads %d and head_dim %d make it %v",
		d.Embd, d.FFN, d.Heads, d.KVHeads, d.HeadDim, hfShape(want))
}

func hfName(hc *hf.Config, gguf string) string {
	if n, ok := hc.Decl.HFName(gguf); ok {
		return n
	}
	return gguf
}

func dimsInts(d []uint64) []int {
	out := make([]int, len(d))
	for i, v := range d {
		out[i] = int(v)
	}
	return out
}

// hfShape is a ggml shape (row length first) as Hugging Face writes it.
func hfShape(ggml []int) []int {
	out := slices.Clone(ggml)
	slices.Reverse(out)
	return out
}
