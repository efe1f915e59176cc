package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"

	"pagoda/generate"
	"pagoda/jinja"
	"pagoda/model"
	"pagoda/sample"
	"pagoda/server"
	"pagoda/tokenizer"
)

func init() {
	register("run", "generate text from a prompt (or chat interactively)", runRun)
}

// stringList is a repeatable string flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// samplingFlags are shared by run and other commands that sample.
type samplingFlags struct {
	temp, topP, minP, repeat, freq, presence float64
	topK, lastN                              int
	seed                                     int64
}

func (f *samplingFlags) register(fs *flag.FlagSet) {
	fs.Float64Var(&f.temp, "temp", 0, "temperature (0 = greedy)")
	fs.IntVar(&f.topK, "top-k", 0, "top-k filter (0 = off)")
	fs.Float64Var(&f.topP, "top-p", 1, "top-p (nucleus) filter (1 = off)")
	fs.Float64Var(&f.minP, "min-p", 0, "min-p filter (0 = off)")
	fs.Float64Var(&f.repeat, "repeat-penalty", 1, "repetition penalty (1 = off)")
	fs.Float64Var(&f.freq, "frequency-penalty", 0, "frequency penalty")
	fs.Float64Var(&f.presence, "presence-penalty", 0, "presence penalty")
	fs.IntVar(&f.lastN, "penalty-last-n", 64, "tokens the penalties look back over (0 = all)")
	fs.Int64Var(&f.seed, "seed", -1, "random seed (-1 = from the clock)")
}

func (f *samplingFlags) params() sample.Params {
	p := sample.Params{
		Temperature: float32(f.temp), TopK: f.topK, TopP: float32(f.topP), MinP: float32(f.minP),
		RepetitionPenalty: float32(f.repeat), FrequencyPenalty: float32(f.freq), PresencePenalty: float32(f.presence),
		PenaltyLastN: f.lastN,
	}
	if f.seed >= 0 {
		p.Seed, p.HasSeed = uint64(f.seed), true
	}
	return p
}

var runLimits = []limit{
	{"n", 0, inf}, {"top-logprobs", 0, 20}, {"threads", 0, maxThreads}, {"ctx", 0, maxCtx},
}

// samplingLimits covers the integer sampling flags; sample.New checks the
// floats against each other (top-p with min-p and so on).
var samplingLimits = []limit{{"top-k", 0, inf}, {"penalty-last-n", 0, inf}, {"seed", -1, inf}}

func runRun(args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	modelPath := fs.String("m", "", "model: GGUF file, llama2.c .bin or Hugging Face directory (default: the built-in stories260K)")
	prompt := fs.String("p", "", "prompt (none with --chat: interactive chat)")
	tokPath := fs.String("tokenizer", "", "tokenizer file (GGUF, tokenizer.json, llama2.c tokenizer.bin) overriding the model's")
	chat := fs.Bool("chat", false, "apply the model's chat template; interactive multi-turn chat when -p is empty")
	system := fs.String("system", "", "system prompt for --chat")
	maxTokens := fs.Int("n", 256, "maximum tokens to generate (0 = until the context is full)")
	jsonOut := fs.Bool("json", false, "print one JSON object per generated token (id, text, logprob, top logprobs)")
	topLP := fs.Int("top-logprobs", 0, "alternatives per token in --json output")
	threads := fs.Int("threads", 0, "threads (0 = number of CPUs)")
	ctxLen := fs.Int("ctx", 0, "context length (0 = the model's)")
	ignoreEOS := fs.Bool("ignore-eos", false, "keep generating past end-of-generation tokens")
	reference := fs.Bool("reference", false, "use the plain Go reference kernels")
	kvPolicy := fs.String("kv-policy", "", kvPolicyHelp)
	kvf := addKVFlags(fs)
	tpf := addTPFlags(fs)
	var stops stringList
	fs.Var(&stops, "stop", "stop string (repeatable)")
	var sf samplingFlags
	sf.register(fs)
	var spf specFlags
	spf.register(fs)
	if err := parseFlags(fs, args, append(append(runLimits, samplingLimits...), specLimits...)); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q (the prompt goes in -p)", fs.Args())
	}
	path, err := resolveModel(*modelPath)
	if err != nil {
		return err
	}
	grp, err := tpf.start(path, *threads, os.Stderr)
	if err != nil {
		return err
	}
	defer grp.close()
	if err := grp.seqRefuse([]string{*kvf.all, *kvf.k, *kvf.v}, *kvPolicy, spf.method != "" || spf.draft != ""); err != nil {
		return err
	}
	if grp != nil && grp.seq {
		*kvf.all, *kvf.k, *kvf.v = "", "", "" // f32, which the ranks keep anyway
	}
	if grp != nil && (*reference || *kvPolicy != "" || *kvf.all+*kvf.k+*kvf.v != "" || spf.method != "" || spf.draft != "") {
		return fmt.Errorf("--tensor-parallel/--workers run the default KV cache without --reference, --kv-policy, --kv-dtype or speculation")
	}
	o := model.Options{Tokenizer: *tokPath, Threads: *threads, Reference: *reference, ContextLen: *ctxLen, MaxMemory: tpf.capBytes}
	if grp == nil {
		o.Reserve = flatCacheBytes
	}
	m, err := grp.openModel(path, o)
	if err != nil {
		return tpf.capError(err, grp)
	}
	defer m.Close()
	tok := m.Tokenizer()
	if tok == nil {
		return fmt.Errorf("%s has no tokenizer; pass --tokenizer FILE", path)
	}
	newCache, err := kvf.newCache(m)
	if err != nil {
		return err
	}
	gen := directGen(m, tok)
	if grp != nil {
		eng, err := grp.engine(m, tok, *ctxLen)
		if err != nil {
			return err
		}
		defer eng.Stop(context.Background())
		gen = engineGen(eng)
	}
	sc, closeDraft, err := spf.build(m, path, *threads)
	if err != nil {
		return err
	}
	defer closeDraft()
	if sc.Proposer != nil {
		switch {
		case *kvPolicy != "":
			return fmt.Errorf("--kv-policy and speculative decoding (--spec/--draft) do not combine: speculation is off under KV policies")
		case newCache != nil:
			return fmt.Errorf("--kv-dtype with speculative decoding (--spec/--draft) runs in serve only; run speculates over the engine's default cache")
		}
		eng, err := specEngine(m, tok, sc)
		if err != nil {
			return err
		}
		defer func() {
			eng.Stop(context.Background())
			fmt.Fprintln(os.Stderr, specSummary(sc.Method, eng.Stats()))
		}()
		gen = engineGen(eng)
	}
	opts := generate.Options{MaxTokens: *maxTokens, Sampling: sf.params(), StopStrings: stops,
		IgnoreEOS: *ignoreEOS, TopLogprobs: *topLP, NewCache: newCache}
	if _, err := sample.New(opts.Sampling); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()

	if *kvPolicy != "" {
		if *chat || *jsonOut {
			return fmt.Errorf("--kv-policy runs plain prompts only (no --chat or --json)")
		}
		ids := tok.Encode(*prompt, tokenizer.Options{AddSpecial: true, ParseSpecial: true})
		return runPolicy(ctx, m, tok, ids, *kvPolicy, opts, out, *prompt)
	}
	if !*chat {
		ids := tok.Encode(*prompt, tokenizer.Options{AddSpecial: true, ParseSpecial: true})
		if len(ids) == 0 {
			return fmt.Errorf("the prompt is empty and the vocabulary adds no BOS token; give -p")
		}
		_, err := runOnce(ctx, m, tok, gen, ids, opts, out, *jsonOut, *prompt)
		return err
	}
	ct := chatTemplate(tok.Vocab(), "", *modelPath == "")
	opts.StopStrings = append(opts.StopStrings, ct.Stops...)
	if *prompt != "" {
		var msgs []jinja.Message
		if *system != "" {
			msgs = append(msgs, jinja.Message{Role: "system", Content: *system})
		}
		msgs = append(msgs, jinja.Message{Role: "user", Content: *prompt})
		ids, err := chatTokens(tok, ct, msgs)
		if err != nil {
			return err
		}
		_, err = runOnce(ctx, m, tok, gen, ids, opts, out, *jsonOut, "")
		return err
	}
	r := &chatREPL{m: m, tok: tok, gen: gen, ct: ct, opts: opts, system: *system, json: *jsonOut, name: path, out: out}
	return r.run(ctx, os.Stdin)
}

// flatCacheBytes is what run's one-sequence cache takes at most, for
// --max-memory: f32 K and V of every layer over the whole context.
func flatCacheBytes(c *model.Config, st model.Stage) (int64, error) {
	nkv, kd, vd := c.KVShape()
	n := int64(st.Hi-st.Lo) * int64(c.ContextLen) * int64(nkv*kd) * 4
	if vd > 0 {
		n *= 2
	}
	return n, nil
}

// chatTokens renders msgs with the chat template and tokenizes them, the
// template's special-token text parsed as the special tokens.
func chatTokens(tok tokenizer.Tokenizer, ct server.ChatTemplate, msgs []jinja.Message) ([]int32, error) {
	text, err := ct.RenderPrompt(msgs, tok.Vocab())
	if err != nil {
		return nil, fmt.Errorf("applying the chat template: %w", err)
	}
	return tok.Encode(text, tokenizer.Options{AddSpecial: false, ParseSpecial: true}), nil
}

type jsonToken struct {
	ID      int32        `json:"id"`
	Text    string       `json:"text"`
	Logprob *float32     `json:"logprob,omitempty"`
	Top     []jsonTopAlt `json:"top_logprobs,omitempty"`
}

type jsonTopAlt struct {
	ID      int32   `json:"id"`
	Text    string  `json:"text"`
	Logprob float32 `json:"logprob"`
}

func runOnce(ctx context.Context, m *model.Model, tok tokenizer.Tokenizer, gen genFunc, ids []int32, o generate.Options, out *bufio.Writer, jsonOut bool, echo string) (*generate.Result, error) {
	// Checked here as well as in Generate so that a prompt that cannot fit
	// is refused before it is echoed.
	if c := m.Config.ContextLen; len(ids) >= c {
		return nil, fmt.Errorf("the prompt is %d tokens, which leaves no room in the context of %d (raise --ctx or shorten the prompt)", len(ids), c)
	}
	enc := json.NewEncoder(out)
	if !jsonOut {
		fmt.Fprint(out, echo)
		out.Flush()
	}
	res, err := gen(ctx, ids, o, func(t generate.Token) error {
		if jsonOut {
			if t.ID < 0 {
				return nil
			}
			jt := jsonToken{ID: t.ID, Text: string(tok.TokenBytes(t.ID))}
			if o.TopLogprobs > 0 {
				lp := t.Logprob
				jt.Logprob = &lp
				for _, a := range t.Top {
					jt.Top = append(jt.Top, jsonTopAlt{a.ID, string(tok.TokenBytes(a.ID)), a.Logprob})
				}
			}
			return enc.Encode(jt)
		}
		_, err := io.WriteString(out, t.Text)
		out.Flush()
		return err
	})
	if !jsonOut {
		fmt.Fprintln(out)
	}
	if err == context.Canceled {
		return res, nil
	}
	return res, err
}
