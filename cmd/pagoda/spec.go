package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"pagoda/eagle"
	"pagoda/engine"
	"pagoda/generate"
	"pagoda/gguf"
	"pagoda/medusa"
	"pagoda/model"
	"pagoda/sample"
	"pagoda/spec"
	"pagoda/tokenizer"
)

// specFlags are the speculative decoding flags of run and serve.
type specFlags struct {
	draft              string
	method             string
	tokens             int
	pmin               float64
	ngramMin, ngramMax int
	fixed              bool
	control            bool
	heads              string
	headsNodes         int
	headsTopK          int
	headsDepth         int
}

func (f *specFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.draft, "draft", "", "draft model for speculative decoding (any model file the loaders read, sharing the target's vocabulary)")
	fs.StringVar(&f.method, "spec-method", "", "speculative decoding: ngram (prompt lookup), draft, medusa or eagle (default: draft with --draft, else off)")
	fs.StringVar(&f.heads, "heads", "", "medusa/eagle: the heads' side file trained for this model (pagoda heads train), or a published checkpoint (medusa_lm_head.safetensors, an EAGLE safetensors directory)")
	fs.IntVar(&f.headsNodes, "spec-tree-nodes", 0, "medusa: the static tree's nodes used (0 = all the side file holds); the engine's cost model bounds them per step by --spec-tokens")
	fs.IntVar(&f.headsTopK, "spec-tree-topk", 4, "eagle: children per expanded node and nodes expanded per level (the most: under --spec-control the engine picks a narrower tree per load when it pays)")
	fs.IntVar(&f.headsDepth, "spec-tree-depth", 5, "eagle: the tree's depth (the most: under --spec-control the engine picks a shallower tree per load when it pays)")
	fs.StringVar(&f.method, "spec", "", "same as --spec-method")
	fs.IntVar(&f.tokens, "spec-tokens", engine.DefaultSpecTokens, "most draft tokens verified per sequence and step")
	fs.Float64Var(&f.pmin, "spec-p-min", 0, "draft model: stop drafting at a token the draft gives less probability than this")
	fs.IntVar(&f.ngramMin, "spec-ngram-min", 2, "ngram: shortest suffix matched")
	fs.IntVar(&f.ngramMax, "spec-ngram-max", 4, "ngram: longest suffix matched")
	fs.BoolVar(&f.fixed, "spec-fixed", false, "always draft --spec-tokens (no adaptive length, no cost model deciding when it pays)")
	fs.BoolVar(&f.control, "spec-control", true, "speculate only at loads where it realises more output tokens/s than plain decoding, measured in trial windows that the cost model predicts can pay, within 3% of the steps; for medusa/eagle also pick the tree size per load from a ladder below --spec-tokens, --spec-tree-topk and --spec-tree-depth (false: the cost model alone decides)")
}

var specLimits = []limit{{"spec-tree-nodes", 0, engine.MaxSpecTokens}, {"spec-tree-topk", 1, 16}, {"spec-tree-depth", 1, 16}, {"spec-tokens", 1, engine.MaxSpecTokens}, {"spec-p-min", 0, 1}, {"spec-ngram-min", 1, 64}, {"spec-ngram-max", 1, 64}}

// build makes the engine's speculation settings for target; close
// releases the draft model. Off (a zero SpecConfig) without --draft or
// --spec-method.
func (f *specFlags) build(target *model.Model, targetPath string, threads int) (cfg engine.SpecConfig, close func(), err error) {
	close = func() {}
	method := f.method
	if method == "" && f.draft != "" {
		method = "draft"
	}
	switch method {
	case "":
		return cfg, close, nil
	case "medusa", "eagle":
		if f.draft != "" || f.heads == "" {
			return cfg, close, fmt.Errorf("--spec-method %s needs --heads FILE (and no --draft)", method)
		}
		if method == "medusa" {
			h, err := medusa.Load(f.heads, target, targetPath)
			if err != nil {
				return cfg, close, fmt.Errorf("--heads: %w", err)
			}
			cfg.Proposer = h.Proposer(medusa.ProposerOptions{Nodes: f.headsNodes})
		} else {
			d, err := eagle.Load(f.heads, target, targetPath)
			if err != nil {
				return cfg, close, fmt.Errorf("--heads: %w", err)
			}
			d.SetThreads(max(1, threads))
			cfg.Proposer, close = d.Proposer(eagle.ProposerOptions{TopK: f.headsTopK, Depth: f.headsDepth}), d.Close
		}
	case "ngram":
		if f.draft != "" {
			return cfg, close, fmt.Errorf("--draft is for --spec-method draft, not ngram")
		}
		g, err := spec.NewNGram(f.ngramMin, f.ngramMax)
		if err != nil {
			return cfg, close, err
		}
		cfg.Proposer = g
	case "draft":
		if f.draft == "" {
			return cfg, close, fmt.Errorf("--spec-method draft needs --draft FILE")
		}
		if err := checkDraftVocab(f.draft, target); err != nil {
			return cfg, close, err
		}
		dm, err := openModel(f.draft, model.Options{Threads: threads, Pool: target.Pool()})
		if err != nil {
			return cfg, close, fmt.Errorf("--draft: %w", err)
		}
		if dm.Tokenizer() == nil {
			dm.Close()
			return cfg, close, fmt.Errorf("--draft %s has no tokenizer to check against the target's", f.draft)
		}
		d, err := spec.NewDraft(dm, target.Tokenizer().Vocab(), spec.DraftOptions{TargetVocab: target.Config.VocabSize, PMin: float32(f.pmin)})
		if err != nil {
			dm.Close()
			return cfg, close, fmt.Errorf("--draft %s: %w", f.draft, err)
		}
		cfg.Proposer, close = d, func() { d.Close(); dm.Close() }
	default:
		return cfg, close, fmt.Errorf("--spec-method %q: want ngram, draft, medusa or eagle", method)
	}
	cfg.Method, cfg.Tokens, cfg.Fixed = method, f.tokens, f.fixed
	cfg.Control.Off = !f.control
	return cfg, close, nil
}

// checkDraftVocab compares the draft's vocabulary, read alone from its
// file (a GGUF header, an HF directory's tokenizer.json), with the
// target's before the draft's weights load: a draft of another model
// family is refused in milliseconds, not after a load of gigabytes. A
// file whose vocabulary cannot be read alone (a llama2.c checkpoint) is
// checked after loading, by spec.NewDraft.
func checkDraftVocab(path string, target *model.Model) error {
	if target.Tokenizer() == nil {
		return nil
	}
	if st, err := os.Stat(path); err != nil || (!st.IsDir() && !gguf.IsGGUF(path)) {
		return nil // openModel reports a missing file as it does for -m
	}
	dv, err := tokenizer.Load(path)
	if err != nil {
		return nil
	}
	if err := spec.CheckVocab(target.Tokenizer().Vocab(), dv.Vocab()); err != nil {
		return fmt.Errorf("--draft %s: %w (checked from its vocabulary, before loading it)", path, err)
	}
	return nil
}

// genFunc generates from a tokenized prompt, calling emit per token.
type genFunc func(ctx context.Context, ids []int32, o generate.Options, emit func(generate.Token) error) (*generate.Result, error)

// directGen is generate.Generate on m: one sequence, no engine.
func directGen(m *model.Model, tok tokenizer.Tokenizer) genFunc {
	return func(ctx context.Context, ids []int32, o generate.Options, emit func(generate.Token) error) (*generate.Result, error) {
		return generate.Generate(ctx, m, tok, ids, o, emit)
	}
}

// engineGen runs each generation as one request of eng (speculative
// decoding lives in the engine).
func engineGen(eng *engine.Engine) genFunc {
	return func(ctx context.Context, ids []int32, o generate.Options, emit func(generate.Token) error) (*generate.Result, error) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		ch, err := eng.Submit(ctx, &engine.Request{Prompt: ids, MaxTokens: o.MaxTokens, Sampling: o.Sampling,
			StopStrings: o.StopStrings, StopTokens: o.StopTokens, IgnoreEOS: o.IgnoreEOS,
			Logprobs: o.TopLogprobs > 0, TopLogprobs: o.TopLogprobs})
		if err != nil {
			return nil, err
		}
		res := &generate.Result{PromptTokens: len(ids)}
		var text strings.Builder
		for ev := range ch {
			if ev.Err != nil {
				return res, ev.Err
			}
			for i, id := range ev.Tokens {
				t := generate.Token{ID: id}
				if i == 0 {
					t.Text = ev.Text
				}
				if i < len(ev.Logprob) {
					t.Logprob = ev.Logprob[i]
				}
				if i < len(ev.Top) {
					for _, a := range ev.Top[i] {
						t.Top = append(t.Top, sample.TokenLogprob{ID: a.ID, Logprob: a.Logprob})
					}
				}
				res.Tokens = append(res.Tokens, id)
				if err := emit(t); err != nil {
					return res, err
				}
			}
			text.WriteString(ev.Text)
			if ev.Finish == engine.FinishCancelled {
				return res, context.Canceled
			}
			if ev.Finish != engine.FinishNone {
				res.FinishReason = string(ev.Finish)
			}
		}
		res.Text = text.String()
		if res.FinishReason == "" {
			return res, ctx.Err()
		}
		return res, nil
	}
}

// specEngine starts a one-sequence engine on m that speculates with sc.
func specEngine(m *model.Model, tok tokenizer.Tokenizer, sc engine.SpecConfig) (*engine.Engine, error) {
	cfg := engine.ModelConfig(m, "run")
	cfg.MaxNumSeqs = 1
	cfg.Spec = sc
	eng, err := engine.New(m, tok, cfg)
	if err != nil {
		return nil, err
	}
	eng.Start()
	return eng, nil
}

// specSummary is the acceptance line printed after a speculative run.
func specSummary(method string, st engine.Stats) string {
	if st.SpecDraftTokens == 0 {
		return fmt.Sprintf("spec (%s): no drafts verified", method)
	}
	return fmt.Sprintf("spec (%s): %d verifications, %d of %d draft tokens accepted (%.1f%%), mean accepted length %.2f, %d steps for %d tokens",
		method, st.SpecDrafts, st.SpecAccepted, st.SpecDraftTokens, 100*float64(st.SpecAccepted)/float64(st.SpecDraftTokens),
		float64(st.SpecAccepted)/float64(st.SpecDrafts), st.Steps, st.GenerationTokens)
}
