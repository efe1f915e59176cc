package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"pagoda/progress"
	"pagoda/tokenizer"
	"pagoda/train"
)

func init() {
	register("train", "train a llama-family model on a text file on the CPU (writes a GGUF checkpoint and a resumable state)", runTrain)
}

// trainFlags are the command's settings.
type trainFlags struct {
	data, heldout, vocabFrom, out, state, svg, q8 string
	vocab                                         int
	shape                                         train.Config
	untied                                        bool
	opt                                           train.Options
	threads, evalEvery, evalWindows, logEvery     int
	ckptEvery                                     time.Duration
	resume, finetune                              bool
	seed                                          int64
	set                                           map[string]bool // flags given on the command line
}

func parseTrainFlags(args []string) (*trainFlags, error) {
	fs := flag.NewFlagSet("train", flag.ContinueOnError)
	f := &trainFlags{}
	fs.StringVar(&f.data, "data", "", "training text (UTF-8), required")
	fs.StringVar(&f.heldout, "heldout", "", "held-out text for the periodic held-out loss")
	fs.StringVar(&f.vocabFrom, "vocab-from", "", "take the vocabulary of this GGUF (one `pagoda train` wrote) instead of training one")
	fs.IntVar(&f.vocab, "vocab", 2048, "size of the byte-level BPE vocabulary trained on -data")
	fs.StringVar(&f.out, "o", "", "checkpoint GGUF to write, required (loadable by pagoda run/serve/eval)")
	fs.StringVar(&f.state, "state", "", "training-state file (default: -o with .state)")
	fs.StringVar(&f.svg, "svg", "", "loss-curve SVG to write with each checkpoint (default: -o with .svg)")
	fs.StringVar(&f.q8, "q8", "", "also write the final model with Q8_0 matrices to this GGUF")
	fs.BoolVar(&f.resume, "resume", false, "continue the run in -state (its shape, vocabulary and position; -steps/-time/-lr may be changed)")
	fs.BoolVar(&f.finetune, "finetune", false, "with -resume: keep the state's weights and optimizer moments but train under this command line's options (-bos, -lr, -min-lr, -warmup, -time/-steps, ...), the schedule's warm-up and decay starting again")
	fs.BoolVar(&f.opt.BOS, "bos", false, "start every training and held-out window with <|endoftext|> (the BOS token), then seq-1 tokens from a random offset, so the model sees a fixed first token (attention sinks)")
	fs.IntVar(&f.shape.Dim, "dim", 256, "embedding size")
	fs.IntVar(&f.shape.Layers, "layers", 4, "blocks")
	fs.IntVar(&f.shape.Heads, "heads", 8, "attention heads")
	fs.IntVar(&f.shape.KVHeads, "kv-heads", 4, "KV heads (GQA)")
	fs.IntVar(&f.shape.HeadDim, "head-dim", 32, "head width")
	fs.IntVar(&f.shape.FFN, "ffn", 688, "feed-forward width")
	fs.IntVar(&f.shape.Context, "ctx", 512, "context length")
	fs.Float64Var(&f.shape.RopeTheta, "rope-theta", 10000, "RoPE base")
	fs.BoolVar(&f.untied, "untied", false, "a separate output matrix (default: tied to the embedding)")
	fs.IntVar(&f.opt.Batch, "batch", 4, "sequences per step")
	fs.IntVar(&f.opt.Seq, "seq", 0, "sequence length (default: -ctx)")
	fs.IntVar(&f.opt.Steps, "steps", 0, "steps (the schedule's length; with -time only a cap)")
	fs.DurationVar(&f.opt.Time, "time", 0, "train for this much time, the cosine decay over it (for a machine whose speed is not known in advance)")
	fs.Float64Var(&f.opt.LR, "lr", 1e-3, "peak learning rate")
	fs.Float64Var(&f.opt.MinLR, "min-lr", 1e-4, "final learning rate")
	fs.IntVar(&f.opt.Warmup, "warmup", 30, "warm-up steps")
	fs.Float64Var(&f.opt.WeightDecay, "wd", 0.1, "AdamW weight decay (matrices only)")
	fs.Float64Var(&f.opt.Clip, "clip", 1, "gradient-norm bound (0: no clipping)")
	fs.Int64Var(&f.seed, "seed", 1, "random seed (initialisation and batches)")
	fs.IntVar(&f.threads, "threads", 0, "threads (0: one per CPU)")
	fs.IntVar(&f.evalEvery, "eval-every", 100, "held-out loss every this many steps (0: only at the end)")
	fs.IntVar(&f.evalWindows, "eval-windows", 16, "held-out windows per periodic evaluation (the final one uses all)")
	fs.IntVar(&f.logEvery, "log-every", 10, "a log line every this many steps (when stderr is not a terminal)")
	fs.DurationVar(&f.ckptEvery, "checkpoint-every", 5*time.Minute, "write checkpoint, state and SVG this often")
	if err := parseFlags(fs, args, []limit{
		{"vocab", 257, 1 << 16}, {"dim", 1, 1 << 14}, {"layers", 1, 256}, {"heads", 1, 1024}, {"kv-heads", 1, 1024},
		{"head-dim", 2, 1024}, {"ffn", 1, 1 << 16}, {"ctx", 2, 1 << 16}, {"rope-theta", 1, inf}, {"batch", 1, 1 << 12},
		{"seq", 0, 1 << 16}, {"steps", 0, 1 << 30}, {"time", 0, inf}, {"lr", 0, 1}, {"min-lr", 0, 1}, {"warmup", 0, 1 << 30},
		{"wd", 0, 10}, {"clip", 0, inf}, {"threads", 0, maxThreads}, {"eval-every", 0, 1 << 30}, {"eval-windows", 1, 1 << 20},
		{"log-every", 1, 1 << 30}, {"checkpoint-every", 1, inf},
	}); err != nil {
		return nil, err
	}
	if f.data == "" || f.out == "" {
		return nil, fmt.Errorf("-data TEXT and -o CHECKPOINT.gguf are required")
	}
	if f.finetune && !f.resume {
		return nil, fmt.Errorf("-finetune continues a state: give -resume too")
	}
	f.set = map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	if f.state == "" {
		f.state = strings.TrimSuffix(f.out, ".gguf") + ".state"
	}
	if f.svg == "" {
		f.svg = strings.TrimSuffix(f.out, ".gguf") + ".svg"
	}
	if f.opt.Seq == 0 {
		f.opt.Seq = f.shape.Context
	}
	f.shape.RMSEps, f.shape.Tied = 1e-5, !f.untied
	f.opt.Seed = uint64(f.seed)
	return f, nil
}

func runTrain(args []string) error {
	f, err := parseTrainFlags(args)
	if err != nil {
		return err
	}
	r, err := startRun(f)
	if err != nil {
		return err
	}
	defer r.Model.Close()
	c, o := r.Config, r.Options
	fmt.Fprintf(os.Stderr, "model: %d layers, dim %d, %d heads × %d (%d KV), ffn %d, vocab %d, ctx %d, %.2f M parameters\n",
		c.Layers, c.Dim, c.Heads, c.HeadDim, c.KVHeads, c.FFN, c.Vocab, c.Context, float64(c.NumParams())/1e6)
	fmt.Fprintf(os.Stderr, "run: batch %d × %d, BOS-anchored windows %v, steps %d, time %v, lr %g → %g, warm-up %d, from step %d (schedule from step %d)\n",
		o.Batch, o.Seq, o.BOS, o.Steps, o.Time, o.LR, o.MinLR, o.Warmup, r.Step, r.SchedStep)
	return trainLoop(f, r)
}

// startRun reads and tokenizes the data and starts or resumes the run.
func startRun(f *trainFlags) (*train.Run, error) {
	text, err := os.ReadFile(f.data)
	if err != nil {
		return nil, err
	}
	var held []byte
	if f.heldout != "" {
		if held, err = os.ReadFile(f.heldout); err != nil {
			return nil, err
		}
	}
	var vocab *train.Vocab
	var st *train.State
	if f.resume {
		if st, err = train.LoadState(f.state); err != nil {
			return nil, err
		}
		if vocab = st.Vocab; vocab == nil {
			return nil, fmt.Errorf("%s holds no vocabulary", f.state)
		}
	} else if f.vocabFrom != "" {
		m, v, err := train.ReadGGUF(f.vocabFrom, 1)
		if err != nil {
			return nil, err
		}
		m.Close()
		if v == nil {
			return nil, fmt.Errorf("%s has no vocabulary this trainer can use (gpt2 BPE with end-of-text)", f.vocabFrom)
		}
		vocab = v
	} else {
		t0 := time.Now()
		if vocab, err = train.TrainBPE(string(text), f.vocab); err != nil {
			return nil, err
		}
		fmt.Fprintf(os.Stderr, "trained a %d-token BPE vocabulary on %s in %v\n", len(vocab.Tokens), f.data, time.Since(t0).Round(time.Millisecond))
	}
	tok, err := vocab.Tokenizer()
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	trainIDs := tok.Encode(string(text), tokenizer.Options{})
	heldIDs := tok.Encode(string(held), tokenizer.Options{})
	fmt.Fprintf(os.Stderr, "data: %d training tokens (%.2f bytes/token), %d held-out, encoded in %v\n",
		len(trainIDs), float64(len(text))/float64(max(1, len(trainIDs))), len(heldIDs), time.Since(t0).Round(time.Millisecond))
	f.opt.BOSToken = vocab.EOT
	if f.resume && f.finetune {
		o := f.opt
		if !f.set["seq"] {
			o.Seq = st.Options.Seq
		}
		if !f.set["bos"] {
			o.BOS = st.Options.BOS
		}
		return train.FineTune(st, o, trainIDs, heldIDs, f.threads)
	}
	if f.resume {
		return train.ResumeState(st, trainIDs, heldIDs, f.threads, func(o *train.Options) {
			// Only what the command line set explicitly changes a resumed run.
			if f.opt.Steps > 0 {
				o.Steps = f.opt.Steps
			}
			if f.opt.Time > 0 {
				o.Time = f.opt.Time
			}
			if f.set["bos"] {
				o.BOS, o.BOSToken = f.opt.BOS, f.opt.BOSToken
			}
		})
	}
	c := f.shape
	c.Vocab = len(vocab.Tokens)
	return train.NewRun(c, f.opt, vocab, trainIDs, heldIDs, f.threads)
}

func trainLoop(f *trainFlags, r *train.Run) error {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(stop)
	o := r.Options
	perStep := int64(o.Batch * o.Seq)
	tty := progress.StderrIsTerminal()
	bar := progress.New(os.Stderr, tty, "train")
	bar.Verb, bar.Past, bar.Amount = "training", "trained", func(n int64) string { return progress.Count(n) + " tok" }
	var loss, held float64 = math.NaN(), math.NaN()
	bar.Suffix = func() string {
		s := fmt.Sprintf("step %d  loss %.3f", r.Step, loss)
		if !math.IsNaN(held) {
			s += fmt.Sprintf("  held-out %.3f", held)
		}
		return s
	}
	// A fine-tuned run's schedule (and so its end) counts from SchedStep.
	base := r.Tokens - int64(r.Step-r.SchedStep)*perStep
	total := func() int64 {
		el := r.Elapsed - r.SchedElapsed
		if o.Time > 0 && el > 0 {
			left := float64(o.Time-el) / float64(el) * float64(r.Tokens-base)
			est := r.Tokens + int64(max(0, left))
			if o.Steps > 0 {
				est = min(est, base+int64(o.Steps)*perStep)
			}
			return est
		}
		return base + int64(o.Steps)*perStep
	}
	bar.Start(r.Tokens, total())
	wall, lastCkpt, startTokens := time.Now(), time.Now(), r.Tokens
	var interrupted bool
	for !r.Done() && !interrupted {
		var gn float64
		var err error
		if loss, gn, err = r.TrainStep(); err != nil {
			r.Save(f.state + ".failed")
			return err
		}
		if f.evalEvery > 0 && r.Step%f.evalEvery == 0 && len(r.History) > 0 {
			if held, err = r.HeldOutLoss(f.evalWindows); err == nil && !tty {
				fmt.Fprintf(os.Stderr, "step %d: held-out loss %.4f (perplexity %.2f)\n", r.Step, held, math.Exp(held))
			}
		}
		bar.SetTotal(total())
		bar.Update(r.Tokens)
		if !tty && r.Step%f.logEvery == 0 {
			el := time.Since(wall)
			rate := float64(r.Tokens-startTokens) / el.Seconds()
			eta := time.Duration(float64(total()-r.Tokens) / max(rate, 1e-9) * float64(time.Second))
			fmt.Fprintf(os.Stderr, "step %d  %s tok  loss %.4f  lr %.2e  |g| %.2f  %.0f tok/s  train time %v  ETA %v\n",
				r.Step, progress.Count(r.Tokens), loss, r.History[len(r.History)-1].LR, gn, rate,
				r.Elapsed.Round(time.Second), eta.Round(time.Second))
		}
		if time.Since(lastCkpt) >= f.ckptEvery {
			if err := checkpoint(f, r, false); err != nil {
				return err
			}
			lastCkpt = time.Now()
		}
		select {
		case <-stop:
			interrupted = true
		default:
		}
	}
	bar.FinishWith(nil, fmt.Sprintf("trained %s tokens in %v (%.0f tok/s this session)", progress.Count(r.Tokens-startTokens),
		time.Since(wall).Round(time.Second), float64(r.Tokens-startTokens)/time.Since(wall).Seconds()))
	if err := checkpoint(f, r, !interrupted); err != nil {
		return err
	}
	if interrupted {
		return errors.New("interrupted: state saved; continue with -resume")
	}
	return nil
}

// checkpoint writes the state, the GGUF and the loss curve; the final one
// also measures the held-out loss on all of the held-out data and writes
// the Q8_0 copy.
func checkpoint(f *trainFlags, r *train.Run, final bool) error {
	if final && len(r.History) > 0 {
		if l, n, err := r.EvalHeldOut(0); err == nil && n > 0 {
			last := &r.History[len(r.History)-1]
			last.HeldOut, last.HasHeldOut = l, true
			fmt.Fprintf(os.Stderr, "held-out loss %.4f nats/token (perplexity %.2f) over %d windows of %d tokens\n", l, math.Exp(l), n, r.Options.Seq)
		}
	}
	if err := r.Save(f.state); err != nil {
		return err
	}
	name := fmt.Sprintf("pagoda-train step %d", r.Step)
	v := *r.Vocab
	v.AddBOS = r.Options.BOS // prompts then start with BOS as the windows did
	if err := r.Model.WriteGGUF(f.out, name, &v, false); err != nil {
		return err
	}
	if final && f.q8 != "" {
		if err := r.Model.WriteGGUF(f.q8, name, &v, true); err != nil {
			return err
		}
	}
	if len(r.History) > 0 {
		sf, err := os.Create(f.svg)
		if err != nil {
			return err
		}
		c := r.Config
		title := fmt.Sprintf("%.1fM-parameter llama (%d×%d, %d heads of %d), batch %d×%d, %s tokens",
			float64(c.NumParams())/1e6, c.Layers, c.Dim, c.Heads, c.HeadDim, r.Options.Batch, r.Options.Seq, progress.Count(r.Tokens))
		err = train.WriteSVG(sf, r.History, title, 20)
		if cerr := sf.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "checkpoint: %s (step %d), state %s, curve %s\n", f.out, r.Step, f.state, f.svg)
	return nil
}
