// Package speed measures prompt processing (pp) and token generation (tg)
// throughput of a model the way llama-bench does, with the provenance a
// comparison needs (commit, CPU, threads, model, quant, spread).
package speed

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"pagoda/model"
)

// Test is one measurement: "pp" of N prompt tokens in batches, or "tg" of N
// tokens decoded one at a time, after Depth tokens already in the cache.
type Test struct {
	Kind  string // "pp" or "tg"
	N     int
	Depth int // tokens prefilled, untimed, before the measured ones
}

func (t Test) String() string {
	if t.Depth > 0 {
		return fmt.Sprintf("%s%d @ d%d", t.Kind, t.N, t.Depth)
	}
	return fmt.Sprintf("%s%d", t.Kind, t.N)
}

// Result is one test's repetitions.
type Result struct {
	Model     string    `json:"model"`
	Quant     string    `json:"quant"`
	SizeBytes int64     `json:"size_bytes"`
	Params    int64     `json:"params"`
	Threads   int       `json:"threads"`
	Test      string    `json:"test"`
	Tokens    int       `json:"n_tokens"`
	Samples   []float64 `json:"samples_ts"` // tokens per second of each repetition
	Mean      float64   `json:"avg_ts"`
	Stddev    float64   `json:"stddev_ts"`
	Min       float64   `json:"min_ts"`
	Max       float64   `json:"max_ts"`
	Commit    string    `json:"commit"`
	CPU       string    `json:"cpu"`
	GoVersion string    `json:"go_version"`
	Batch     int       `json:"n_batch"`
	// GBps is the weight bytes streamed per second (tg only): the share of
	// memory bandwidth decode reaches.
	GBps float64 `json:"weights_gb_per_s,omitempty"`
}

// Run measures t on m, reps times after one warm-up run.
func Run(m *model.Model, t Test, reps, batch int) (*Result, error) {
	return RunCache(m, t, reps, batch, nil)
}

// RunCache is Run on the KV caches newCache makes for n positions (nil:
// the model's flat f32 cache).
func RunCache(m *model.Model, t Test, reps, batch int, newCache func(n int) (model.KVCache, error)) (*Result, error) {
	if t.N <= 0 || reps <= 0 {
		return nil, fmt.Errorf("speed: %s: N and repetitions must be positive", t)
	}
	c := &m.Config
	if t.Depth < 0 || t.N+t.Depth > c.ContextLen {
		return nil, fmt.Errorf("speed: %s exceeds the context of %d", t, c.ContextLen)
	}
	if newCache == nil {
		newCache = func(n int) (model.KVCache, error) { return m.NewFlatCache(1, n), nil }
	}
	if batch <= 0 {
		batch = 512
	}
	rng := rand.New(rand.NewPCG(1, 2))
	toks := make([]int32, t.Depth+t.N)
	for i := range toks {
		toks[i] = int32(rng.IntN(c.VocabSize))
	}
	prompt := func(cache model.KVCache, from, to int) error {
		for lo := from; lo < to; lo += batch {
			hi := min(lo+batch, to)
			b := &model.Batch{Tokens: toks[lo:hi], Pos: make([]int32, hi-lo), Seq: make([]int32, hi-lo)}
			for i := range b.Pos {
				b.Pos[i] = int32(lo + i)
			}
			if _, err := m.Forward(b, cache); err != nil {
				return err
			}
		}
		return nil
	}
	once := func() (time.Duration, error) {
		cache, err := newCache(t.Depth + t.N)
		if err != nil {
			return 0, err
		}
		// The depth is filled first and not timed (llama-bench -d).
		if err := prompt(cache, 0, t.Depth); err != nil {
			return 0, err
		}
		start := time.Now()
		switch t.Kind {
		case "pp":
			for lo := t.Depth; lo < t.Depth+t.N; lo += batch {
				hi := min(lo+batch, t.Depth+t.N)
				b := &model.Batch{Tokens: toks[lo:hi], Pos: make([]int32, hi-lo), Seq: make([]int32, hi-lo)}
				for i := range b.Pos {
					b.Pos[i] = int32(lo + i)
				}
				if _, err := m.Forward(b, cache); err != nil {
					return 0, err
				}
			}
		case "tg":
			for i := t.Depth; i < t.Depth+t.N; i++ {
				b := &model.Batch{Tokens: toks[i : i+1], Pos: []int32{int32(i)}, Seq: []int32{0}}
				if _, err := m.Forward(b, cache); err != nil {
					return 0, err
				}
			}
		default:
			return 0, fmt.Errorf("speed: unknown test kind %q", t.Kind)
		}
		return time.Since(start), nil
	}
	if _, err := once(); err != nil {
		return nil, err
	}
	r := &Result{Test: t.String(), Tokens: t.N, Threads: m.Pool().Threads(), Batch: batch,
		Commit: Commit(), CPU: CPUName(), GoVersion: runtime.Version(), Params: c.Params()}
	r.SizeBytes, r.Quant = weightBytes(m)
	for i := 0; i < reps; i++ {
		d, err := once()
		if err != nil {
			return nil, err
		}
		r.Samples = append(r.Samples, float64(t.N)/d.Seconds())
	}
	r.Mean, r.Stddev, r.Min, r.Max = stats(r.Samples)
	if t.Kind == "tg" {
		r.GBps = r.Mean * float64(r.SizeBytes) / 1e9
	}
	return r, nil
}

func stats(x []float64) (mean, sd, lo, hi float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, v := range x {
		mean += v
		lo, hi = math.Min(lo, v), math.Max(hi, v)
	}
	mean /= float64(len(x))
	for _, v := range x {
		sd += (v - mean) * (v - mean)
	}
	if len(x) > 1 {
		sd = math.Sqrt(sd / float64(len(x)-1))
	}
	return
}

// weightBytes sums the matrices a decode step reads and names the mix of
// their types (most common first), e.g. "Q4_0+Q6_K".
func weightBytes(m *model.Model) (int64, string) {
	counts := map[string]int64{}
	var total int64
	// A decode step reads every matrix but the embedding table, of which it
	// reads one row (unless the table doubles as the output matrix).
	for _, w := range m.W.Matrices() {
		if w == m.W.Embd && m.W.Output != m.W.Embd {
			continue
		}
		counts[w.Type.String()] += int64(len(w.Data))
		total += int64(len(w.Data))
	}
	var names []string
	for len(counts) > 0 {
		best, bn := "", int64(-1)
		for k, v := range counts {
			if v > bn || (v == bn && k < best) {
				best, bn = k, v
			}
		}
		names = append(names, best)
		delete(counts, best)
	}
	return total, strings.Join(names, "+")
}

// Commit is the VCS revision the binary was built from ("unknown" in tests).
func Commit() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		rev, dirty := "", false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if rev != "" {
			if len(rev) > 12 {
				rev = rev[:12]
			}
			if dirty {
				rev += "+dirty"
			}
			return rev
		}
	}
	// Builds with -buildvcs=false (some environments set it in GOFLAGS)
	// carry no revision: ask git about the working directory instead.
	if out, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output(); err == nil {
		rev := strings.TrimSpace(string(out))
		if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(st) > 0 {
			rev += "+dirty"
		}
		return rev + " (git)"
	}
	return "unknown"
}

// CPUName reads the CPU model from /proc/cpuinfo where there is one.
func CPUName() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if k, v, ok := strings.Cut(s.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

// PrintTable writes results in llama-bench's markdown table form.
func PrintTable(w io.Writer, rs []*Result) {
	fmt.Fprintln(w, "| model | size | params | quant | threads | test | t/s | weights GB/s |")
	fmt.Fprintln(w, "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |")
	for _, r := range rs {
		gb := ""
		if r.GBps > 0 {
			gb = fmt.Sprintf("%.1f", r.GBps)
		}
		fmt.Fprintf(w, "| %s | %.2f GiB | %.2f B | %s | %d | %s | %.2f ± %.2f | %s |\n",
			r.Model, float64(r.SizeBytes)/(1<<30), float64(r.Params)/1e9, r.Quant, r.Threads, r.Test, r.Mean, r.Stddev, gb)
	}
	if len(rs) > 0 {
		fmt.Fprintf(w, "\ncommit %s, %s, %s\n", rs[0].Commit, rs[0].CPU, rs[0].GoVersion)
	}
}
