package main

import (
	"context"
	"encoding/json"
	"flag"
	"os"
	"os/signal"

	"pagoda/bench"
	"pagoda/tokenizer"
)

func runBenchServe(args []string) error {
	fs := flag.NewFlagSet("bench serve", flag.ContinueOnError)
	var c bench.Config
	fs.StringVar(&c.BaseURL, "base-url", "http://127.0.0.1:8000", "server root URL")
	fs.StringVar(&c.Model, "model", "", "model name to send")
	fs.StringVar(&c.Endpoint, "endpoint", "completions", "completions or chat")
	fs.StringVar(&c.Dataset, "dataset", "random", "random, shared-prefix or text (prompts cut from --text-file, needs --tokenizer)")
	textFile := fs.String("text-file", "", "text dataset: the corpus prompts are cut from at random offsets")
	fs.IntVar(&c.NumPrompts, "num-prompts", 32, "requests to send")
	fs.IntVar(&c.InputLen, "input-len", 128, "prompt tokens (after any shared prefix)")
	fs.IntVar(&c.OutputLen, "output-len", 128, "max_tokens per request")
	fs.Float64Var(&c.RangeRatio, "range-ratio", 0, "lengths uniform in [L(1-r), L(1+r)]")
	fs.IntVar(&c.PrefixLen, "prefix-len", 0, "shared-prefix: tokens of common prefix")
	fs.IntVar(&c.NumPrefixes, "num-prefixes", 1, "shared-prefix: distinct prefixes")
	fs.IntVar(&c.VocabSize, "vocab-size", 0, "draw random token ids below this (needed without --tokenizer)")
	fs.IntVar(&c.MinTokenID, "min-token-id", 0, "draw random token ids from this id up")
	rate := fs.String("request-rate", "inf", "requests per second (Poisson), inf = all at once")
	fs.IntVar(&c.MaxConcurrency, "max-concurrency", 0, "requests in flight at most (0 = unlimited)")
	fs.Int64Var(&c.Seed, "seed", 0, "random seed")
	fs.BoolVar(&c.IgnoreEOS, "ignore-eos", true, "ask the server to ignore EOS (fixed output lengths)")
	bias := fs.String("logit-bias", "", "logit bias, e.g. \"0-258:-100\" to ban byte tokens")
	fs.Float64Var(&c.Temperature, "temperature", 0, "sampling temperature")
	tokPath := fs.String("tokenizer", "", "tokenizer file to make text prompts of exact length")
	fs.StringVar(&c.APIKey, "api-key", os.Getenv("PAGODA_API_KEY"), "bearer token")
	fs.BoolVar(&c.ScrapeMetrics, "scrape-metrics", true, "read the server's /metrics before and after (prefix hits, KV waste)")
	jsonOut := fs.String("json", "", "also write the result as JSON to this file (- = stdout)")
	if err := parseFlags(fs, args, []limit{
		{"num-prompts", 1, inf}, {"input-len", 1, maxCtx}, {"output-len", 1, maxCtx}, {"range-ratio", 0, 1},
		{"prefix-len", 0, maxCtx}, {"num-prefixes", 1, inf}, {"vocab-size", 0, inf}, {"min-token-id", 0, inf},
		{"max-concurrency", 0, inf},
	}); err != nil {
		return err
	}
	var err error
	if c.RequestRate, err = bench.ParseRate(*rate); err != nil {
		return err
	}
	if *bias != "" {
		if c.LogitBias, err = bench.ParseLogitBias(*bias); err != nil {
			return err
		}
	}
	if *tokPath != "" {
		if c.Tokenizer, err = tokenizer.Load(*tokPath); err != nil {
			return err
		}
	}
	if *textFile != "" {
		b, err := os.ReadFile(*textFile)
		if err != nil {
			return err
		}
		c.Text = string(b)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	r, err := bench.Run(ctx, c)
	if err != nil {
		return err
	}
	if *jsonOut != "-" {
		r.Print(os.Stdout)
	}
	if *jsonOut != "" {
		out := os.Stdout
		if *jsonOut != "-" {
			if out, err = os.Create(*jsonOut); err != nil {
				return err
			}
			defer out.Close()
		}
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	return nil
}
