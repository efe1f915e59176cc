package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"time"

	"pagoda/medusa"
	"pagoda/model"
	"pagoda/progress"
	"pagoda/train"
)

func init() { headsTrainers["medusa"] = runHeadsMedusa }

// runHeadsMedusa is `pagoda heads train --kind medusa`: Medusa heads
// trained on the target's own samples, the target frozen.
func runHeadsMedusa(args []string) error {
	fs := flag.NewFlagSet("heads train --kind medusa", flag.ContinueOnError)
	target := fs.String("m", "", "target model (GGUF), required")
	out := fs.String("o", "", "head side file (GGUF) to write, required")
	svg := fs.String("svg", "", "loss-curve SVG (default: -o with .svg)")
	promptsFile := fs.String("prompts", "", "prompts, one per line, cycled over the samples (default: each sample starts at BOS)")
	chat := fs.Bool("chat", false, "wrap each prompt in the target's chat template as a user turn")
	samples := fs.Int("samples", 256, "samples drawn from the target")
	length := fs.Int("len", 256, "tokens per sample")
	temp := fs.Float64("temp", 1, "sampling temperature of the target's samples")
	held := fs.Float64("heldout", 0.1, "fraction of the samples kept out of training to measure accuracy on")
	seed := fs.Int64("seed", 1, "random seed (sampling, batches)")
	threads := fs.Int("threads", 0, "threads (0: one per CPU)")
	nHeads := fs.Int("heads", 4, "Medusa heads (head k guesses the token k+1 past the target's next)")
	shared := fs.Bool("shared-output", false, "heads share the target's frozen output matrix and train only their residual blocks (a smaller side file)")
	var o medusa.Options
	fs.IntVar(&o.Steps, "steps", 0, "training steps (with -time only a cap)")
	fs.DurationVar(&o.Time, "time", 0, "train for this much time, the cosine decay over it")
	fs.IntVar(&o.Batch, "batch", 32, "positions per step (each trains every head)")
	fs.Float64Var(&o.LR, "lr", 1e-3, "peak learning rate")
	fs.Float64Var(&o.MinLR, "min-lr", 1e-4, "final learning rate")
	fs.IntVar(&o.Warmup, "warmup", 20, "warm-up steps")
	fs.Float64Var(&o.WeightDecay, "wd", 0, "AdamW weight decay")
	fs.Float64Var(&o.Clip, "clip", 1, "gradient-norm bound")
	fs.IntVar(&o.TopK, "topk", 5, "ranks measured per head: the reported top-k accuracy and the tree's widest branching")
	fs.IntVar(&o.TreeNodes, "tree", 32, "nodes of the static candidate tree built from the held-out accuracies")
	evalEvery := fs.Int("eval-every", 100, "steps between held-out loss measurements (0: none)")
	if err := parseFlags(fs, args, []limit{
		{"samples", 2, 1 << 20}, {"len", 3, 1 << 16}, {"temp", 0, 10}, {"heldout", 0, 0.9}, {"threads", 0, maxThreads},
		{"heads", 1, 64}, {"steps", 0, 1 << 30}, {"time", 0, inf}, {"batch", 1, 1 << 16}, {"lr", 0, 1}, {"min-lr", 0, 1},
		{"warmup", 0, 1 << 30}, {"wd", 0, 10}, {"clip", 0, inf}, {"topk", 1, 64}, {"tree", 1, 4096}, {"eval-every", 0, 1 << 30},
	}); err != nil {
		return err
	}
	if *target == "" || *out == "" {
		return fmt.Errorf("-m TARGET.gguf and -o HEADS.gguf are required")
	}
	if o.Steps == 0 && o.Time == 0 {
		o.Steps = 1000
	}
	if *svg == "" {
		*svg = strings.TrimSuffix(*out, ".gguf") + ".svg"
	}
	if *threads == 0 {
		*threads = runtime.NumCPU()
	}
	o.Threads, o.Seed = *threads, uint64(*seed)
	sum, err := model.FileChecksum(*target)
	if err != nil {
		return err
	}
	tm, err := openModel(*target, model.Options{Threads: *threads})
	if err != nil {
		return err
	}
	defer tm.Close()
	tr, ho, err := medusaData(tm, *target, *promptsFile, *chat, *samples, *length, *temp, *held, uint64(*seed))
	if err != nil {
		return err
	}
	tout, err := medusa.TargetOutput(tm)
	if err != nil {
		return err
	}
	h, err := medusa.New(*nHeads, tm.Config.NEmbd, tm.Config.VocabSize, tout, *shared)
	if err != nil {
		return err
	}
	h.Checksum = sum
	t, err := medusa.NewTrainer(h, tr, ho, o)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "heads: %d × (residual %d×%d%s), %.2f M trainable parameters; batch %d positions, lr %g → %g\n",
		h.K, h.D, h.D, map[bool]string{true: ", shared output", false: fmt.Sprintf(" + output %d×%d", h.V, h.D)}[*shared],
		float64(len(h.Params))/1e6, o.Batch, o.LR, o.MinLR)
	if err := medusaLoop(t, *evalEvery); err != nil {
		return err
	}
	e, err := t.Finish()
	if err != nil {
		return err
	}
	medusaReport(h, e)
	if err := h.Save(*out); err != nil {
		return err
	}
	f, err := os.Create(*svg)
	if err != nil {
		return err
	}
	title := fmt.Sprintf("Medusa heads for %s: %d heads, %s positions (loss: mean over heads)", *target, h.K, progress.Count(t.Pos))
	if err := train.WriteSVG(f, t.History, title, 20); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "wrote %s (%s) and %s\n", *out, progress.Bytes(fileSize(*out)), *svg)
	return nil
}

// medusaData samples from the target and computes its features, split
// into training and held-out sequences.
func medusaData(tm *model.Model, target, promptsFile string, chat bool, samples, length int, temp, held float64, seed uint64) (*medusa.Data, *medusa.Data, error) {
	prompts, err := distillPrompts(tm, promptsFile, chat, samples)
	if err != nil {
		return nil, nil, err
	}
	t0 := time.Now()
	seqs, err := train.SampleTarget(context.Background(), tm, prompts, length, float32(temp), seed)
	if err != nil {
		return nil, nil, err
	}
	n := 0
	for _, s := range seqs {
		n += len(s)
	}
	fmt.Fprintf(os.Stderr, "sampled %d sequences (%d tokens) from %s in %v\n", len(seqs), n, target, time.Since(t0).Round(time.Millisecond))
	b := progress.New(os.Stderr, stderrIsTerminal(), "features")
	b.Verb, b.Past, b.Amount = "computing", "computed", progress.Count
	b.Start(0, int64(len(seqs)))
	d, err := medusa.Features(context.Background(), tm, seqs, func(done, total int) { b.Update(int64(done)) })
	b.FinishWith(err, fmt.Sprintf("computed the target's hidden states over %d sequences in %v", len(seqs), b.Elapsed().Round(time.Millisecond)))
	if err != nil {
		return nil, nil, err
	}
	nHeld := max(1, int(math.Round(held*float64(len(seqs)))))
	cut := len(seqs) - nHeld
	tr := &medusa.Data{D: d.D, Seqs: d.Seqs[:cut], Feats: d.Feats[:cut]}
	ho := &medusa.Data{D: d.D, Seqs: d.Seqs[cut:], Feats: d.Feats[cut:]}
	return tr, ho, nil
}

// medusaLoop trains until the schedule ends, drawing progress.
func medusaLoop(t *medusa.Trainer, evalEvery int) error {
	tty := progress.StderrIsTerminal()
	bar := progress.New(os.Stderr, tty, "medusa")
	bar.Verb, bar.Past, bar.Amount = "training", "trained", func(n int64) string { return progress.Count(n) + " pos" }
	var loss, held float64 = math.NaN(), math.NaN()
	bar.Suffix = func() string {
		s := fmt.Sprintf("step %d  loss %.3f", t.Step, loss)
		if !math.IsNaN(held) {
			s += fmt.Sprintf("  held-out %.3f", held)
		}
		return s
	}
	// The schedule may end by time: the total is what the positions so
	// far project over the whole of it.
	total := func() int64 {
		if f := t.Fraction(); f > 0 {
			return int64(float64(t.Pos) / f)
		}
		return int64(t.O.Steps * t.O.Batch)
	}
	bar.Start(0, total())
	wall := time.Now()
	for !t.Done() {
		var gn float64
		loss, gn = t.TrainStep()
		if math.IsNaN(loss) {
			return fmt.Errorf("step %d: the loss is NaN (lower -lr)", t.Step)
		}
		if evalEvery > 0 && t.Step%evalEvery == 0 {
			held = t.HeldOut()
		}
		bar.SetTotal(total())
		bar.Update(t.Pos)
		if !tty && t.Step%100 == 0 {
			fmt.Fprintf(os.Stderr, "step %d  %d pos  loss %.4f  held-out %.4f  lr %.2e  |g| %.2f  %v\n",
				t.Step, t.Pos, loss, held, t.History[len(t.History)-1].LR, gn, time.Since(wall).Round(time.Second))
		}
	}
	t.HeldOut()
	bar.FinishWith(nil, fmt.Sprintf("trained %d steps, %s positions in %v (%.0f positions/s)", t.Step, progress.Count(t.Pos),
		time.Since(wall).Round(time.Second), float64(t.Pos)/time.Since(wall).Seconds()))
	return nil
}

// medusaReport prints the held-out accuracy table and the tree.
func medusaReport(h *medusa.Heads, e *medusa.Eval) {
	fmt.Fprintf(os.Stderr, "held-out: %d positions; head 1's unigram baseline top-1 %.1f%%\n", e.N, 100*h.Info.UnigramTop1)
	fmt.Fprintf(os.Stderr, "head  guesses  positions  top-1   top-%d  loss\n", h.TopK)
	for k := range h.K {
		fmt.Fprintf(os.Stderr, "%4d  t+%-6d %9d  %5.1f%%  %5.1f%%  %.3f\n", k+1, k+2, e.PerHead[k], 100*e.Top1(k), 100*e.TopKAcc(k), e.Loss[k])
	}
	var per []int
	for i := range h.Tree.Len() {
		for len(per) < h.Tree.Depth(i) {
			per = append(per, 0)
		}
		per[h.Tree.Depth(i)-1]++
	}
	fmt.Fprintf(os.Stderr, "static tree: %d nodes, depth %d, nodes per depth %v\n", h.Tree.Len(), len(per), per)
}
