package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"pagoda/eagle"
	"pagoda/model"
	"pagoda/progress"
	"pagoda/train"
)

func init() { headsTrainers["eagle"] = runHeadsEagle }

// runHeadsEagle trains an EAGLE draft layer for a target on the target's
// own samples: `pagoda heads train --kind eagle -m TARGET -o OUT.gguf`.
func runHeadsEagle(args []string) error {
	fs := flag.NewFlagSet("heads train --kind eagle", flag.ContinueOnError)
	target := fs.String("m", "", "target model, required")
	out := fs.String("o", "", "EAGLE side file (GGUF) to write, required")
	svg := fs.String("svg", "", "loss curve SVG to write")
	samples := fs.Int("samples", 256, "sequences sampled from the target for training")
	heldN := fs.Int("heldout", 24, "further sequences sampled for the held-out accuracy")
	length := fs.Int("len", 256, "tokens per sequence")
	temp := fs.Float64("temp", 1, "sampling temperature")
	threads := fs.Int("threads", 2, "threads")
	o := eagle.DefaultTrainOptions()
	var seed int64
	fs.Int64Var(&seed, "seed", 1, "random seed (sampling, initialisation, batches)")
	fs.IntVar(&o.FFN, "ffn", 0, "draft FFN width (0: the target's)")
	fs.IntVar(&o.Steps, "steps", o.Steps, "optimizer steps")
	fs.IntVar(&o.Batch, "batch", o.Batch, "sequences per step")
	fs.Float64Var(&o.LR, "lr", o.LR, "peak learning rate")
	fs.Float64Var(&o.MinLR, "min-lr", o.MinLR, "final learning rate")
	fs.IntVar(&o.Warmup, "warmup", o.Warmup, "warm-up steps")
	fs.Float64Var(&o.WeightDecay, "wd", o.WeightDecay, "AdamW weight decay")
	fs.Float64Var(&o.Clip, "clip", o.Clip, "gradient-norm bound")
	fs.Float64Var(&o.WCls, "w-cls", o.WCls, "classification loss weight (EAGLE: 0.1)")
	fs.Float64Var(&o.Noise, "noise", o.Noise, "uniform feature noise, relative to the mean |feature|")
	fs.IntVar(&o.Depths, "depths", o.Depths, "draft depths to measure held-out accuracy at")
	if err := parseFlags(fs, args, []limit{
		{"samples", 1, 1 << 20}, {"heldout", 1, 1 << 16}, {"len", 2, 1 << 16}, {"temp", 0, 10}, {"threads", 1, maxThreads},
		{"ffn", 0, 1 << 16}, {"steps", 1, 1 << 30}, {"batch", 1, 1 << 12}, {"lr", 0, 1}, {"min-lr", 0, 1},
		{"warmup", 0, 1 << 30}, {"wd", 0, 10}, {"clip", 0, inf}, {"w-cls", 0, 100}, {"noise", 0, 10}, {"depths", 1, 64},
	}); err != nil {
		return err
	}
	if *target == "" || *out == "" {
		return fmt.Errorf("heads train --kind eagle: -m TARGET and -o OUT.gguf are required")
	}
	o.Seed, o.Threads = uint64(seed), *threads
	sum, err := model.FileChecksum(*target)
	if err != nil {
		return err
	}
	tm, err := model.Open(*target, model.Options{Threads: *threads})
	if err != nil {
		return err
	}
	defer tm.Close()
	tty := stderrIsTerminal()
	bar := progress.New(os.Stderr, tty, "sample")
	bar.Verb, bar.Past, bar.Amount = "sampling from", "sampled", progress.Count
	bar.Start(0, int64(*samples+*heldN))
	t0 := time.Now()
	ctx := context.Background()
	data, err := eagle.Sample(ctx, tm, *samples, *length, float32(*temp), uint64(seed), func(n int) { bar.Update(int64(n)) })
	if err != nil {
		bar.Finish(err)
		return err
	}
	held, err := eagle.Sample(ctx, tm, *heldN, *length, float32(*temp), uint64(seed)+1<<32, func(n int) { bar.Update(int64(*samples + n)) })
	bar.FinishWith(err, fmt.Sprintf("sampled %d+%d sequences (%d tokens) in %v", *samples, *heldN, data.Tokens()+held.Tokens(), time.Since(t0).Round(time.Second)))
	if err != nil {
		return err
	}
	sampleTime := time.Since(t0)
	tb := progress.New(os.Stderr, tty, "train")
	tb.Verb, tb.Past, tb.Amount = "training", "trained", progress.Count
	tb.Start(0, int64(o.Steps))
	var last float64
	o.Progress = func(step int, loss float64) {
		last = loss
		tb.Update(int64(step + 1))
		if !tty && (step+1)%50 == 0 {
			fmt.Fprintf(os.Stderr, "step %d: loss %.4f\n", step+1, loss)
		}
	}
	res, err := eagle.Train(tm, sum, data, held, o)
	tb.FinishWith(err, fmt.Sprintf("trained %d steps (final loss %.4f)", o.Steps, last))
	if err != nil {
		return err
	}
	defer res.Draft.Close()
	s := res.Draft.Shape
	fmt.Fprintf(os.Stderr, "draft: %v, %.2f M parameters\n", s, float64(len(res.Draft.Params))/1e6)
	fmt.Fprintf(os.Stderr, "sampling %v, training %v on %d token positions (%.0f/s)\n", sampleTime.Round(time.Second),
		res.Elapsed.Round(time.Second), res.TrainTokens, float64(res.TrainTokens)/res.Elapsed.Seconds())
	var accs []string
	for i, a := range res.Accuracy {
		accs = append(accs, fmt.Sprintf("depth %d %.1f%%", i+1, 100*a))
	}
	fmt.Fprintf(os.Stderr, "held-out top-1 agreement with the target's greedy token: %s (unigram baseline %.1f%%)\n",
		strings.Join(accs, ", "), 100*res.Unigram)
	if err := res.Draft.Save(*out, eagle.SaveInfo{Name: "eagle draft for " + *target, TrainTokens: res.TrainTokens, Unigram: res.Unigram}); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "wrote %s (%s)\n", *out, progress.Bytes(fileSize(*out)))
	if *svg != "" {
		f, err := os.Create(*svg)
		if err != nil {
			return err
		}
		title := fmt.Sprintf("EAGLE draft for %s: smooth-L1 + %.1f·CE", *target, o.WCls)
		if err := train.WriteSVG(f, res.Hist, title, 20); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	return nil
}
