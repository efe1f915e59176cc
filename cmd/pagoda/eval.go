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
	prefill := fs.Int("prefill", 0, "the first N tokens of every segment are one prompt pass (SnapKV compresses it); only the tokens after it are measured (0 = none)")
	ctxLen := fs.Int("ctx", 0, "context length (0 = the model's); a longer one lets the exact cache run past the trained context")
	curveOut := fs.String("curve", "", "also plot perplexity over bins of --curve-bin positions against position, the exact cache and every configuration, as SVG to this file")
	curveBin := fs.Int("curve-bin", 32, "positions per bin of --curve")
	savedOut := fs.String("svg-saved", "", "also plot KL against the KV memory saved (% of the exact cache's bytes), one line per series, as SVG to this file")
	budgetOut := fs.String("svg-budget", "", "also plot KL against the token budget of every budgeted policy, one line per policy, as SVG to this file")
	sinkTok := fs.Int("sink-mass", 0, "also measure the attention mass the exact cache's queries (from position 64) put on the first N tokens, per layer")
	plotTitle := fs.String("title", "", "title of the plots (default: the model, tokens and prompt)")
	mdOut := fs.String("md", "", "also write the table as Markdown to this file")
	jsonOut := fs.Bool("json", false, "JSON output")
	csvOut := fs.String("csv", "", "also write the table as CSV to this file")
	svgOut := fs.String("svg", "", "also plot KL against KV bytes per token, one point per configuration, as SVG to this file")
	threads := fs.Int("threads", 0, "threads (0 = number of CPUs)")
	list := fs.Bool("list", false, "list the registered configuration items")
	if err := parseFlags(fs, args, []limit{{"threads", 0, maxThreads}, {"max-tokens", 0, inf}, {"chunk", 1, 1 << 20}, {"segment", 0, inf}, {"prefill", 0, inf}, {"ctx", 0, maxCtx}, {"curve-bin", 1, inf}, {"sink-mass", 0, inf}}); err != nil {
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
	m, err := openModel(path, model.Options{Tokenizer: *tokPath, Threads: *threads, ContextLen: *ctxLen})
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
	rep, err := eval.Run(m, ids, cfgs, eval.Options{Chunk: *chunk, Segment: *segment, Prefill: *prefill,
		PerPosition: *curveOut != "", SinkTokens: *sinkTok, Progress: func(done, t int) {
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
	title := fmt.Sprintf("%s: %d tokens", filepath.Base(path), len(ids))
	if *prefill > 0 {
		title += fmt.Sprintf(", prompt %d per segment of %d", *prefill, min(len(ids), cmp.Or(*segment, m.Config.ContextLen)))
	}
	if *plotTitle != "" {
		title = *plotTitle
	}
	for _, o := range []struct {
		path  string
		write func(io.Writer) error
	}{
		{*svgOut, func(w io.Writer) error { return eval.WriteSVG(w, rep, title) }},
		{*savedOut, func(w io.Writer) error { return eval.WriteSavedSVG(w, rep, title) }},
		{*budgetOut, func(w io.Writer) error { return eval.WriteBudgetSVG(w, rep, title) }},
		{*curveOut, func(w io.Writer) error { return eval.WriteCurveSVG(w, rep, title, *curveBin) }},
		{*mdOut, func(w io.Writer) error { return writeEvalMarkdown(w, rep) }},
	} {
		if o.path == "" {
			continue
		}
		if err := writeOut(o.path, o.write); err != nil {
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
	fmt.Fprintf(w, "%d tokens in %d segment(s), %d per forward pass", rep.Tokens, rep.Segments, rep.Chunk)
	if rep.Prefill > 0 {
		fmt.Fprintf(w, ", a %d-token prompt per segment", rep.Prefill)
	}
	fmt.Fprintf(w, "; exact cache (f32): ppl %.4f, %.1f B/token, %.0f tok/s\n", refPPL(rep), rep.RefBytesTok, rep.RefTokPerSec)
	writeSinks(w, rep)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, strings.Join(evalCols, "\t")+"\t")
	for _, r := range rep.Results {
		fmt.Fprintln(tw, strings.Join(evalRow(r), "\t")+"\t")
	}
	return tw.Flush()
}

// writeOut writes path through write, closing it either way.
func writeOut(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// writeSinks prints the attention mass on the first tokens, per layer.
func writeSinks(w io.Writer, rep *eval.Report) {
	s := rep.Sinks
	if s == nil {
		return
	}
	fmt.Fprintf(w, "attention on tokens 0-%d from queries at %d and later (exact cache; spread evenly it would be %.4f):", s.Tokens-1, s.From, s.Uniform)
	for l, m := range s.Mass {
		fmt.Fprintf(w, " layer %d %.4f", l, m)
	}
	fmt.Fprintln(w)
}

// writeEvalMarkdown writes the table as Markdown, with the memory saved
// against the exact cache.
func writeEvalMarkdown(w io.Writer, rep *eval.Report) error {
	fmt.Fprintf(w, "%d tokens in %d segment(s), %d per forward pass", rep.Tokens, rep.Segments, rep.Chunk)
	if rep.Prefill > 0 {
		fmt.Fprintf(w, ", a %d-token prompt per segment (measured: the tokens after it)", rep.Prefill)
	}
	fmt.Fprintf(w, "; exact cache (f32): ppl %.4f, %.1f B/token\n\n", refPPL(rep), rep.RefBytesTok)
	if rep.Sinks != nil {
		writeSinks(w, rep)
		fmt.Fprintln(w)
	}
	cols := append(append([]string{}, evalCols[:len(evalCols)-1]...), "saved %")
	fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(cols, " | "), strings.Repeat(" --- |", len(cols)))
	for _, r := range rep.Results {
		row := evalRow(r)
		row = append(row[:len(row)-1], strconv.FormatFloat(100*(1-r.BytesPerToken/rep.RefBytesTok), 'f', 1, 64))
		fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
	}
	fmt.Fprintln(w)
	writeQuarters(w, rep)
	return nil
}

// writeQuarters writes, for a run with per-position NLL, the perplexity
// over each quarter of the stream (of every segment, averaged position by
// position over the segments).
func writeQuarters(w io.Writer, rep *eval.Report) {
	if rep.RefNLL == nil {
		return
	}
	first := max(rep.Prefill, 1)
	per, period := len(rep.RefNLL), 0
	if rep.Segments > 1 {
		per = rep.Segment - first
		period = per
	}
	q := per / 4
	if q < 1 {
		return
	}
	fmt.Fprintf(w, "Perplexity by position of the predicted token")
	if rep.Segments > 1 {
		fmt.Fprintf(w, " (mean over the %d segments, position by position)", rep.Segments)
	}
	fmt.Fprintf(w, ":\n\n| config |")
	for i := 0; i < 4; i++ {
		fmt.Fprintf(w, " %d–%d |", first+i*q, first+(i+1)*q-1)
	}
	fmt.Fprintf(w, "\n|%s\n", strings.Repeat(" --- |", 5))
	row := func(name string, nll []float64) {
		_, y := eval.Curve(nll, q, first, period)
		fmt.Fprintf(w, "| %s |", name)
		for _, v := range y {
			fmt.Fprintf(w, " %.3f |", v)
		}
		fmt.Fprintln(w)
	}
	row("exact (full cache)", rep.RefNLL)
	for _, r := range rep.Results {
		row(r.Name, r.NLL)
	}
	fmt.Fprintln(w)
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
