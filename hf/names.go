package hf

import (
	"fmt"
	"strconv"

	"pagoda/arch"
	"pagoda/quant"
)

// CheckLayers refuses a checkpoint holding tensors of a layer at or past
// num_hidden_layers (n): the loaders bind layers 0 to n-1 by name, so the
// surplus would be dropped without a word and a truncated model run.
func CheckLayers(names []string, n int) error {
	top, topName := -1, ""
	for _, name := range names {
		if l, _, ok := arch.SplitLayer(name, "model.layers."); ok {
			if v, err := strconv.Atoi(l); err == nil && v > top {
				top, topName = v, name
			}
		}
	}
	if top >= n {
		return fmt.Errorf("config.json does not match the tensors: num_hidden_layers is %d but the checkpoint has layer %d (%s)", n, top, topName)
	}
	return nil
}

// GGUFName maps an HF tensor name (model.layers.3.self_attn.q_proj.weight)
// to its GGUF name (blk.3.attn_q.weight) as the architecture declares it.
func (c *Config) GGUFName(hfName string) (string, bool) { return c.Decl.GGUFName(hfName) }

// HFName maps a GGUF tensor name to the HF name it is stored under.
func (c *Config) HFName(ggufName string) (string, bool) { return c.Decl.HFName(ggufName) }

// TensorType is the ggml type of a safetensors dtype the loaders read
// directly: F32, F16 or BF16.
func TensorType(dtype string) (quant.Type, bool) {
	switch dtype {
	case "F32":
		return quant.F32, true
	case "F16":
		return quant.F16, true
	case "BF16":
		return quant.BF16, true
	}
	return 0, false
}

// Unpermute reorders each head's rows from HF's rotate-half order
// [x_0..x_{h/2-1}, y_0..y_{h/2-1}] to the adjacent pairs
// [x_0, y_0, x_1, y_1, …] of ggml's "normal" rope, undoing the permutation
// llama.cpp's converter applies to llama q/k weights. data holds rows rows
// of rowBytes bytes split evenly into heads heads. It returns nil when the
// rows do not split into heads of even size or data is short.
func Unpermute(data []byte, rowBytes, rows, heads int) []byte {
	if heads <= 0 || rows <= 0 || rowBytes < 0 || rows%heads != 0 || (rows/heads)%2 != 0 || len(data)/rows < rowBytes {
		return nil
	}
	hd := rows / heads
	out := make([]byte, rows*rowBytes)
	for h := 0; h < heads; h++ {
		for i := 0; i < hd/2; i++ {
			for j := 0; j < 2; j++ {
				dst := h*hd + 2*i + j
				src := h*hd + j*(hd/2) + i
				copy(out[dst*rowBytes:(dst+1)*rowBytes], data[src*rowBytes:(src+1)*rowBytes])
			}
		}
	}
	return out
}
