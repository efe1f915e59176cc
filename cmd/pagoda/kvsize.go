package main

import (
	"flag"
	"fmt"
	"os"
	"text/tabwriter"

	"pagoda/kvcache"
	"pagoda/model"
	"pagoda/progress"
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
	dtype := fs.String("dtype", "f16", "storage format: f16, bf16, f32, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, kivi2, kivi4 (kivi options after ':')")
	block := fs.Int("block-size", 16, "paged-cache block size in tokens (0 = exact; a KIVI format uses its group)")
	list := fs.Bool("list", false, "list the named shapes")
	formats := fs.Bool("formats", false, "print bytes per token for every KV format, and the sequences of -len that fit -kv-cache-memory")
	kvMem := fs.String("kv-cache-memory", "", "with -formats: a KV budget (e.g. 16GiB) to count the sequences of -len that fit")
	if err := parseFlags(fs, args, []limit{{"batch", 1, inf}, {"len", 1, inf}, {"block-size", 0, 1 << 20}}); err != nil {
		return err
	}
	if *list {
		for _, n := range kvcache.ShapeNames() {
			fmt.Println(n)
		}
		return nil
	}
	f, err := kvcache.ParseFormat(*dtype)
	if err != nil {
		return fmt.Errorf("-dtype: %w", err)
	}
	var budget int64
	if *kvMem != "" {
		if budget, err = parseBytes(*kvMem); err != nil {
			return fmt.Errorf("--kv-cache-memory: %v", err)
		}
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
			d, ok := f.(kvcache.DType)
			if !ok {
				return fmt.Errorf("-dtype %v: an MLA model's latent cache is stored as f32, f16 or bf16 only", f)
			}
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
	if *formats {
		return formatTable(s, *batch, *length, budget)
	}
	d, ok := f.(kvcache.DType)
	if !ok {
		return quantSize(s, f, *batch, *length)
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

// quantSize reports a quantized format's bytes: codes and scales per
// token from the block pool, plus KIVI's f16 residual window.
func quantSize(s kvcache.Shape, f kvcache.Format, batch, length int) error {
	fs := kvcache.SizeOf(s, f, f, 0)
	if fs.Err != nil {
		return fmt.Errorf("-dtype %s: %w", f, fs.Err)
	}
	f16 := kvcache.SizeOf(s, kvcache.F16, kvcache.F16, 0)
	blocks := (length + fs.BlockSize - 1) / fs.BlockSize
	total := float64(batch) * (fs.BytesPerToken*float64(blocks*fs.BlockSize) + float64(fs.ResidualPerSeq))
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "model\t%s\n", s.Name)
	fmt.Fprintf(w, "layers × KV heads × head dim\t%d × %d × %d (query heads %d)\n", s.NLayer, s.NKVHead, s.HeadDim, s.NHead)
	fmt.Fprintf(w, "format\t%s (blocks of %d tokens)\n", f, fs.BlockSize)
	fmt.Fprintf(w, "bytes per token\t%.1f (%.3f× f16), scales included\n", fs.BytesPerToken, fs.BytesPerToken/f16.BytesPerToken)
	if fs.ResidualPerSeq > 0 {
		fmt.Fprintf(w, "residual per sequence\t%d bytes of f16 rows at most (%.1f MB)\n", fs.ResidualPerSeq, float64(fs.ResidualPerSeq)/1e6)
	}
	fmt.Fprintf(w, "batch × length\t%d × %d\n", batch, length)
	fmt.Fprintf(w, "total\t%.0f bytes = %.2f GB (%.2f GiB)\n", total, total/1e9, total/(1<<30))
	return w.Flush()
}

// formatTable prints every format's bytes per token on s, and with a
// budget the sequences of length tokens that fit it.
func formatTable(s kvcache.Shape, batch, length int, budget int64) error {
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(os.Stdout, "%s: %d layers × %d KV heads × head dim %d; %d × %d tokens\n", s.Name, s.NLayer, s.NKVHead, s.HeadDim, batch, length)
	hdr := "format\tblock\tbytes/token\t× f16\tresidual/seq\ttotal GB\t"
	if budget > 0 {
		hdr += fmt.Sprintf("seqs of %d in %s\t", length, progress.Bytes(budget))
	}
	fmt.Fprintln(w, hdr)
	f16 := kvcache.SizeOf(s, kvcache.F16, kvcache.F16, 0)
	for _, name := range kvcache.FormatNames() {
		f, err := kvcache.ParseFormat(name)
		if err != nil {
			return err
		}
		fs := kvcache.SizeOf(s, f, f, 0)
		if fs.Err != nil {
			fmt.Fprintf(w, "%s\t-\tn/a: head dim %d\t\t\t\t", name, s.HeadDim)
			if budget > 0 {
				fmt.Fprint(w, "\t")
			}
			fmt.Fprintln(w)
			continue
		}
		blocks := (length + fs.BlockSize - 1) / fs.BlockSize
		total := float64(batch) * (fs.BytesPerToken*float64(blocks*fs.BlockSize) + float64(fs.ResidualPerSeq))
		fmt.Fprintf(w, "%s\t%d\t%.1f\t%.3f\t%s\t%.2f\t", name, fs.BlockSize, fs.BytesPerToken, fs.BytesPerToken/f16.BytesPerToken,
			progress.Bytes(fs.ResidualPerSeq), total/1e9)
		if budget > 0 {
			n, err := fs.SeqsThatFit(budget, length)
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "%d\t", n)
		}
		fmt.Fprintln(w)
	}
	return w.Flush()
}
