package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"

	"pagoda/convert"
	"pagoda/quant"
)

func init() {
	register("quantize", "quantize a model (GGUF, llama2.c .bin or HF dir) to a GGUF of another type, with llama.cpp's tensor mixes", runQuantize)
	register("convert", "convert a llama2.c .bin or Hugging Face directory to GGUF as stored", runConvert)
}

// parseInterspersed parses flags that may come before, between or after
// the positional arguments (as in llama-quantize) and returns the
// positionals.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	return pos, nil
}

func runQuantize(args []string) error {
	fs := flag.NewFlagSet("quantize", flag.ContinueOnError)
	typ := fs.String("type", "", "target file type: Q8_0, Q4_0, Q4_K_M, Q5_K_S, Q6_K, F16, … (required)")
	pure := fs.Bool("pure", false, "every 2-D weight in the target type (no llama.cpp mix)")
	outType := fs.String("output-type", "", "type of output.weight (default: per the mix)")
	embdType := fs.String("embd-type", "", "type of token_embd.weight (default: per the mix)")
	requant := fs.Bool("allow-requantize", false, "allow quantizing already-quantized tensors (loses quality)")
	tok := fs.String("tokenizer", "", "tokenizer to embed when the input has none")
	threads := fs.Int("threads", 0, "threads (0 = number of CPUs)")
	dry := fs.Bool("dry-run", false, "print the per-tensor plan and exit")
	limits := []limit{{"threads", 0, maxThreads}}
	annotateLimits(fs, limits)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if err := checkLimits(fs, limits); err != nil {
		return err
	}
	if len(pos) != 2 || *typ == "" {
		return fmt.Errorf("usage: pagoda quantize IN OUT -type TYPE [flags]")
	}
	t, mix, err := convert.ParseFileType(*typ)
	if err != nil {
		return err
	}
	o := convert.QuantizeOptions{Type: t, Mix: mix, AllowRequantize: *requant, Tokenizer: *tok, Threads: *threads}
	if *pure {
		o.Mix = "pure"
	}
	if *outType != "" {
		if o.OutputType, err = quant.ParseType(*outType); err != nil {
			return err
		}
	}
	if *embdType != "" {
		if o.EmbeddingType, err = quant.ParseType(*embdType); err != nil {
			return err
		}
	}
	if *dry {
		plan, err := convert.Plan(pos[0], o)
		if err != nil {
			return err
		}
		w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
		var total int64
		for _, p := range plan {
			fmt.Fprintf(w, "%s\t%v\t%s → %s\t%d\n", p.Name, p.Dims, p.From, p.To, p.Bytes)
			total += int64(p.Bytes)
		}
		fmt.Fprintf(w, "total\t\t\t%d (%.1f MB)\n", total, float64(total)/1e6)
		return w.Flush()
	}
	update, finish := tensorBar("quantizing", "quantized", pos[1])
	o.Progress = update
	err = convert.Quantize(pos[0], pos[1], o)
	var re *convert.RequantizeError
	if errors.As(err, &re) {
		err = fmt.Errorf("%s is already quantized (%s is %s): quantizing it again loses quality; pass --allow-requantize to do it anyway, or quantize an F16 or F32 file", pos[0], re.Tensor, re.Type)
	}
	finish(err)
	return err
}

func runConvert(args []string) error {
	fs := flag.NewFlagSet("convert", flag.ContinueOnError)
	tok := fs.String("tokenizer", "", "tokenizer to embed (GGUF, llama2.c tokenizer.bin, tokenizer.json)")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return fmt.Errorf("usage: pagoda convert IN OUT [-tokenizer FILE]")
	}
	update, finish := tensorBar("converting", "converted", pos[1])
	err = convert.ToGGUF(pos[0], pos[1], convert.ConvertOptions{Tokenizer: *tok, Progress: update})
	finish(err)
	return err
}
