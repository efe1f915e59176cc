package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"strings"
	"time"

	"pagoda/jinja"
	"pagoda/model"
	"pagoda/tokenizer"
	"pagoda/train"
)

func init() {
	register("distill", "train a small draft model for speculative decoding from a target's own samples (target: a GGUF)", runDistill)
}

func runDistill(args []string) error {
	fs := flag.NewFlagSet("distill", flag.ContinueOnError)
	target := fs.String("m", "", "target model (GGUF), required")
	out := fs.String("o", "", "draft GGUF to write, required")
	promptsFile := fs.String("prompts", "", "prompts, one per line, cycled over the samples (default: each sample starts at BOS)")
	chat := fs.Bool("chat", false, "wrap each prompt in the target's chat template as a user turn")
	samples := fs.Int("samples", 256, "samples drawn from the target")
	length := fs.Int("len", 256, "tokens per sample")
	temp := fs.Float64("temp", 1, "sampling temperature (1: the target's distribution, which the draft's loss then matches in KL)")
	held := fs.Float64("heldout", 0.1, "fraction of the samples kept out of training to measure agreement on")
	seed := fs.Int64("seed", 1, "random seed (sampling, initialisation, batches)")
	threads := fs.Int("threads", 0, "threads (0: one per CPU)")
	c := train.Config{RMSEps: 1e-5, Tied: true}
	fs.IntVar(&c.Dim, "dim", 128, "draft embedding size")
	fs.IntVar(&c.Layers, "layers", 2, "draft blocks")
	fs.IntVar(&c.Heads, "heads", 4, "draft attention heads")
	fs.IntVar(&c.KVHeads, "kv-heads", 2, "draft KV heads")
	fs.IntVar(&c.HeadDim, "head-dim", 32, "draft head width")
	fs.IntVar(&c.FFN, "ffn", 344, "draft feed-forward width")
	var o train.Options
	fs.IntVar(&o.Steps, "steps", 300, "training steps")
	fs.IntVar(&o.Batch, "batch", 8, "sequences per step")
	fs.IntVar(&o.Seq, "seq", 128, "training sequence length")
	fs.Float64Var(&o.LR, "lr", 2e-3, "peak learning rate")
	fs.Float64Var(&o.MinLR, "min-lr", 2e-4, "final learning rate")
	fs.IntVar(&o.Warmup, "warmup", 20, "warm-up steps")
	fs.Float64Var(&o.WeightDecay, "wd", 0.1, "AdamW weight decay")
	fs.Float64Var(&o.Clip, "clip", 1, "gradient-norm bound")
	if err := parseFlags(fs, args, []limit{
		{"samples", 2, 1 << 20}, {"len", 1, 1 << 16}, {"temp", 0, 10}, {"heldout", 0, 0.9}, {"threads", 0, maxThreads},
		{"dim", 1, 1 << 14}, {"layers", 1, 256}, {"heads", 1, 1024}, {"kv-heads", 1, 1024}, {"head-dim", 2, 1024}, {"ffn", 1, 1 << 16},
		{"steps", 1, 1 << 30}, {"batch", 1, 1 << 12}, {"seq", 2, 1 << 16}, {"lr", 0, 1}, {"min-lr", 0, 1}, {"warmup", 0, 1 << 30},
		{"wd", 0, 10}, {"clip", 0, inf},
	}); err != nil {
		return err
	}
	if *target == "" || *out == "" {
		return fmt.Errorf("-m TARGET.gguf and -o DRAFT.gguf are required")
	}
	meta, err := train.TokenizerMeta(*target)
	if err != nil {
		return err
	}
	tm, err := model.Open(*target, model.Options{Threads: *threads})
	if err != nil {
		return err
	}
	defer tm.Close()
	prompts, err := distillPrompts(tm, *promptsFile, *chat, *samples)
	if err != nil {
		return err
	}
	t0 := time.Now()
	seqs, err := train.SampleTarget(context.Background(), tm, prompts, *length, float32(*temp), uint64(*seed))
	if err != nil {
		return err
	}
	nHeld := max(1, int(math.Round(*held*float64(len(seqs)))))
	trainSeqs, heldSeqs := seqs[:len(seqs)-nHeld], seqs[len(seqs)-nHeld:]
	var stream []int32
	for _, s := range trainSeqs {
		stream = append(stream, s...)
	}
	fmt.Fprintf(os.Stderr, "sampled %d sequences (%d tokens) from %s in %v\n", len(seqs), len(stream), *target, time.Since(t0).Round(time.Millisecond))
	c.Vocab, c.Context, c.RopeTheta = tm.Config.VocabSize, tm.Config.ContextLen, tm.Config.RopeTheta
	o.Seed = uint64(*seed)
	o.Seq = min(o.Seq, c.Context)
	var heldStream []int32
	for _, s := range heldSeqs {
		heldStream = append(heldStream, s...)
	}
	r, err := train.NewRun(c, o, nil, stream, heldStream, *threads)
	if err != nil {
		return err
	}
	defer r.Model.Close()
	fmt.Fprintf(os.Stderr, "draft: %d layers, dim %d, %d heads × %d (%d KV), ffn %d, %.2f M parameters (target %.2f M)\n",
		c.Layers, c.Dim, c.Heads, c.HeadDim, c.KVHeads, c.FFN, float64(c.NumParams())/1e6, float64(tm.Config.Params())/1e6)
	t0 = time.Now()
	var loss float64
	for !r.Done() {
		if loss, _, err = r.TrainStep(); err != nil {
			return err
		}
		if r.Step%50 == 0 || r.Done() {
			hl, _ := r.HeldOutLoss(16)
			fmt.Fprintf(os.Stderr, "step %d: loss %.4f, held-out %.4f\n", r.Step, loss, hl)
		}
	}
	fmt.Fprintf(os.Stderr, "trained in %v (%.0f tok/s)\n", time.Since(t0).Round(time.Millisecond), float64(r.Tokens)/time.Since(t0).Seconds())
	agree, n, err := train.GreedyAgreement(tm, r.Model, heldSeqs)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "greedy agreement with the target: %.1f%% of %d held-out sampled positions\n", 100*agree, n)
	if err := r.Model.WriteGGUFMeta(*out, "pagoda-distill draft", meta, false); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "wrote %s\n", *out)
	return nil
}

// distillPrompts is n prompts: the lines of file cycled (in the chat
// template when chat is set), or BOS alone.
func distillPrompts(m *model.Model, file string, chat bool, n int) ([][]int32, error) {
	tok := m.Tokenizer()
	if file == "" {
		bos := tok.Vocab().BOS
		if bos < 0 {
			return nil, fmt.Errorf("the target's vocabulary has no BOS token to start samples from: give -prompts")
		}
		out := make([][]int32, n)
		for i := range out {
			out[i] = []int32{bos}
		}
		return out, nil
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			lines = append(lines, l)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(lines) == 0 {
		return nil, fmt.Errorf("%s has no prompts", file)
	}
	out := make([][]int32, n)
	for i := range out {
		p := lines[i%len(lines)]
		var ids []int32
		if chat {
			var err error
			ct := chatTemplate(tok.Vocab(), "", false)
			if ids, err = chatTokens(tok, ct, []jinja.Message{{Role: "user", Content: p}}); err != nil {
				return nil, err
			}
		} else {
			ids = tok.Encode(p, tokenizer.Options{AddSpecial: true, ParseSpecial: true})
		}
		if len(ids) == 0 {
			return nil, fmt.Errorf("prompt %q encodes to no tokens", p)
		}
		out[i] = ids
	}
	return out, nil
}
