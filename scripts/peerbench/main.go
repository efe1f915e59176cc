// Command peerbench measures Pagoda against llama.cpp side by side: the
// same GGUF files, the same threads, llama-bench and `pagoda bench` run in
// alternation (so drift in the machine's state hits both), medians with
// their spread, and the ratio per test. llama.cpp is a benchmark peer that
// the user builds (CPU-only, native, Release); nothing here links it.
//
//	go run ./scripts/peerbench -llama ~/llama.cpp/build -m a.gguf,b.gguf
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
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
	name   string
	cmd    func(model string) *exec.Cmd
	parse  func([]byte) (map[string][]float64, string, error)
	runs   map[key][]float64
	commit string
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
	fs.SetOutput(log)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *llama == "" || *models == "" {
		return fmt.Errorf("-llama DIR and -m MODELS are required")
	}
	if *pp < 0 || *tg < 0 || *pp+*tg == 0 || *threads < 1 || *reps < 1 || *rounds < 1 {
		return fmt.Errorf("need -p/-n ≥ 0 (not both 0), -t, -r and -rounds ≥ 1")
	}
	lb := *llama
	if st, err := os.Stat(lb); err == nil && st.IsDir() {
		lb = filepath.Join(lb, "bin", "llama-bench")
	}
	if _, err := os.Stat(lb); err != nil {
		return fmt.Errorf("llama-bench: %w", err)
	}
	pg := *pagoda
	if pg == "" {
		dir, err := os.MkdirTemp("", "peerbench")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		pg = filepath.Join(dir, "pagoda")
		fmt.Fprintln(log, "building pagoda …")
		b := exec.Command("go", "build", "-o", pg, "./cmd/pagoda")
		b.Stderr = log
		if err := b.Run(); err != nil {
			return fmt.Errorf("building pagoda (run from the repository root or pass -pagoda): %w", err)
		}
	}
	ts := strconv.Itoa(*threads)
	r := strconv.Itoa(*reps)
	engines := []*engine{
		{name: "llama.cpp", runs: map[key][]float64{}, parse: parseLlama, cmd: func(m string) *exec.Cmd {
			return exec.Command(lb, "-m", m, "-p", strconv.Itoa(*pp), "-n", strconv.Itoa(*tg), "-t", ts, "-r", r, "-o", "json")
		}},
		{name: "pagoda", runs: map[key][]float64{}, parse: parsePagoda, cmd: func(m string) *exec.Cmd {
			return exec.Command(pg, "bench", "-m", m, "-p", strconv.Itoa(*pp), "-n", strconv.Itoa(*tg), "-t", ts, "-r", r, "-bw", "0", "-json")
		}},
	}
	var files []string
	for _, m := range strings.Split(*models, ",") {
		if m = strings.TrimSpace(m); m != "" {
			files = append(files, m)
		}
	}
	for round := 0; round < *rounds; round++ {
		for _, m := range files {
			order := []*engine{engines[0], engines[1]}
			if round%2 == 1 {
				order[0], order[1] = order[1], order[0]
			}
			for _, e := range order {
				fmt.Fprintf(log, "round %d/%d: %s on %s\n", round+1, *rounds, e.name, filepath.Base(m))
				var stdout bytes.Buffer
				c := e.cmd(m)
				c.Stdout, c.Stderr = &stdout, io.Discard
				if err := c.Run(); err != nil {
					return fmt.Errorf("%s on %s: %w", e.name, m, err)
				}
				res, commit, err := e.parse(stdout.Bytes())
				if err != nil {
					return fmt.Errorf("%s on %s: %w", e.name, m, err)
				}
				e.commit = commit
				for test, s := range res {
					k := key{filepath.Base(m), test}
					e.runs[k] = append(e.runs[k], s...)
				}
			}
		}
	}
	report(out, engines, files, *threads)
	return nil
}

func report(w io.Writer, es []*engine, files []string, threads int) {
	fmt.Fprintf(w, "| model | test | llama.cpp t/s | pagoda t/s | ratio |\n| --- | --- | ---: | ---: | ---: |\n")
	var keys []key
	for k := range es[0].runs {
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
		if len(b) == 0 {
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
