// Command peerserve runs the serving benchmark against pagoda serve and
// llama-server on the same GGUF files, the same load and the same client
// (package bench, vLLM's metric definitions), alternating the engines, and
// prints medians [min–max] and pagoda's ratio to llama-server.
//
// Each (model, concurrency, engine) run starts a fresh server sized for
// that concurrency (llama-server -np N with N×ctx tokens of context, pagoda
// with its defaults), waits for /health, runs the benchmark and stops it.
//
//	go run ./scripts/peerserve -llama ~/llama.cpp/build -m tl-q4_0.gguf -c 8,16
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"pagoda/scripts/internal/proc"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"pagoda/bench"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "peerserve:", err)
		os.Exit(1)
	}
}

type options struct {
	llama, pagoda    string
	models           []string
	concs            []int
	prompts, in, out int
	threads, ctx     int
	rounds           int
	vocab            int
	pagodaArgs       []string
}

// engine starts one server; the returned command is running.
type engine struct {
	name  string
	start func(model string, conc, port int) *exec.Cmd
}

type cell struct {
	model string
	conc  int
	eng   string
}

func run(args []string, out, log io.Writer) error {
	fs := flag.NewFlagSet("peerserve", flag.ContinueOnError)
	fs.SetOutput(log)
	var o options
	fs.StringVar(&o.llama, "llama", "", "llama.cpp build directory (holding bin/llama-server) or the llama-server binary")
	fs.StringVar(&o.pagoda, "pagoda", "", "pagoda binary (default: built from this checkout)")
	models := fs.String("m", "", "GGUF files, comma separated")
	concs := fs.String("c", "8,16", "requests in flight, comma separated")
	fs.IntVar(&o.prompts, "num-prompts", 32, "requests per run")
	fs.IntVar(&o.in, "input-len", 128, "prompt tokens per request")
	fs.IntVar(&o.out, "output-len", 128, "output tokens per request (EOS ignored)")
	fs.IntVar(&o.threads, "t", 2, "threads, the same for both")
	fs.IntVar(&o.ctx, "ctx", 512, "context per sequence; llama-server gets -c ctx×concurrency")
	fs.IntVar(&o.rounds, "rounds", 2, "rounds; each runs both engines once per cell, alternating which goes first")
	fs.IntVar(&o.vocab, "vocab-size", 32000, "random prompt token ids are drawn below this")
	pargs := fs.String("pagoda-args", "", "extra pagoda serve flags, space separated")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.llama == "" || *models == "" {
		return errors.New("need -llama and -m")
	}
	o.models = strings.Split(*models, ",")
	for _, s := range strings.Split(*concs, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return fmt.Errorf("-c: bad concurrency %q", s)
		}
		o.concs = append(o.concs, n)
	}
	if o.rounds < 1 || o.prompts < 1 || o.in < 1 || o.out < 1 || o.ctx < o.in+o.out+1 {
		return errors.New("-rounds, -num-prompts, -input-len, -output-len must be positive and -ctx > input+output")
	}
	if *pargs != "" {
		o.pagodaArgs = strings.Fields(*pargs)
	}
	llamaBin := o.llama
	if st, err := os.Stat(llamaBin); err == nil && st.IsDir() {
		llamaBin = filepath.Join(llamaBin, "bin", "llama-server")
	}
	if _, err := os.Stat(llamaBin); err != nil {
		return fmt.Errorf("llama-server: %w", err)
	}
	if o.pagoda == "" {
		bin, cleanup, err := proc.BuildPagoda(log)
		if err != nil {
			return err
		}
		defer cleanup()
		o.pagoda = bin
	}
	engines := []engine{
		{"pagoda", func(m string, conc, port int) *exec.Cmd {
			a := []string{"serve", "-m", m, "--threads", strconv.Itoa(o.threads), "--port", strconv.Itoa(port)}
			return exec.Command(o.pagoda, append(a, o.pagodaArgs...)...)
		}},
		{"llama-server", func(m string, conc, port int) *exec.Cmd {
			return exec.Command(llamaBin, "-m", m, "-t", strconv.Itoa(o.threads), "--port", strconv.Itoa(port),
				"-np", strconv.Itoa(conc), "-c", strconv.Itoa(o.ctx*conc))
		}},
	}
	res := map[cell][]*bench.Result{}
	for r := 0; r < o.rounds; r++ {
		for _, m := range o.models {
			for _, c := range o.concs {
				for i := range engines {
					e := engines[(i+r)%len(engines)]
					fmt.Fprintf(log, "round %d %s c=%d %s\n", r+1, filepath.Base(m), c, e.name)
					br, err := serveOnce(e, m, c, o, log)
					if err != nil {
						return fmt.Errorf("%s on %s at %d in flight: %w", e.name, m, c, err)
					}
					res[cell{m, c, e.name}] = append(res[cell{m, c, e.name}], br)
				}
			}
		}
	}
	report(out, o, res)
	return nil
}

// serveOnce starts e's server for model m at concurrency c, runs the
// benchmark and stops the server.
func serveOnce(e engine, m string, c int, o options, log io.Writer) (*bench.Result, error) {
	port, err := proc.FreePort()
	if err != nil {
		return nil, err
	}
	cmd := e.start(m, c, port)
	logf, err := os.CreateTemp("", "peerserve-"+e.name+"-*.log")
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	srv, err := proc.Start(cmd)
	if err != nil {
		return nil, err
	}
	defer srv.Stop()
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	if err := srv.WaitHealthy(base, 5*time.Minute); err != nil {
		return nil, fmt.Errorf("%w (server log: %s)", err, logf.Name())
	}
	cfg := bench.Config{
		BaseURL: base, Endpoint: "completions", Dataset: "random", NumPrompts: o.prompts,
		InputLen: o.in, OutputLen: o.out, VocabSize: o.vocab, MinTokenID: 3,
		MaxConcurrency: c, Seed: 1, IgnoreEOS: true,
	}
	cfg.RequestRate, _ = bench.ParseRate("inf")
	r, err := bench.Run(context.Background(), cfg)
	if err != nil {
		return nil, fmt.Errorf("%w (server log: %s)", err, logf.Name())
	}
	fmt.Fprintf(log, "  output %.1f tok/s, TTFT %.0f ms, TPOT %.1f ms, failed %d\n", r.OutputThroughput, r.MeanTTFT, r.MeanTPOT, r.Failed)
	for _, e := range r.Errors {
		if e != "" {
			fmt.Fprintf(log, "  first error: %s (server log: %s)\n", e, logf.Name())
			break
		}
	}
	if r.Failed == 0 {
		os.Remove(logf.Name())
	}
	return r, nil
}

// stat is a median with its range.
type stat struct{ med, lo, hi float64 }

func summarize(xs []float64) stat {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	n := len(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return stat{med, s[0], s[n-1]}
}

func (s stat) String() string { return fmt.Sprintf("%.1f [%.1f–%.1f]", s.med, s.lo, s.hi) }

func report(w io.Writer, o options, res map[cell][]*bench.Result) {
	fmt.Fprintf(w, "%d requests × %d in / %d out, random token prompts, EOS ignored, %d threads, %d rounds (medians [min–max])\n\n",
		o.prompts, o.in, o.out, o.threads, o.rounds)
	fmt.Fprintln(w, "| model | in flight | engine | output tok/s | mean TTFT ms | mean TPOT ms | failed | ratio (output) |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	pick := func(rs []*bench.Result, f func(*bench.Result) float64) stat {
		var xs []float64
		for _, r := range rs {
			xs = append(xs, f(r))
		}
		return summarize(xs)
	}
	for _, m := range o.models {
		for _, c := range o.concs {
			var base float64
			for _, name := range []string{"llama-server", "pagoda"} {
				rs := res[cell{m, c, name}]
				if len(rs) == 0 {
					continue
				}
				thr := pick(rs, func(r *bench.Result) float64 { return r.OutputThroughput })
				ttft := pick(rs, func(r *bench.Result) float64 { return r.MeanTTFT })
				tpot := pick(rs, func(r *bench.Result) float64 { return r.MeanTPOT })
				failed := 0
				for _, r := range rs {
					failed += r.Failed
				}
				ratio := ""
				if name == "llama-server" {
					base = thr.med
				} else if base > 0 {
					ratio = fmt.Sprintf("%.2f", thr.med/base)
				}
				fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s | %d | %s |\n", filepath.Base(m), c, name, thr, ttft, tpot, failed, ratio)
			}
		}
	}
}
