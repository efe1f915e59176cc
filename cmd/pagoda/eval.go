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

// kvListHelp is --kv's help: the list grammar of eval.SplitList.
const kvListHelp = `KV configurations to evaluate, a comma list; repeatable. A configuration is items joined by '+', an item a name with optional ':key=value,...' settings: ` +
	`f16,q8_0,kivi4:r=32,kv:k=q4_0,v=q8_0,q8_0+streaming:sinks=4,window=256. A comma piece that is key=value (before any '+') continues the settings of the item before it, ` +
	`any other piece starts a new configuration, so "streaming:sinks=4,window=60+kivi4:r=32,f16" is two configurations, the first of two items. Each configuration sets each thing (format, policy, block size) at most once, ` +
	`and may be given once (default: f16,q8_0,q4_0,kivi4,kivi2, less the formats the model's head width cannot store)`

// listFlag collects the raw values of a repeatable list flag, each
// checked against the list grammar as it is given.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error {
	if _, err := eval.SplitList(s); err != nil {
		return err
	}
	*l = append(*l, s)
	return nil
}

const defaultEvalKV = "f16,q8_0,q4_0,kivi4,kivi2"

func runEval(args []string) error {
	fs := flag.NewFlagSet("eval", flag.ContinueOnError)
	modelPath := fs.String("m", "", "model: GGUF file, llama2.c .bin or Hugging Face directory (default: the built-in stories260K)")
	tokPath := fs.String("tokenizer", "", "tokenizer file overriding the model's")
	text := fs.String("text", "", "text to evaluate (BOS added as the vocabulary says); one of --text, -f, --tokens")
	file := fs.String("f", "", "file whose text to evaluate")
	tokens := fs.String("tokens", "", "token ids instead of text, e.g. \"1,403,407\"")
	var kvs listFlag
	fs.Var(&kvs, "kv", kvListHelp)
	maxTok := fs.Int("max-tokens", 0, "evaluate at most this many tokens (0 = all)")
	chunk := fs.Int("chunk", 1, "tokens per forward pass (1 = as in generation)")
	segment := fs.Int("segment", 0, "tokens per fresh cache, at least 2 (0 = the model's context length)")
	prefill := fs.Int("prefill", 0, "the first N tokens of every segment are one prompt pass (SnapKV compresses it); only the tokens after it are measured (0 = none)")
	ctxLen := fs.Int("ctx", 0, "context length (0 = the model's); a longer one lets the exact cache run past the trained context")
	curveOut := fs.String("curve", "", "also plot perplexity over bins of --curve-bin positions against position, the exact cache and every configuration, as SVG to this file")
	curveBin := fs.Int("curve-bin", 32, "positions per bin of --curve")
	savedOut := fs.String("svg-saved", "", "also plot KL against the KV memory saved (% of the exact cache's bytes), one line per series, as SVG to this file")
	budgetOut := fs.String("svg-budget", "", "also plot KL against the token budget of every budgeted policy, one line per policy, as SVG to this file")
	bosSeg := fs.Bool("bos", false, "start every segment with the vocabulary's BOS token, then segment-1 text tokens (a model trained on BOS-anchored windows sees each stream as it was trained to)")
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
	// Everything the flags alone can refuse is refused before a model
	// loads or any output file is touched.
	if *segment == 1 {
		return fmt.Errorf("--segment 1: a one-token segment predicts nothing; give at least 2 (or 0 for the model's context)")
	}
	if *segment > 0 && *prefill >= *segment {
		return fmt.Errorf("--prefill %d leaves nothing to measure in segments of --segment %d", *prefill, *segment)
	}
	in, err := readScoreInput(*tokens, *text, *file)
	if err != nil {
		return err
	}
	explicit := len(kvs) > 0
	if !explicit {
		kvs = listFlag{defaultEvalKV}
	}
	cfgs, err := eval.ParseList(kvs)
	if err != nil {
		return fmt.Errorf("--kv %w", err)
	}
	outs, err := openOutputs(*csvOut, *svgOut, *savedOut, *budgetOut, *curveOut, *mdOut)
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			outs.abort()
		}
	}()
	path, err := resolveModel(*modelPath)
	if err != nil {
		return err
	}
	m, err := openModel(path, model.Options{Tokenizer: *tokPath, Threads: *threads, ContextLen: *ctxLen})
	if err != nil {
		return err
	}
	defer m.Close()
	if cfgs, err = fitEvalConfigs(m, cfgs, explicit); err != nil {
		return err
	}
	ids, err := in.ids(m.Tokenizer())
	if err != nil {
		return err
	}
	if *bosSeg {
		bos := int32(-1)
		if tok := m.Tokenizer(); tok != nil {
			bos = tok.Vocab().BOS
		}
		if bos < 0 {
			return fmt.Errorf("--bos: the model's vocabulary has no BOS token")
		}
		ids = bosSegments(ids, bos, cmp.Or(*segment, m.Config.ContextLen))
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
		{*csvOut, func(w io.Writer) error { return writeEvalCSV(w, rep) }},
		{*svgOut, func(w io.Writer) error { return eval.WriteSVG(w, rep, title) }},
		{*savedOut, func(w io.Writer) error { return eval.WriteSavedSVG(w, rep, title) }},
		{*budgetOut, func(w io.Writer) error { return eval.WriteBudgetSVG(w, rep, title) }},
		{*curveOut, func(w io.Writer) error { return eval.WriteCurveSVG(w, rep, title, *curveBin) }},
		{*mdOut, func(w io.Writer) error { return writeEvalMarkdown(w, rep) }},
	} {
		if err := outs.write(o.path, o.write); err != nil {
			return err
		}
	}
	ok = true
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	if *jsonOut {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return writeEvalTable(out, rep)
}

// fitEvalConfigs checks every configuration's formats against m's head
// shape. A configuration the user listed that cannot fit is an error; one
// of the default list is dropped with a note, so the default run works on
// any model (q8_0 and q4_0 need head widths that are multiples of 32).
func fitEvalConfigs(m *model.Model, cfgs []eval.Config, explicit bool) ([]eval.Config, error) {
	c := m.Config
	shape := kvcache.Shape{NLayer: c.NLayer, NHead: c.NHead, NKVHead: c.NKVHead, HeadDim: c.HeadDim}
	var fit []eval.Config
	for _, cf := range cfgs {
		k, v := cmp.Or[kvcache.Format](cf.Setup.KFormat, kvcache.F32), cmp.Or[kvcache.Format](cf.Setup.VFormat, kvcache.F32)
		sz := kvcache.SizeOf(shape, k, v, cf.Setup.BlockSize)
		switch {
		case sz.Err == nil:
			fit = append(fit, cf)
		case explicit:
			return nil, fmt.Errorf("--kv %s: %w", cf.Name, sz.Err)
		default:
			fmt.Fprintf(os.Stderr, "pagoda eval: skipping %s of the default list: %v\n", cf.Name, sz.Err)
		}
	}
	if len(fit) == 0 {
		return nil, fmt.Errorf("no configuration of the default --kv list fits this model's head width %d; give --kv", c.HeadDim)
	}
	return fit, nil
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

// outputs are the files a command writes after a long run, opened before
// it so that an unwritable path fails at once, not after the work; a file
// the command created is removed again if the run fails, and one that
// existed is left as it was.
type outputs struct {
	files   map[string]*os.File
	created map[string]bool
}

func openOutputs(paths ...string) (*outputs, error) {
	o := &outputs{files: map[string]*os.File{}, created: map[string]bool{}}
	for _, p := range paths {
		if p == "" {
			continue
		}
		if _, dup := o.files[p]; dup {
			o.abort()
			return nil, fmt.Errorf("%s is named as two outputs", p)
		}
		_, statErr := os.Stat(p)
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE, 0o644)
		if err != nil {
			o.abort()
			return nil, err
		}
		o.files[p], o.created[p] = f, os.IsNotExist(statErr)
	}
	return o, nil
}

// write replaces path's contents through w and closes it; "" is no output.
func (o *outputs) write(path string, w func(io.Writer) error) error {
	f := o.files[path]
	if f == nil {
		return nil
	}
	delete(o.files, path)
	if err := f.Truncate(0); err != nil {
		f.Close()
		return err
	}
	if err := w(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// abort closes what is still open and removes the files it created.
func (o *outputs) abort() {
	for p, f := range o.files {
		f.Close()
		if o.created[p] {
			os.Remove(p)
		}
	}
	o.files = nil
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

// bosSegments lays text tokens out as segments of seg tokens that each
// begin with bos (any BOS the tokenizer already put first is dropped, so
// it is not doubled): the segments eval.Run then cuts are exactly these.
func bosSegments(ids []int32, bos int32, seg int) []int32 {
	if len(ids) > 0 && ids[0] == bos {
		ids = ids[1:]
	}
	per := max(1, seg-1)
	out := make([]int32, 0, len(ids)+len(ids)/per+1)
	for lo := 0; lo < len(ids); lo += per {
		out = append(out, bos)
		out = append(out, ids[lo:min(lo+per, len(ids))]...)
	}
	return out
}
