// Command peerbench measures Pagoda against llama.cpp side by side: the
// same GGUF files, the same threads, llama-bench and `pagoda bench` run in
// alternation (so drift in the machine's state hits both), medians with
// their spread, and the ratio per test. llama.cpp is a benchmark peer that
// the user builds (CPU-only, native, Release); nothing here links it.
//
//	go run ./scripts/peerbench -llama ~/llama.cpp/build -m a.gguf,b.gguf
//
// With -d, decode runs with that many tokens already in the KV cache, for
// each KV-cache format of -kv: `pagoda bench -d`, and on the llama.cpp side
// llama-server (flash attention, -ctk/-ctv) answering one prompt of d
// random tokens per repetition, timed by its own per-request decode timings
// (llama-bench gained -d only in later versions).
//
//	go run ./scripts/peerbench -llama ~/llama.cpp/build -m a.gguf -p 0 -d 4096 -kv f16,q8_0,q4_0
package main

import (
	"bytes"
	"encoding/json"
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
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "peerbench:", err)
		os.Exit(1)
	}
}

// sample is one repetition's throughput of one test by one engine.
type key struct{ model, test string }

type engine struct {
	name string
	// measure runs the engine's benchmark on model with KV format kv ("" =
	// the engine's default) and returns samples per test name.
	measure func(model, kv string) (map[string][]float64, string, error)
	runs    map[key][]float64
	commit  string
}

// command runs c and parses its standard output.
func command(c *exec.Cmd, parse func([]byte) (map[string][]float64, string, error)) (map[string][]float64, string, error) {
	var stdout bytes.Buffer
	c.Stdout, c.Stderr = &stdout, io.Discard
	if err := c.Run(); err != nil {
		return nil, "", err
	}
	return parse(stdout.Bytes())
}

func run(args []string, out, log io.Writer) error {
	fs := flag.NewFlagSet("peerbench", flag.ContinueOnError)
	llama := fs.String("llama", "", "llama.cpp build directory (holding bin/llama-bench) or the llama-bench binary")
	pagoda := fs.String("pagoda", "", "pagoda binary (default: built from this checkout)")
	models := fs.String("m", "", "GGUF files, comma separated")
	pp := fs.Int("p", 512, "prompt tokens (0 = skip pp)")
	tg := fs.Int("n", 128, "generated tokens (0 = skip tg)")
	threads := fs.Int("t", 2, "threads, the same for both")
	reps := fs.Int("r", 3, "repetitions per engine per round")
	rounds := fs.Int("rounds", 3, "rounds; each runs both engines once, alternating which goes first")
	depth := fs.Int("d", 0, "tokens already in the KV cache for tg (llama.cpp side through llama-server)")
	vocab := fs.Int("vocab-size", 32000, "with -d: the llama.cpp prompt's random token ids are drawn below this")
	kvs := fs.String("kv", "", "with -d: KV-cache formats to test, comma separated (f16, q8_0, q4_0, …; pagoda-only ones such as kivi4 skip llama.cpp)")
	peer := fs.String("peer-depth", "bench", "with -d: how llama.cpp decodes at depth: bench (llama-bench -d; falls back to server when it lacks -d) or server (llama-server)")
	loadFlag := fs.String("load", "0", "numbers of competing CPU-bound processes to run during the measurements, comma separated (e.g. 0,1,2: quiet, then one, then two busy loops)")
	fs.SetOutput(log)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *llama == "" || *models == "" {
		return fmt.Errorf("-llama DIR and -m MODELS are required")
	}
	if *pp < 0 || *tg < 0 || *pp+*tg == 0 || *threads < 1 || *reps < 1 || *rounds < 1 || *depth < 0 {
		return fmt.Errorf("need -p/-n ≥ 0 (not both 0), -t, -r and -rounds ≥ 1, -d ≥ 0")
	}
	if *depth > 0 && (*pp != 0 || *tg == 0) {
		return fmt.Errorf("-d measures decode only: give -p 0 and -n > 0")
	}
	if *peer != "bench" && *peer != "server" {
		return fmt.Errorf("-peer-depth is bench or server, not %q", *peer)
	}
	if *vocab < 4 {
		return fmt.Errorf("-vocab-size must be at least 4")
	}
	loads, err := parseLoads(*loadFlag)
	if err != nil {
		return err
	}
	formats := []string{""}
	if *kvs != "" {
		formats = strings.Split(*kvs, ",")
	}
	tool := "llama-bench"
	lb := *llama
	if st, err := os.Stat(lb); err == nil && st.IsDir() {
		lb = filepath.Join(lb, "bin", tool)
	}
	if *depth > 0 && (*peer == "server" || !benchHasDepth(lb)) {
		tool, lb = "llama-server", filepath.Join(filepath.Dir(lb), "llama-server")
	}
	if _, err := os.Stat(lb); err != nil {
		return fmt.Errorf("%s: %w", tool, err)
	}
	pg := *pagoda
	if pg == "" {
		bin, cleanup, err := proc.BuildPagoda(log)
		if err != nil {
			return err
		}
		defer cleanup()
		pg = bin
	}
	ts := strconv.Itoa(*threads)
	r := strconv.Itoa(*reps)
	engines := []*engine{
		{name: "llama.cpp", runs: map[key][]float64{}, measure: func(m, kv string) (map[string][]float64, string, error) {
			if *depth > 0 && tool == "llama-server" {
				return llamaServerDepth(lb, m, kv, *depth, *tg, *threads, *reps, *vocab)
			}
			if *depth > 0 || kv != "" {
				return llamaBenchKV(lb, m, kv, *pp, *tg, *depth, *threads, *reps)
			}
			return command(exec.Command(lb, "-m", m, "-p", strconv.Itoa(*pp), "-n", strconv.Itoa(*tg), "-t", ts, "-r", r, "-o", "json"), parseLlama)
		}},
		{name: "pagoda", runs: map[key][]float64{}, measure: func(m, kv string) (map[string][]float64, string, error) {
			a := []string{"bench", "-m", m, "-p", strconv.Itoa(*pp), "-n", strconv.Itoa(*tg), "-t", ts, "-r", r, "-bw", "0", "-peak", "0", "-json"}
			if *depth > 0 {
				a = append(a, "-d", strconv.Itoa(*depth))
				if kv == "" {
					kv = "f16" // llama.cpp's default cache; pagoda bench's own default is exact f32
				}
			}
			if kv != "" {
				a = append(a, "--kv-dtype", kv)
			}
			res, commit, err := command(exec.Command(pg, a...), parsePagoda)
			if err == nil && (*depth > 0 || kv != "") {
				res = renameDepth(res, kv)
			}
			return res, commit, err
		}},
	}
	var files []string
	for _, m := range strings.Split(*models, ",") {
		if m = strings.TrimSpace(m); m != "" {
			files = append(files, m)
		}
	}
	for round := 0; round < *rounds; round++ {
		for _, level := range loads {
			stop, err := startLoad(level)
			if err != nil {
				return err
			}
			err = measureRound(engines, files, formats, round, *rounds, level, log)
			stop()
			if err != nil {
				return err
			}
		}
	}
	report(out, engines, files, *threads)
	reportLoad(out, engines, loads)
	return nil
}

// measureRound runs each engine once per model and KV format, alternating
// which engine goes first from round to round.
func measureRound(engines []*engine, files, formats []string, round, rounds, level int, log io.Writer) error {
	for _, m := range files {
		order := []*engine{engines[0], engines[1]}
		if round%2 == 1 {
			order[0], order[1] = order[1], order[0]
		}
		for _, kv := range formats {
			for _, e := range order {
				if e.name == "llama.cpp" && !llamaKV(kv) {
					continue
				}
				fmt.Fprintf(log, "round %d/%d: %s on %s %s (load %d)\n", round+1, rounds, e.name, filepath.Base(m), kv, level)
				res, commit, err := e.measure(m, kv)
				if err != nil {
					return fmt.Errorf("%s on %s: %w", e.name, m, err)
				}
				e.commit = commit
				for test, s := range res {
					// Logged as it comes, so a run cut short keeps its samples.
					fmt.Fprintf(log, "  %s %s: %.2f t/s\n", e.name, test, s)
					k := key{filepath.Base(m), loadTest(test, level)}
					e.runs[k] = append(e.runs[k], s...)
				}
			}
		}
	}
	return nil
}

func report(w io.Writer, es []*engine, files []string, threads int) {
	fmt.Fprintf(w, "| model | test | llama.cpp t/s | pagoda t/s | ratio |\n| --- | --- | ---: | ---: | ---: |\n")
	var keys []key
	for k := range es[1].runs {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].model != keys[j].model {
			return keys[i].model < keys[j].model
		}
		return keys[i].test > keys[j].test // pp before tg
	})
	for _, k := range keys {
		a, b := es[0].runs[k], es[1].runs[k]
		if len(a) == 0 {
			fmt.Fprintf(w, "| %s | %s | – | %s | – |\n", k.model, k.test, spread(b))
			continue
		}
		ma, mb := median(a), median(b)
		fmt.Fprintf(w, "| %s | %s | %s | %s | %.2f |\n", k.model, k.test, spread(a), spread(b), mb/ma)
	}
	fmt.Fprintf(w, "\nmedians [min–max] over all repetitions; %d threads; llama.cpp %s, pagoda %s\n", threads, es[0].commit, es[1].commit)
}

func spread(x []float64) string {
	s := append([]float64(nil), x...)
	sort.Float64s(s)
	return fmt.Sprintf("%.2f [%.2f–%.2f] n=%d", median(s), s[0], s[len(s)-1], len(s))
}

func median(x []float64) float64 {
	s := append([]float64(nil), x...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// parseLlama reads llama-bench's `-o json`: one object per test with
// n_prompt, n_gen and the per-repetition samples_ts.
func parseLlama(b []byte) (map[string][]float64, string, error) {
	var rs []struct {
		Commit  string    `json:"build_commit"`
		NPrompt int       `json:"n_prompt"`
		NGen    int       `json:"n_gen"`
		Samples []float64 `json:"samples_ts"`
	}
	if err := json.Unmarshal(b, &rs); err != nil {
		return nil, "", fmt.Errorf("reading llama-bench's JSON: %w", err)
	}
	out := map[string][]float64{}
	commit := ""
	for _, r := range rs {
		test := ""
		switch {
		case r.NPrompt > 0 && r.NGen == 0:
			test = fmt.Sprintf("pp%d", r.NPrompt)
		case r.NGen > 0 && r.NPrompt == 0:
			test = fmt.Sprintf("tg%d", r.NGen)
		default:
			continue
		}
		out[test] = append(out[test], r.Samples...)
		commit = r.Commit
	}
	if len(out) == 0 {
		return nil, "", fmt.Errorf("llama-bench reported no pp or tg test")
	}
	return out, commit, nil
}

// parsePagoda reads `pagoda bench -json`.
func parsePagoda(b []byte) (map[string][]float64, string, error) {
	var rs []struct {
		Test    string    `json:"test"`
		Samples []float64 `json:"samples_ts"`
		Commit  string    `json:"commit"`
	}
	if err := json.Unmarshal(b, &rs); err != nil {
		return nil, "", fmt.Errorf("reading pagoda bench's JSON: %w", err)
	}
	out := map[string][]float64{}
	commit := ""
	for _, r := range rs {
		out[r.Test] = append(out[r.Test], r.Samples...)
		commit = r.Commit
	}
	if len(out) == 0 {
		return nil, "", fmt.Errorf("pagoda bench reported no test")
	}
	return out, commit, nil
}
