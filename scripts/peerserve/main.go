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
	"math"
	"os"
	"os/exec"
	"pagoda/scripts/internal/proc"
	"path/filepath"
	"regexp"
	"slices"
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
	gens := map[cell][]float64{}
	for r := 0; r < o.rounds; r++ {
		for _, m := range o.models {
			for _, c := range o.concs {
				for i := range engines {
					e := engines[(i+r)%len(engines)]
					fmt.Fprintf(log, "round %d %s c=%d %s\n", r+1, filepath.Base(m), c, e.name)
					br, gen, err := serveOnce(e, m, c, o, log)
					if err != nil {
						return fmt.Errorf("%s on %s at %d in flight: %w", e.name, m, c, err)
					}
					res[cell{m, c, e.name}] = append(res[cell{m, c, e.name}], br)
					gens[cell{m, c, e.name}] = append(gens[cell{m, c, e.name}], gen)
				}
			}
		}
	}
	report(out, o, res, gens)
	return nil
}

// serveOnce starts e's server for model m at concurrency c, runs the
// benchmark and stops the server. gen is the output tokens per second the
// server generated, requests it cut short included: the client's figure
// where none failed, else llama-server's own count from its log (NaN for
// pagoda, whose log does not give it).
func serveOnce(e engine, m string, c int, o options, log io.Writer) (r *bench.Result, gen float64, err error) {
	port, err := proc.FreePort()
	if err != nil {
		return nil, 0, err
	}
	cmd := e.start(m, c, port)
	logf, err := os.CreateTemp("", "peerserve-"+e.name+"-*.log")
	if err != nil {
		return nil, 0, err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	srv, err := proc.Start(cmd)
	if err != nil {
		return nil, 0, err
	}
	defer srv.Stop()
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	if err := srv.WaitHealthy(base, 5*time.Minute); err != nil {
		return nil, 0, fmt.Errorf("%w (server log: %s)", err, logf.Name())
	}
	cfg := bench.Config{
		BaseURL: base, Endpoint: "completions", Dataset: "random", NumPrompts: o.prompts,
		InputLen: o.in, OutputLen: o.out, VocabSize: o.vocab, MinTokenID: 3,
		MaxConcurrency: c, Seed: 1, IgnoreEOS: true,
	}
	cfg.RequestRate, _ = bench.ParseRate("inf")
	r, err = bench.Run(context.Background(), cfg)
	if err != nil {
		return nil, 0, fmt.Errorf("%w (server log: %s)", err, logf.Name())
	}
	fmt.Fprintf(log, "  output %.1f tok/s, TTFT %.0f ms, TPOT %.1f ms, failed %d\n", r.OutputThroughput, r.MeanTTFT, r.MeanTPOT, r.Failed)
	for _, e := range r.Errors {
		if e != "" {
			fmt.Fprintf(log, "  first error: %s (server log: %s)\n", e, logf.Name())
			break
		}
	}
	gen = r.OutputThroughput
	if r.Failed > 0 {
		gen = math.NaN()
		if e.name == "llama-server" && r.Duration > 0 {
			if n, err := logGenerated(logf.Name(), o.in); err == nil {
				gen = float64(n) / r.Duration
				fmt.Fprintf(log, "  llama-server generated %d tokens, cut-off requests included: %.1f tok/s\n", n, gen)
			}
		}
	}
	if r.Failed == 0 {
		os.Remove(logf.Name())
	}
	return r, gen, nil
}

// stopLine is llama-server's line for a slot that stopped: its tokens,
// prompt and generated, less one.
var stopLine = regexp.MustCompile(`stop processing: n_tokens = (\d+)`)

// logGenerated counts the tokens llama-server generated in a run from its
// log, requests it stopped early included (llama-server's chat parser cuts
// a stream that ends inside a UTF-8 character, which random weights
// produce). The first stop is the client's test request.
func logGenerated(path string, in int) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	ms := stopLine.FindAllSubmatch(b, -1)
	if len(ms) < 2 {
		return 0, fmt.Errorf("%s: %d slot stops", path, len(ms))
	}
	n := 0
	for _, m := range ms[1:] {
		t, _ := strconv.Atoi(string(m[1]))
		n += max(0, t-in+1)
	}
	return n, nil
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

// report prints the table; gens (nil: not known) are the tokens per
// second each run's server generated, cut-off requests included.
func report(w io.Writer, o options, res map[cell][]*bench.Result, gens map[cell][]float64) {
	fmt.Fprintf(w, "%d requests × %d in / %d out, random token prompts, EOS ignored, %d threads, %d rounds (medians [min–max])\n\n",
		o.prompts, o.in, o.out, o.threads, o.rounds)
	fmt.Fprintln(w, "| model | in flight | engine | output tok/s | mean TTFT ms | mean TPOT ms | failed | ratio (output) | generated tok/s | ratio (generated) |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
	pick := func(rs []*bench.Result, f func(*bench.Result) float64) stat {
		var xs []float64
		for _, r := range rs {
			xs = append(xs, f(r))
		}
		return summarize(xs)
	}
	for _, m := range o.models {
		for _, c := range o.concs {
			var base, genBase float64
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
				ratio, gen, genRatio := "", "", ""
				g := gens[cell{m, c, name}]
				known := len(g) == len(rs) && !slices.ContainsFunc(g, math.IsNaN)
				var gs stat
				if known {
					gs = summarize(g)
					gen = gs.String()
				}
				if name == "llama-server" {
					base, genBase = thr.med, 0
					if known {
						genBase = gs.med
					}
				} else {
					if base > 0 {
						ratio = fmt.Sprintf("%.2f", thr.med/base)
					}
					if known && genBase > 0 {
						genRatio = fmt.Sprintf("%.2f", gs.med/genBase)
					}
				}
				fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s | %d | %s | %s | %s |\n", filepath.Base(m), c, name, thr, ttft, tpot, failed, ratio, gen, genRatio)
			}
		}
	}
}
