package main

import (
	"fmt"
	"io"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// parseLoads reads -load: distinct non-negative counts of competing
// processes, in the order given.
func parseLoads(s string) ([]int, error) {
	var out []int
	seen := map[int]bool{}
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 || n > 64 {
			return nil, fmt.Errorf("-load: %q is not a count of processes in [0, 64]", f)
		}
		if seen[n] {
			return nil, fmt.Errorf("-load: %d given twice", n)
		}
		seen[n] = true
		out = append(out, n)
	}
	return out, nil
}

// loadTest names a test run under load: "tg64" quiet, "tg64 load2" with
// two competing processes.
func loadTest(test string, level int) string {
	if level == 0 {
		return test
	}
	return fmt.Sprintf("%s load%d", test, level)
}

// startLoad starts n CPU-bound shell loops, each in its own process group,
// and returns the function that kills them. A shell loop rather than a
// goroutine: the competition must be another process, as a user's
// compiler or browser is, scheduled by the OS against both engines alike.
func startLoad(n int) (func(), error) {
	var cmds []*exec.Cmd
	stop := func() {
		for _, c := range cmds {
			_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			_ = c.Wait()
		}
	}
	for i := 0; i < n; i++ {
		c := exec.Command("sh", "-c", "while :; do :; done")
		c.SysProcAttr = spinnerAttr()
		if err := c.Start(); err != nil {
			stop()
			return nil, fmt.Errorf("starting a competing process: %w", err)
		}
		cmds = append(cmds, c)
	}
	return stop, nil
}

// reportLoad prints, for each test measured quiet and under load, each
// engine's median under load as a share of its own quiet median.
func reportLoad(w io.Writer, es []*engine, loads []int) {
	if len(loads) < 2 || !slices.Contains(loads, 0) {
		return
	}
	fmt.Fprintf(w, "\n| model | test | competing processes | llama.cpp %% of quiet | pagoda %% of quiet | ratio under load |\n| --- | --- | ---: | ---: | ---: | ---: |\n")
	var keys []key
	for k := range es[1].runs {
		if !strings.Contains(k.test, " load") {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].model != keys[j].model {
			return keys[i].model < keys[j].model
		}
		return keys[i].test > keys[j].test
	})
	for _, k := range keys {
		for _, level := range loads {
			if level == 0 {
				continue
			}
			lk := key{k.model, loadTest(k.test, level)}
			share := func(e *engine) (string, float64) {
				q, l := e.runs[k], e.runs[lk]
				if len(q) == 0 || len(l) == 0 {
					return "–", 0
				}
				return fmt.Sprintf("%.0f %%", 100*median(l)/median(q)), median(l)
			}
			a, la := share(es[0])
			b, lb := share(es[1])
			ratio := "–"
			if la > 0 && lb > 0 {
				ratio = fmt.Sprintf("%.2f", lb/la)
			}
			fmt.Fprintf(w, "| %s | %s | %d | %s | %s | %s |\n", k.model, k.test, level, a, b, ratio)
		}
	}
}
