package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	"pagoda/generate"
	"pagoda/jinja"
	"pagoda/model"
	"pagoda/sample"
	"pagoda/server"
	"pagoda/tokenizer"
)

// chatREPL is `run --chat` without -p: a multi-turn chat on stdin with
// ollama run's slash commands.
type chatREPL struct {
	m      *model.Model
	tok    tokenizer.Tokenizer
	gen    genFunc
	ct     server.ChatTemplate
	opts   generate.Options
	system string
	json   bool
	name   string
	out    *bufio.Writer
	msgs   []jinja.Message
}

const chatHelp = `Available commands:
  /set parameter NAME VALUE   set a sampling parameter: temperature, top_k, top_p, min_p,
                              num_predict, seed, repeat_penalty, stop (repeatable; "/set parameter stop" clears)
  /set system TEXT            set the system prompt (clears the conversation)
  /show info|parameters|system|template
  /clear                      forget the conversation so far
  /bye                        exit
  /? or /help                 this help
Lines starting with / are commands; end a line with \ to continue a message on the next line.`

func (r *chatREPL) run(ctx context.Context, stdin io.Reader) error {
	in := bufio.NewScanner(stdin)
	in.Buffer(make([]byte, 1<<20), 1<<24)
	fmt.Fprintln(r.out, "Chatting; /? for help, /bye to leave.")
	for {
		fmt.Fprint(r.out, "\n> ")
		r.out.Flush()
		line, ok := r.readMessage(in)
		if !ok {
			fmt.Fprintln(r.out)
			return in.Err()
		}
		if line == "" {
			continue
		}
		if strings.HasPrefix(line, "/") {
			if quit := r.command(line); quit {
				return nil
			}
			continue
		}
		msgs := r.conversation(jinja.Message{Role: "user", Content: line})
		ids, err := chatTokens(r.tok, r.ct, msgs)
		if err != nil {
			return err
		}
		res, err := runOnce(ctx, r.m, r.tok, r.gen, ids, r.opts, r.out, r.json, "")
		if err != nil {
			return err
		}
		r.msgs = append(r.msgs, jinja.Message{Role: "user", Content: line}, jinja.Message{Role: "assistant", Content: res.Text})
	}
}

// readMessage reads one message; a line ending in \ continues on the next.
func (r *chatREPL) readMessage(in *bufio.Scanner) (string, bool) {
	var b strings.Builder
	for in.Scan() {
		line := in.Text()
		if cont, ok := strings.CutSuffix(line, `\`); ok {
			b.WriteString(cont + "\n")
			fmt.Fprint(r.out, ". ")
			r.out.Flush()
			continue
		}
		b.WriteString(line)
		return strings.TrimSpace(b.String()), true
	}
	return strings.TrimSpace(b.String()), b.Len() > 0
}

func (r *chatREPL) conversation(next jinja.Message) []jinja.Message {
	var msgs []jinja.Message
	if r.system != "" {
		msgs = append(msgs, jinja.Message{Role: "system", Content: r.system})
	}
	msgs = append(msgs, r.msgs...)
	return append(msgs, next)
}

// command runs a slash command; true means leave.
func (r *chatREPL) command(line string) bool {
	f := strings.Fields(line)
	switch f[0] {
	case "/bye", "/exit", "/quit":
		return true
	case "/clear":
		r.msgs = nil
		fmt.Fprintln(r.out, "Cleared session context")
	case "/?", "/help":
		fmt.Fprintln(r.out, chatHelp)
	case "/show":
		r.show(f[1:])
	case "/set":
		if len(f) >= 2 && f[1] == "system" {
			r.system = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(strings.TrimPrefix(line, "/set")), "system"))
			r.msgs = nil
			fmt.Fprintln(r.out, "Set system message.")
			return false
		}
		if len(f) < 3 || f[1] != "parameter" {
			fmt.Fprintln(r.out, "Usage: /set parameter NAME VALUE, or /set system TEXT")
			return false
		}
		val := ""
		if len(f) > 3 {
			val = strings.Join(f[3:], " ")
		}
		if err := r.setParam(f[2], val); err != nil {
			fmt.Fprintf(r.out, "Couldn't set %s: %v\n", f[2], err)
			return false
		}
		fmt.Fprintf(r.out, "Set parameter '%s' to '%s'\n", f[2], val)
	default:
		fmt.Fprintf(r.out, "Unknown command '%s'. Type /? for help\n", f[0])
	}
	return false
}

func (r *chatREPL) setParam(name, val string) error {
	p := r.opts.Sampling
	num := func() (float64, error) {
		x, err := strconv.ParseFloat(val, 64)
		if err != nil {
			return 0, fmt.Errorf("%q is not a number", val)
		}
		return x, nil
	}
	switch name {
	case "stop":
		if val == "" {
			r.opts.StopStrings = append([]string(nil), r.ct.Stops...)
		} else {
			r.opts.StopStrings = append(r.opts.StopStrings, val)
		}
		return nil
	case "num_predict":
		n, err := strconv.Atoi(val)
		if err != nil || n < -1 {
			return fmt.Errorf("num_predict must be an integer >= -1 (-1: until the context is full)")
		}
		r.opts.MaxTokens = max(n, 0)
		return nil
	case "seed":
		n, err := strconv.ParseInt(val, 10, 64)
		if err != nil {
			return fmt.Errorf("%q is not an integer", val)
		}
		p.Seed, p.HasSeed = uint64(n), true
	case "top_k":
		n, err := strconv.Atoi(val)
		if err != nil || n < 0 {
			return fmt.Errorf("top_k must be an integer >= 0")
		}
		p.TopK = n
	case "temperature", "top_p", "min_p", "repeat_penalty":
		x, err := num()
		if err != nil {
			return err
		}
		switch name {
		case "temperature":
			p.Temperature = float32(x)
		case "top_p":
			p.TopP = float32(x)
		case "min_p":
			p.MinP = float32(x)
		case "repeat_penalty":
			p.RepetitionPenalty = float32(x)
		}
	default:
		return fmt.Errorf("unknown parameter (one of temperature, top_k, top_p, min_p, num_predict, seed, repeat_penalty, stop)")
	}
	if _, err := sample.New(p); err != nil {
		return err
	}
	r.opts.Sampling = p
	return nil
}

func (r *chatREPL) show(what []string) {
	topic := "info"
	if len(what) > 0 {
		topic = what[0]
	}
	switch topic {
	case "info":
		c := r.m.Config
		fmt.Fprintf(r.out, "  model          %s\n  architecture   %s\n  layers         %d\n  embedding      %d\n  context        %d\n  vocabulary     %d\n  chat template  %s\n",
			r.name, c.Arch, c.NLayer, c.NEmbd, c.ContextLen, c.VocabSize, r.ct.Kind)
	case "parameters":
		p := r.opts.Sampling
		kv := map[string]string{
			"temperature": fmt.Sprint(p.Temperature), "top_k": fmt.Sprint(p.TopK), "top_p": fmt.Sprint(p.TopP),
			"min_p": fmt.Sprint(p.MinP), "repeat_penalty": fmt.Sprint(p.RepetitionPenalty), "num_predict": fmt.Sprint(r.opts.MaxTokens),
		}
		if p.HasSeed {
			kv["seed"] = fmt.Sprint(p.Seed)
		}
		keys := make([]string, 0, len(kv))
		for k := range kv {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(r.out, "  %-15s %s\n", k, kv[k])
		}
		for _, s := range r.opts.StopStrings {
			fmt.Fprintf(r.out, "  %-15s %q\n", "stop", s)
		}
	case "system":
		if r.system == "" {
			fmt.Fprintln(r.out, "No system message was specified.")
		} else {
			fmt.Fprintln(r.out, r.system)
		}
	case "template":
		fmt.Fprintf(r.out, "(%s)\n%s\n", r.ct.Kind, r.ct.Source)
	default:
		fmt.Fprintln(r.out, "Usage: /show info|parameters|system|template")
	}
}
