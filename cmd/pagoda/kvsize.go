package main

import (
	"flag"
	"fmt"
	"os"
	"text/tabwriter"

	"pagoda/kvcache"
	"pagoda/model"
)

func init() {
	register("kv-size", "compute KV-cache bytes for a model or named shape at a batch size, length and dtype", runKVSize)
}

func runKVSize(args []string) error {
	fs := flag.NewFlagSet("kv-size", flag.ContinueOnError)
	modelPath := fs.String("m", "", "model file or directory to size")
	shapeName := fs.String("shape", "", "named shape instead of a file (add -mha for the same model without GQA), e.g. llama-2-70b, llama-2-70b-mha")
	batch := fs.Int("batch", 1, "concurrent sequences")
	length := fs.Int("len", 4096, "tokens per sequence")
	dtype := fs.String("dtype", "f16", "storage dtype: f16, bf16, f32")
	block := fs.Int("block-size", 16, "paged-cache block size in tokens (0 = exact)")
	list := fs.Bool("list", false, "list the named shapes")
	if err := parseFlags(fs, args, []limit{{"batch", 1, inf}, {"len", 1, inf}, {"block-size", 0, 1 << 20}}); err != nil {
		return err
	}
	if *list {
		for _, n := range kvcache.ShapeNames() {
			fmt.Println(n)
		}
		return nil
	}
	d, err := kvcache.ParseDType(*dtype)
	if err != nil {
		return err
	}
	var s kvcache.Shape
	switch {
	case *modelPath != "":
		m, err := model.Open(*modelPath, model.Options{Threads: 1})
		if err != nil {
			return err
		}
		c := m.Config
		m.Close()
		if c.MLA {
			return mlaSize(&c, *modelPath, d, *batch, *length, *block)
		}
		s = kvcache.Shape{Name: *modelPath, NLayer: c.NLayer, NHead: c.NHead, NKVHead: c.NKVHead, HeadDim: c.HeadDim}
	case *shapeName != "":
		if s, err = kvcache.LookupShape(*shapeName); err != nil {
			return err
		}
	default:
		return fmt.Errorf("give -m MODEL or -shape NAME (-list shows the names)")
	}
	per := kvcache.KVBytesPerToken(s, d)
	total, err := kvcache.Size(s, *batch, *length, d, *block)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "model\t%s\n", s.Name)
	fmt.Fprintf(w, "layers × KV heads × head dim\t%d × %d × %d (query heads %d)\n", s.NLayer, s.NKVHead, s.HeadDim, s.NHead)
	fmt.Fprintf(w, "dtype\t%s\n", d)
	fmt.Fprintf(w, "bytes per token\t%d (%.1f KiB)\n", per, float64(per)/1024)
	fmt.Fprintf(w, "batch × length\t%d × %d\n", *batch, *length)
	fmt.Fprintf(w, "total\t%d bytes = %.2f GB (%.2f GiB)\n", total, float64(total)/1e9, float64(total)/(1<<30))
	if s.NKVHead != s.NHead {
		mha := s
		mha.NKVHead = s.NHead
		// MHA is NHead/NKVHead times larger, so it may overflow where GQA did
		// not; the float estimate is exact enough for a report line.
		mhaBytes, err := kvcache.Size(mha, *batch, *length, d, *block)
		if err != nil {
			mhaBytes = -1
		}
		fmt.Fprintf(w, "without GQA\t%s (%.0f× more)\n", gbOrTooLarge(mhaBytes, float64(total)*float64(s.NHead)/float64(s.NKVHead)), float64(s.NHead)/float64(s.NKVHead))
	}
	return w.Flush()
}

// gbOrTooLarge formats b bytes as GB, or approx when b is negative (too
// large for an int64).
func gbOrTooLarge(b int64, approx float64) string {
	if b < 0 {
		return fmt.Sprintf("about %.3g GB (over 2^63 bytes)", approx/1e9)
	}
	return fmt.Sprintf("%.2f GB", float64(b)/1e9)
}

// mlaSize reports an MLA model's latent-only cache: one row of
// kv_lora_rank + rope values per token and layer for all heads, beside the
// multi-head equivalent (every head's K and V).
func mlaSize(c *model.Config, name string, d kvcache.DType, batch, length, block int) error {
	if batch < 0 || length < 0 || block < 0 {
		return fmt.Errorf("negative size input: batch %d, length %d, block size %d", batch, length, block)
	}
	per, mha := c.KVBytesPerToken(d.Size())
	n := int64(length)
	if block > 0 {
		n = (n + int64(block) - 1) / int64(block) * int64(block)
	}
	total := float64(per) * float64(n) * float64(batch)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "model\t%s\n", name)
	fmt.Fprintf(w, "attention\tMLA: %d layers × (kv_lora_rank %d + rope %d) latent, one row for %d heads\n", c.NLayer, c.KVLoRA, c.QKRope, c.NHead)
	fmt.Fprintf(w, "dtype\t%s\n", d)
	fmt.Fprintf(w, "bytes per token\t%d (%.1f KiB)\n", per, float64(per)/1024)
	fmt.Fprintf(w, "batch × length\t%d × %d\n", batch, length)
	fmt.Fprintf(w, "total\t%.0f bytes = %.2f GB (%.2f GiB)\n", total, total/1e9, total/(1<<30))
	fmt.Fprintf(w, "MHA equivalent\t%d bytes per token (K %d + V %d per head), %.2f GB (%.1f× more)\n",
		mha, c.QKNope+c.QKRope, c.VHeadDim, total*float64(mha)/float64(per)/1e9, float64(mha)/float64(per))
	return w.Flush()
}
