package convert

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"pagoda/gguf"
	"pagoda/quant"
	"pagoda/testutil"
)

// TestGoldenPure quantizes the golden F32 model with the pure mix to every
// type the golden folder holds (made by `llama-quantize --pure` from that
// file) and wants llama.cpp's bytes for every tensor, its metadata and its
// tensor order.
func TestGoldenPure(t *testing.T) {
	type tc struct {
		model string
		typ   quant.Type
	}
	var cases []tc
	for _, typ := range []quant.Type{quant.Q8_0, quant.Q4_0, quant.Q4_1, quant.Q5_0, quant.Q5_1,
		quant.Q2_K, quant.Q3_K, quant.Q4_K, quant.Q5_K, quant.Q6_K, quant.F16, quant.BF16} {
		cases = append(cases, tc{"g-llama-gqa", typ})
	}
	// More shapes: q/k/v biases; tied output with per-head norms.
	cases = append(cases, tc{"g-qwen2", quant.Q4_K}, tc{"g-qwen3", quant.Q8_0})
	// Mixture of experts (3-D expert tensors, the router left F32) and MLA.
	for _, m := range []string{"g-qwen2moe", "g-qwen3moe", "g-mixtral", "g-deepseek2"} {
		cases = append(cases, tc{m, quant.Q8_0})
	}
	dir := t.TempDir()
	for _, c := range cases {
		t.Run(c.model+"."+c.typ.String(), func(t *testing.T) {
			in := testutil.Shared(t, "golden/models/"+c.model+".F32.gguf")
			ref := testutil.Shared(t, "golden/models/"+c.model+"."+c.typ.String()+".gguf")
			out := filepath.Join(dir, c.model+"."+c.typ.String()+".gguf")
			if err := Quantize(in, out, QuantizeOptions{Type: c.typ, Mix: "pure", Threads: 2}); err != nil {
				t.Fatal(err)
			}
			// Same metadata, order, alignment and bytes: the whole file
			// is llama-quantize's.
			gb, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			wb, err := os.ReadFile(ref)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(gb, wb) {
				t.Errorf("file differs from llama-quantize's (%d vs %d bytes); details follow", len(gb), len(wb))
			}
			got, want := readGGUF(t, out), readGGUF(t, ref)
			if len(got.Tensors) != len(want.Tensors) {
				t.Fatalf("%d tensors, want %d", len(got.Tensors), len(want.Tensors))
			}
			for i, wt := range want.Tensors {
				gt := got.Tensors[i]
				if gt.Name != wt.Name || gt.Type != wt.Type || !reflect.DeepEqual(gt.Dims, wt.Dims) {
					t.Errorf("tensor %d: %s %s %v, want %s %s %v", i, gt.Name, gt.Type, gt.Dims, wt.Name, wt.Type, wt.Dims)
					continue
				}
				if !bytes.Equal(gt.Data, wt.Data) {
					t.Errorf("tensor %s (%s): data differs from llama-quantize", wt.Name, wt.Type)
				}
			}
			if len(got.KV) != len(want.KV) {
				t.Fatalf("%d metadata entries, want %d", len(got.KV), len(want.KV))
			}
			for i := range want.KV {
				if got.KV[i].Key != want.KV[i].Key || !reflect.DeepEqual(got.KV[i].Value, want.KV[i].Value) {
					t.Errorf("metadata %d: %s = %v, want %s = %v", i, got.KV[i].Key, got.KV[i].Value, want.KV[i].Key, want.KV[i].Value)
				}
			}
		})
	}
}

func readGGUF(t *testing.T, path string) *gguf.File {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}
