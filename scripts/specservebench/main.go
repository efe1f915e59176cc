// Command specservebench measures speculative decoding where it is
// served: `pagoda serve` with and without --spec-method ngram, driven by
// `pagoda bench serve` (random prompts, greedy) at 1 and 8 requests in
// flight. Every repetition runs each setup once, in an order that rotates
// from one repetition to the next, on a fresh server, so drift in the
// machine's state hits every setup alike. It prints output tokens/s as the
// median [min–max] over repetitions, the ratio of each setup's median to
// plain's, and what the speculation controller chose (its
// pagoda:spec_ctl_* metrics after the run), and for the speculating setups
// the acceptance over the run (accepted / drafted tokens, and tokens
// emitted per verification, from the server's spec_decode counters).
// With -draft a draft model joins as the setups draft and
// draft-nocontrol; with -text the prompts are stretches of that text
// (tokenized by the model) instead of random ids, which is what acceptance
// is measured on. With -before, setups named before:SETUP run SETUP on
// another binary (the benchmark client stays this checkout's), so a
// change is measured against what it replaced in the same interleaving.
// The load average is printed with every run: the machine may be shared.
//
//	go run ./scripts/specservebench                  # stories260K, 3 reps: a few minutes on a quiet machine
//	go run ./scripts/specservebench -setups plain,ngram,ngram-nocontrol -reps 5
//	go run ./scripts/specservebench -m models/kjv3m.q8_0.gguf -draft DRAFT.gguf -text HELDOUT.txt -setups plain,ngram,draft
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"pagoda/scripts/internal/proc"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// setups are the server configurations by name: extra `pagoda serve` flags.
var setups = map[string][]string{
	"plain":           nil,
	"ngram":           {"--spec-method", "ngram"},
	"ngram-nocontrol": {"--spec-method", "ngram", "--spec-control=false"},
	"draft":           {"--spec-method", "draft"}, // with --draft from -draft
	"draft-nocontrol": {"--spec-method", "draft", "--spec-control=false"},
	// Always drafting --spec-tokens: the acceptance of the drafter itself,
	// not of the drafts the controller or cost model let through.
	"ngram-fixed": {"--spec-method", "ngram", "--spec-control=false", "--spec-fixed"},
	"draft-fixed": {"--spec-method", "draft", "--spec-control=false", "--spec-fixed"},
	// Trees: Medusa heads and an EAGLE draft, with --heads from -medusa
	// and -eagle; fixed, they verify --spec-tokens tree nodes every step.
	"medusa":       {"--spec-method", "medusa"},
	"medusa-fixed": {"--spec-method", "medusa", "--spec-control=false", "--spec-fixed", "--spec-tokens", "16"},
	"eagle":        {"--spec-method", "eagle"},
	"eagle-fixed":  {"--spec-method", "eagle", "--spec-control=false", "--spec-fixed", "--spec-tokens", "16"},
	// A fixed top-1 chain of --spec-tree-depth (5) nodes, the rung of the
	// controller's tree ladder that cheap drafts and dear rows favour.
	"eagle-chain": {"--spec-method", "eagle", "--spec-control=false", "--spec-fixed", "--spec-tokens", "5", "--spec-tree-topk", "1"},
	// The controller choosing plain or a rung of the ladder below a
	// 16-node tree per load.
	"eagle-ladder": {"--spec-method", "eagle", "--spec-tokens", "16"},
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "specservebench:", err)
		os.Exit(1)
	}
}

type key struct {
	setup string
	conc  int
}

func run(args []string) error {
	fs := flag.NewFlagSet("specservebench", flag.ContinueOnError)
	bin := fs.String("pagoda", "", "pagoda binary (default: built from this checkout)")
	model := fs.String("m", "", "model for pagoda serve -m (default: its built-in stories260K)")
	names := fs.String("setups", "plain,ngram", "setups, comma separated: "+strings.Join(slices.Sorted(maps.Keys(setups)), ", "))
	concs := fs.String("concurrency", "1,8", "requests in flight, comma separated")
	reps := fs.Int("reps", 3, "repetitions of every setup at every concurrency")
	prompts := fs.Int("num-prompts", 32, "requests per run")
	inLen := fs.Int("input-len", 32, "prompt tokens")
	outLen := fs.Int("output-len", 128, "tokens generated per request")
	vocab := fs.Int("vocab-size", 512, "random prompt ids below this")
	minID := fs.Int("min-token-id", 3, "random prompt ids from this up")
	threads := fs.Int("threads", 0, "pagoda serve --threads (0 = its default)")
	serveArgs := fs.String("serve-args", "", "more pagoda serve flags, space separated")
	draft := fs.String("draft", "", "draft model for the draft setups")
	medusaHeads := fs.String("medusa", "", "Medusa heads (side file) for the medusa setups")
	eagleHeads := fs.String("eagle", "", "EAGLE draft (side file) for the eagle setups")
	text := fs.String("text", "", "cut the prompts from this text file (tokenized by -m) instead of random ids")
	before := fs.String("before", "", "another pagoda binary: setups named before:SETUP run SETUP with it (a change's before and after, interleaved)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var order []string
	for _, n := range strings.Split(*names, ",") {
		if base, ok := strings.CutPrefix(n, "before:"); ok && *before == "" {
			return fmt.Errorf("setup %s needs -before", n)
		} else if _, ok := setups[base]; !ok {
			return fmt.Errorf("unknown setup %q", n)
		}
		if strings.HasPrefix(strings.TrimPrefix(n, "before:"), "draft") && *draft == "" {
			return fmt.Errorf("setup %s needs -draft", n)
		}
		order = append(order, n)
	}
	if *text != "" && *model == "" {
		return fmt.Errorf("-text needs -m: the prompts are tokenized with the model's vocabulary")
	}
	var cs []int
	for _, c := range strings.Split(*concs, ",") {
		n, err := strconv.Atoi(c)
		if err != nil || n < 1 {
			return fmt.Errorf("bad concurrency %q", c)
		}
		cs = append(cs, n)
	}
	tmp, err := os.MkdirTemp("", "specservebench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if *bin == "" {
		built, cleanup, err := proc.BuildPagoda(os.Stderr)
		if err != nil {
			return err
		}
		defer cleanup()
		*bin = built
	}
	tps := map[key][]float64{}
	ctl := map[key][]string{}
	acc := map[key][]accept{}
	start := time.Now()
	for rep := range *reps {
		for ci, conc := range cs {
			for i := range order {
				name := order[(i+rep+ci)%len(order)]
				base, old := strings.CutPrefix(name, "before:")
				serveBin := *bin
				if old {
					serveBin = *before
				}
				extra := slices.Clone(setups[base])
				if *model != "" {
					extra = append(extra, "-m", *model)
				}
				if *threads > 0 {
					extra = append(extra, "--threads", strconv.Itoa(*threads))
				}
				if strings.HasPrefix(base, "medusa") {
					extra = append(extra, "--heads", *medusaHeads)
				}
				if strings.HasPrefix(base, "eagle") {
					extra = append(extra, "--heads", *eagleHeads)
				}
				if strings.HasPrefix(base, "draft") {
					extra = append(extra, "--draft", *draft)
				}
				extra = append(extra, strings.Fields(*serveArgs)...)
				bench := []string{"-num-prompts", strconv.Itoa(*prompts), "-max-concurrency", strconv.Itoa(conc),
					"-input-len", strconv.Itoa(*inLen), "-output-len", strconv.Itoa(*outLen),
					"-vocab-size", strconv.Itoa(*vocab), "-min-token-id", strconv.Itoa(*minID), "-temperature", "0",
					"-seed", strconv.Itoa(rep)}
				if *text != "" {
					bench = append(bench, "-dataset", "text", "-text-file", *text, "-tokenizer", *model)
				}
				tp, a, state, err := once(serveBin, *bin, tmp, extra, bench)
				if err != nil {
					return fmt.Errorf("%s at %d in flight: %w", name, conc, err)
				}
				k := key{name, conc}
				tps[k] = append(tps[k], tp)
				ctl[k] = append(ctl[k], state)
				acc[k] = append(acc[k], a)
				fmt.Fprintf(os.Stderr, "rep %d  %2d in flight  %-16s %8.1f tok/s  %6.0f tok/CPU-s  %s  %s  load %s  (%s)\n", rep+1, conc, name, tp, a.perCPU(), a, state, loadAvg(), time.Since(start).Round(time.Second))
			}
		}
	}
	fmt.Printf("\noutput tokens/s, median [min–max] over %d interleaved reps; %d prompts × %d in / %d out tokens, greedy\n\n", *reps, *prompts, *inLen, *outLen)
	fmt.Printf("%-10s", "in flight")
	for _, n := range order {
		fmt.Printf(" | %-26s", n)
	}
	fmt.Println()
	for _, c := range cs {
		fmt.Printf("%-10d", c)
		base := median(tps[key{order[0], c}])
		for _, n := range order {
			xs := tps[key{n, c}]
			cell := fmt.Sprintf("%.1f [%.1f–%.1f]", median(xs), slices.Min(xs), slices.Max(xs))
			if n != order[0] && base > 0 {
				cell += fmt.Sprintf(" ×%.2f", median(xs)/base)
			}
			fmt.Printf(" | %-26s", cell)
		}
		fmt.Println()
	}
	fmt.Printf("\noutput tokens per CPU-second of the server, median [min–max] (robust to other jobs sharing the cores)\n\n")
	fmt.Printf("%-10s", "in flight")
	for _, n := range order {
		fmt.Printf(" | %-26s", n)
	}
	fmt.Println()
	for _, c := range cs {
		fmt.Printf("%-10d", c)
		var base float64
		for i, n := range order {
			var xs []float64
			for _, a := range acc[key{n, c}] {
				xs = append(xs, a.perCPU())
			}
			cell := fmt.Sprintf("%.0f [%.0f–%.0f]", median(xs), slices.Min(xs), slices.Max(xs))
			if i == 0 {
				base = median(xs)
			} else if base > 0 {
				cell += fmt.Sprintf(" ×%.2f", median(xs)/base)
			}
			fmt.Printf(" | %-26s", cell)
		}
		fmt.Println()
	}
	fmt.Println("\nacceptance, all reps pooled: accepted / drafted tokens; tokens emitted per verification (mean accepted length + 1); drafts (verifications)")
	for _, c := range cs {
		for _, n := range order {
			var sum accept
			for _, a := range acc[key{n, c}] {
				sum.drafts += a.drafts
				sum.drafted += a.drafted
				sum.accepted += a.accepted
			}
			if sum.drafts > 0 {
				fmt.Printf("  %2d in flight %-16s %s\n", c, n, sum)
			}
		}
	}
	fmt.Println("\ncontroller (last rep): exploited arm per batch bucket, measured steps spec/plain (probes)")
	for _, c := range cs {
		for _, n := range order {
			if s := ctl[key{n, c}]; len(s) > 0 && s[len(s)-1] != "" {
				fmt.Printf("  %2d in flight %-16s %s\n", c, n, s[len(s)-1])
			}
		}
	}
	fmt.Printf("\ntook %s\n", time.Since(start).Round(time.Second))
	return nil
}

// accept is a run's speculation counters (the server's spec_decode_*),
// its output tokens and the CPU seconds the server spent on them.
type accept struct{ drafts, drafted, accepted, tokens, cpu float64 }

// perCPU is output tokens per CPU-second of the server: unlike tokens/s
// it hardly moves when other jobs take the cores, so on a shared
// machine it tells setups apart where wall-clock rates do not.
func (a accept) perCPU() float64 {
	if a.cpu <= 0 {
		return 0
	}
	return a.tokens / a.cpu
}

// cpuSeconds is the user+system CPU time of process pid so far (Linux;
// 0 elsewhere).
func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command name (which may hold spaces): state is
	// the first, utime and stime the 12th and 13th.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (u + st) / 100 // USER_HZ
}

func (a accept) String() string {
	if a.drafts == 0 {
		return "no drafts"
	}
	return fmt.Sprintf("accepted %.0f/%.0f = %.1f%%, %.2f tokens/verification, %.0f drafts",
		a.accepted, a.drafted, 100*a.accepted/a.drafted, 1+a.accepted/a.drafts, a.drafts)
}

// loadAvg is the 1-minute load average (Linux), or "?".
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}

// once starts a server with extra flags, runs the benchmark against it and
// stops it: the output tokens/s, the speculation counters, and the
// controller's state in words.
func once(bin, client, tmp string, extra, bench []string) (float64, accept, string, error) {
	var a accept
	port, err := proc.FreePort()
	if err != nil {
		return 0, a, "", err
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	srv := exec.Command(bin, append([]string{"serve", "--port", strconv.Itoa(port)}, extra...)...)
	logf, err := os.Create(filepath.Join(tmp, "serve.log"))
	if err != nil {
		return 0, a, "", err
	}
	defer logf.Close()
	srv.Stdout, srv.Stderr = logf, logf
	s, err := proc.Start(srv)
	if err != nil {
		return 0, a, "", err
	}
	defer s.Stop()
	if err := s.WaitHealthy(base, 60*time.Second); err != nil {
		log, _ := os.ReadFile(logf.Name())
		return 0, a, "", fmt.Errorf("%w; server log:\n%s", err, log)
	}
	cpu0 := cpuSeconds(s.Pid())
	out := filepath.Join(tmp, "bench.json")
	b := exec.Command(client, append([]string{"bench", "serve", "-base-url", base, "-json", out}, bench...)...)
	b.Stdout, b.Stderr = io.Discard, os.Stderr
	if err := b.Run(); err != nil {
		return 0, a, "", fmt.Errorf("bench serve: %w", err)
	}
	a.cpu = cpuSeconds(s.Pid()) - cpu0
	var r struct {
		Completed        int     `json:"completed"`
		TotalOutput      float64 `json:"total_output_tokens"`
		OutputThroughput float64 `json:"output_throughput"`
		Drafts           float64 `json:"spec_decode_num_drafts"`
		DraftTokens      float64 `json:"spec_decode_num_draft_tokens"`
		Accepted         float64 `json:"spec_decode_num_accepted_tokens"`
	}
	data, err := os.ReadFile(out)
	if err != nil {
		return 0, a, "", err
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return 0, a, "", err
	}
	a.drafts, a.drafted, a.accepted, a.tokens = r.Drafts, r.DraftTokens, r.Accepted, r.TotalOutput
	return r.OutputThroughput, a, controllerState(base), nil
}

// controllerState summarises the server's pagoda:spec_ctl_* metrics: the
// buckets whose arm was measured, and the step counters.
func controllerState(base string) string {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	arms := map[string]string{}
	rates := map[string]bool{}
	var steps [3]string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		if len(f) != 2 || !strings.HasPrefix(line, "pagoda:spec_ctl_") {
			continue
		}
		batch := label(f[0], "batch")
		switch {
		case strings.HasPrefix(line, "pagoda:spec_ctl_arm{"):
			arms[batch] = map[string]string{"1": "spec", "0": "plain"}[f[1]]
		case strings.HasPrefix(line, "pagoda:spec_ctl_tokens_per_second{"):
			if v, _ := strconv.ParseFloat(f[1], 64); v > 0 {
				rates[batch] = true
			}
		case strings.HasPrefix(line, "pagoda:spec_ctl_spec_steps_total"):
			steps[0] = f[1]
		case strings.HasPrefix(line, "pagoda:spec_ctl_plain_steps_total"):
			steps[1] = f[1]
		case strings.HasPrefix(line, "pagoda:spec_ctl_probe_steps_total"):
			steps[2] = f[1]
		}
	}
	if steps[0] == "" {
		return ""
	}
	if len(rates) == 0 && steps[0] == "0" && steps[1] == "0" {
		return "controller off"
	}
	var bs []string
	for b := range rates {
		bs = append(bs, b)
	}
	slices.SortFunc(bs, func(a, b string) int { return leading(a) - leading(b) })
	var parts []string
	for _, b := range bs {
		parts = append(parts, b+":"+arms[b])
	}
	return fmt.Sprintf("%s; steps %s/%s (%s)", strings.Join(parts, " "), steps[0], steps[1], steps[2])
}

func label(series, name string) string {
	i := strings.Index(series, name+`="`)
	if i < 0 {
		return ""
	}
	rest := series[i+len(name)+2:]
	return rest[:strings.IndexByte(rest, '"')]
}

func leading(s string) int {
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int(c-'0')
	}
	return n
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
