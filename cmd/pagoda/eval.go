package main

import (
	"bufio"
	"cmp"
	"encoding/csv"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"pagoda/eval"
	"pagoda/kvcache"
	"pagoda/model"
	"pagoda/progress"
)

func init() {
	register("eval", "compare KV-cache configurations teacher-forced against the exact cache: KL, top-1, perplexity, bytes/token, speed", runEval)
}

// listFlag collects a repeatable flag whose values may also be comma lists.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error {
	*l = append(*l, eval.SplitList(s)...)
	return nil
}

func runEval(args []string) error {
	fs := flag.NewFlagSet("eval", flag.ContinueOnError)
	modelPath := fs.String("m", "", "model: GGUF file, llama2.c .bin or Hugging Face directory (default: the built-in stories260K)")
	tokPath := fs.String("tokenizer", "", "tokenizer file overriding the model's")
	text := fs.String("text", "", "text to evaluate (BOS added as the vocabulary says)")
	file := fs.String("f", "", "file whose text to evaluate")
	tokens := fs.String("tokens", "", "token ids instead of text, e.g. \"1,403,407\"")
	var kvs listFlag
	fs.Var(&kvs, "kv", "KV configuration to evaluate; repeat or give a comma list: f16,q8_0,q4_0,kivi2,kivi4:r=32,kv:k=q4_0,v=q8_0 (items joined with '+')")
	maxTok := fs.Int("max-tokens", 0, "evaluate at most this many tokens (0 = all)")
	chunk := fs.Int("chunk", 1, "tokens per forward pass (1 = as in generation)")
	segment := fs.Int("segment", 0, "tokens per fresh cache (0 = the model's context length)")
	jsonOut := fs.Bool("json", false, "JSON output")
	csvOut := fs.String("csv", "", "also write the table as CSV to this file")
	svgOut := fs.String("svg", "", "also plot KL against KV bytes per token, one point per configuration, as SVG to this file")
	threads := fs.Int("threads", 0, "threads (0 = number of CPUs)")
	list := fs.Bool("list", false, "list the registered configuration items")
	if err := parseFlags(fs, args, []limit{{"threads", 0, maxThreads}, {"max-tokens", 0, inf}, {"chunk", 1, 1 << 20}, {"segment", 0, inf}}); err != nil {
		return err
	}
	if *list {
		for _, s := range eval.Registered() {
			fmt.Println(s)
		}
		fmt.Println("any KV format: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, kivi2, kivi4 (kivi options g=, r=, k=channel|token, v=token|channel, vg=)")
		return nil
	}
	if len(kvs) == 0 {
		kvs = eval.SplitList("f16,q8_0,q4_0,kivi4,kivi2")
	}
	var cfgs []eval.Config
	for _, s := range kvs {
		c, err := eval.Parse(s)
		if err != nil {
			return fmt.Errorf("--kv %s: %w", s, err)
		}
		cfgs = append(cfgs, c)
	}
	path, err := resolveModel(*modelPath)
	if err != nil {
		return err
	}
	m, err := openModel(path, model.Options{Tokenizer: *tokPath, Threads: *threads})
	if err != nil {
		return err
	}
	defer m.Close()
	c := m.Config
	shape := kvcache.Shape{NLayer: c.NLayer, NHead: c.NHead, NKVHead: c.NKVHead, HeadDim: c.HeadDim}
	for _, cf := range cfgs {
		k, v := cmp.Or[kvcache.Format](cf.Setup.KFormat, kvcache.F32), cmp.Or[kvcache.Format](cf.Setup.VFormat, kvcache.F32)
		if sz := kvcache.SizeOf(shape, k, v, cf.Setup.BlockSize); sz.Err != nil {
			return fmt.Errorf("--kv %s: %w", cf.Name, sz.Err)
		}
	}
	ids, err := inputTokens(m.Tokenizer(), *tokens, *text, *file)
	if err != nil {
		return err
	}
	if *maxTok > 0 && len(ids) > *maxTok {
		ids = ids[:*maxTok]
	}
	bar := progress.New(os.Stderr, stderrIsTerminal(), filepath.Base(path))
	bar.Verb, bar.Past, bar.Amount, bar.Delay = "evaluating", "evaluated", progress.Count, time.Second
	bar.Start(0, -1)
	var total int64
	rep, err := eval.Run(m, ids, cfgs, eval.Options{Chunk: *chunk, Segment: *segment, Progress: func(done, t int) {
		if total == 0 {
			total = int64(t)
			bar.SetTotal(total)
		}
		bar.Update(int64(done))
	}})
	bar.FinishWith(err, fmt.Sprintf("evaluated %d tokens × %d configurations in %s", len(ids), len(cfgs)+1, bar.Elapsed().Round(time.Millisecond)))
	if err != nil {
		return err
	}
	if *csvOut != "" {
		f, err := os.Create(*csvOut)
		if err != nil {
			return err
		}
		if err := writeEvalCSV(f, rep); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	if *svgOut != "" {
		f, err := os.Create(*svgOut)
		if err != nil {
			return err
		}
		if err := eval.WriteSVG(f, rep, fmt.Sprintf("%s: %d tokens", filepath.Base(path), len(ids))); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	if *jsonOut {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return writeEvalTable(out, rep)
}

var evalCols = []string{"config", "K", "V", "KL mean", "KL max", "top-1 %", "ppl", "Δppl", "B/token", "peak KiB", "tok/s"}

func evalRow(r eval.Result) []string {
	return []string{r.Name, r.KFormat, r.VFormat,
		strconv.FormatFloat(r.KLMean, 'g', 4, 64), strconv.FormatFloat(r.KLMax, 'g', 4, 64),
		strconv.FormatFloat(100*r.Top1, 'f', 2, 64), strconv.FormatFloat(r.PPL, 'f', 4, 64),
		strconv.FormatFloat(r.DeltaPPL, 'f', 4, 64), strconv.FormatFloat(r.BytesPerToken, 'f', 1, 64),
		strconv.FormatFloat(float64(r.PeakBytes)/1024, 'f', 1, 64), strconv.FormatFloat(r.TokensPerSec, 'f', 0, 64)}
}

func writeEvalTable(w io.Writer, rep *eval.Report) error {
	fmt.Fprintf(w, "%d tokens in %d segment(s), %d per forward pass; exact cache (f32): ppl %.4f, %.1f B/token, %.0f tok/s\n",
		rep.Tokens, rep.Segments, rep.Chunk, refPPL(rep), rep.RefBytesTok, rep.RefTokPerSec)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, strings.Join(evalCols, "\t")+"\t")
	for _, r := range rep.Results {
		fmt.Fprintln(tw, strings.Join(evalRow(r), "\t")+"\t")
	}
	return tw.Flush()
}

func refPPL(rep *eval.Report) float64 {
	if len(rep.Results) == 0 {
		return 0
	}
	return rep.Results[0].RefPPL
}

func writeEvalCSV(w io.Writer, rep *eval.Report) error {
	cw := csv.NewWriter(w)
	cw.Write([]string{"config", "k_format", "v_format", "kl_mean", "kl_max", "top1", "ppl", "ref_ppl", "bytes_per_token", "peak_bytes", "tokens_per_sec"})
	g := func(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }
	for _, r := range rep.Results {
		cw.Write([]string{r.Name, r.KFormat, r.VFormat, g(r.KLMean), g(r.KLMax), g(r.Top1), g(r.PPL), g(r.RefPPL),
			g(r.BytesPerToken), strconv.FormatInt(r.PeakBytes, 10), g(r.TokensPerSec)})
	}
	cw.Flush()
	return cw.Error()
}
