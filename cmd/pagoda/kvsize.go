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
