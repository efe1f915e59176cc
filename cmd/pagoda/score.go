package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"pagoda/generate"
	"pagoda/model"
	"pagoda/tokenizer"
)

func init() {
	register("score", "evaluate a text or token list teacher-forced: per-token log-probabilities, perplexity, logits", runScore)
}

func parseIDs(s string) ([]int32, error) {
	var ids []int32
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\t' || r == '[' || r == ']' }) {
		v, err := strconv.ParseInt(f, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("token id %q: %v", f, err)
		}
		ids = append(ids, int32(v))
	}
	return ids, nil
}

func runScore(args []string) error {
	fs := flag.NewFlagSet("score", flag.ContinueOnError)
	modelPath := fs.String("m", "", "model: GGUF file, llama2.c .bin or Hugging Face directory (default: the built-in stories260K)")
	tokPath := fs.String("tokenizer", "", "tokenizer file overriding the model's")
	text := fs.String("text", "", "text to score (BOS added as the vocabulary says)")
	file := fs.String("f", "", "file whose text to score")
	tokens := fs.String("tokens", "", "token ids to score instead of text, e.g. \"1,403,407\"")
	logits := fs.Bool("logits", false, "with --json: include every position's full logit row")
	jsonOut := fs.Bool("json", false, "JSON output")
	threads := fs.Int("threads", 0, "threads (0 = number of CPUs)")
	reference := fs.Bool("reference", false, "use the plain Go reference kernels")
	kvf := addKVFlags(fs)
	if err := parseFlags(fs, args, []limit{{"threads", 0, maxThreads}}); err != nil {
		return err
	}
	in, err := readScoreInput(*tokens, *text, *file)
	if err != nil {
		return err
	}
	path, err := resolveModel(*modelPath)
	if err != nil {
		return err
	}
	*modelPath = path
	m, err := model.Open(*modelPath, model.Options{Tokenizer: *tokPath, Threads: *threads, Reference: *reference})
	if err != nil {
		return err
	}
	defer m.Close()
	tok := m.Tokenizer()
	ids, err := in.ids(tok)
	if err != nil {
		return err
	}
	if len(ids) < 2 && !*logits {
		return fmt.Errorf("need at least two tokens to score, got %d", len(ids))
	}
	newCache, err := kvf.newCache(m)
	if err != nil {
		return err
	}
	sc, err := generate.ScoreTokensCache(m, ids, *logits && *jsonOut, 0, newCache)
	if err != nil {
		return err
	}
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	piece := func(id int32) string {
		if tok == nil {
			return ""
		}
		return string(tok.TokenBytes(id))
	}
	if *jsonOut {
		type pos struct {
			Pos     int       `json:"pos"`
			Next    int32     `json:"next_token"`
			Text    string    `json:"text"`
			Logprob float64   `json:"logprob"`
			Logits  []float32 `json:"logits,omitempty"`
		}
		res := struct {
			Tokens     []int32   `json:"tokens"`
			Positions  []pos     `json:"positions"`
			NLL        float64   `json:"nll"`
			Perplexity float64   `json:"perplexity"`
			Last       []float32 `json:"last_logits,omitempty"`
		}{Tokens: ids, NLL: sc.NLL, Perplexity: sc.Perplexity}
		for i, lp := range sc.Logprobs {
			p := pos{Pos: i, Next: ids[i+1], Text: piece(ids[i+1]), Logprob: lp}
			if sc.Logits != nil {
				p.Logits = sc.Logits[i]
			}
			res.Positions = append(res.Positions, p)
		}
		if sc.Logits != nil {
			res.Last = sc.Logits[len(sc.Logits)-1]
		}
		return json.NewEncoder(out).Encode(res)
	}
	fmt.Fprintf(out, "%5s %8s %12s  %s\n", "pos", "token", "logprob", "text")
	for i, lp := range sc.Logprobs {
		fmt.Fprintf(out, "%5d %8d %12.6f  %q\n", i, ids[i+1], lp, piece(ids[i+1]))
	}
	fmt.Fprintf(out, "tokens %d  nll %.6f  perplexity %.6f\n", len(ids), sc.NLL, sc.Perplexity)
	return nil
}

// scoreInput is what a scoring command works on: --tokens, --text or
// the text of -f, exactly one of them, checked (and the file read) before
// any model is opened.
type scoreInput struct {
	tokens, text string
	isText       bool
}

func readScoreInput(tokens, text, file string) (scoreInput, error) {
	var given []string
	for _, f := range []struct{ name, v string }{{"--tokens", tokens}, {"--text", text}, {"-f", file}} {
		if f.v != "" {
			given = append(given, f.name)
		}
	}
	switch {
	case len(given) == 0:
		return scoreInput{}, fmt.Errorf("give --text, -f or --tokens")
	case len(given) > 1:
		return scoreInput{}, fmt.Errorf("%s: give only one of --text, -f and --tokens", strings.Join(given, " and "))
	case tokens != "":
		if _, err := parseIDs(tokens); err != nil {
			return scoreInput{}, fmt.Errorf("--tokens: %w", err)
		}
		return scoreInput{tokens: tokens}, nil
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return scoreInput{}, err
		}
		text = string(b)
	}
	return scoreInput{text: text, isText: true}, nil
}

// ids are the token ids: --tokens as given, else the text encoded with
// BOS as the vocabulary says (specials in the text stay text).
func (in scoreInput) ids(tok tokenizer.Tokenizer) ([]int32, error) {
	if !in.isText {
		return parseIDs(in.tokens)
	}
	if tok == nil {
		return nil, fmt.Errorf("the model has no tokenizer; pass --tokenizer or --tokens")
	}
	return tok.Encode(in.text, tokenizer.Options{AddSpecial: true}), nil
}
