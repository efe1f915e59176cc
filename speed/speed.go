// Package speed measures prompt processing (pp) and token generation (tg)
// throughput of a model the way llama-bench does, with the provenance a
// comparison needs (commit, CPU, threads, model, quant, spread).
package speed

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"pagoda/executor"
	"pagoda/kernels"
	"pagoda/model"
)

// Test is one measurement: "pp" of N prompt tokens in batches, or "tg" of N
// tokens decoded one at a time, by Seqs sequences in lockstep (the serving
// engine's batched decode; 0 or 1 is llama-bench's single sequence), after
// Depth tokens already in the cache.
type Test struct {
	Kind  string // "pp" or "tg"
	N     int
	Seqs  int
	Depth int // tokens prefilled, untimed, before the measured ones
}

func (t Test) String() string {
	name := fmt.Sprintf("%s%d", t.Kind, t.N)
	if t.Kind == "tg" && t.Seqs > 1 {
		name += fmt.Sprintf("x%d", t.Seqs)
	}
	if t.Depth > 0 {
		name += fmt.Sprintf(" @ d%d", t.Depth)
	}
	return name
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
	Seqs      int       `json:"n_seqs,omitempty"` // tg: sequences decoded per step
	// PerSeq is tokens per second of each sequence in a batched tg (Mean /
	// Seqs): what one user of a loaded server sees.
	PerSeq float64 `json:"per_seq_ts,omitempty"`
	// GBps is the weight bytes streamed per second (tg only): the share of
	// memory bandwidth decode reaches.
	GBps float64 `json:"weights_gb_per_s,omitempty"`
	// ReadGBps is the machine's read bandwidth measured in the same run
	// (tg only, when probed): GBps/ReadGBps is the share decode reaches.
	ReadGBps float64 `json:"read_bw_gb_per_s,omitempty"`
	// BytesPerToken is the weight bytes one decode step reads (tg only):
	// every matrix but the embedding table, except that of a
	// mixture-of-experts model's routed experts only those the router
	// selected count, as measured by the model's counter.
	BytesPerToken float64 `json:"weight_bytes_per_token,omitempty"`
	// MACsPerToken is the weight multiply-adds one token costs (every
	// element of every matrix it goes through; 0 for a mixture of experts,
	// whose routed share varies), and Int8Peak the machine's int8
	// multiply-add rate measured in the same run (when probed): their
	// product with t/s over Int8Peak is the share of the compute limit
	// prefill or batched decode reaches.
	MACsPerToken float64 `json:"macs_per_token,omitempty"`
	Int8Peak     float64 `json:"int8_peak_macs_per_s,omitempty"`
	// PairedReadGBps and PairedInt8Peak are the probes run right after
	// each repetition (RunPaired), one per sample: on a machine whose
	// load changes from second to second, the shares are then medians of
	// each repetition's ratio to its own probe, not ratios of figures
	// measured minutes apart.
	PairedReadGBps []float64 `json:"paired_read_bw_gb_per_s,omitempty"`
	PairedInt8Peak []float64 `json:"paired_int8_peak_macs_per_s,omitempty"`
}

// BWShare is the share of the read bandwidth r's decode streams its
// weights at (0 when unknown): the median of the paired ratios where
// probes were paired, else against the run's probe.
func (r *Result) BWShare() float64 {
	if r.GBps <= 0 {
		return 0
	}
	if len(r.PairedReadGBps) == len(r.Samples) && len(r.Samples) > 0 {
		per := r.BytesPerToken / float64(max(r.Seqs, 1)) / 1e9
		return pairedMedian(r.Samples, r.PairedReadGBps, per)
	}
	if r.ReadGBps <= 0 {
		return 0
	}
	return r.GBps / r.ReadGBps
}

// pairedMedian is the median over i of f·samples[i]/probe[i].
func pairedMedian(samples, probe []float64, f float64) float64 {
	q := make([]float64, 0, len(samples))
	for i, s := range samples {
		if probe[i] > 0 {
			q = append(q, f*s/probe[i])
		}
	}
	if len(q) == 0 {
		return 0
	}
	return median(q)
}

// PeakShare is the share of the int8 compute limit r reaches (0 when
// either is unknown).
func (r *Result) PeakShare() float64 {
	if r.MACsPerToken > 0 && len(r.PairedInt8Peak) == len(r.Samples) && len(r.Samples) > 0 {
		return pairedMedian(r.Samples, r.PairedInt8Peak, r.MACsPerToken)
	}
	if r.Int8Peak <= 0 || r.MACsPerToken <= 0 {
		return 0
	}
	return r.Mean * r.MACsPerToken / r.Int8Peak
}

// Run measures t on m, reps times after one warm-up run.
func Run(m *model.Model, t Test, reps, batch int) (*Result, error) {
	return RunCache(m, t, reps, batch, nil)
}

// RunCache is Run on the KV caches newCache makes for n positions (nil:
// the model's flat f32 cache).
func RunCache(m *model.Model, t Test, reps, batch int, newCache func(n int) (model.KVCache, error)) (*Result, error) {
	return RunPaired(m, t, reps, batch, newCache, nil)
}

// Probe measures the machine's limits between repetitions: the read
// bandwidth in GB/s (0: not measured) and the int8 multiply-add rate (0:
// not measured).
type Probe func() (gbps, macps float64, err error)

// RunPaired is RunCache with probe (nil: none) run right after each
// timed repetition, its figures kept beside the samples.
func RunPaired(m *model.Model, t Test, reps, batch int, newCache func(n int) (model.KVCache, error), probe Probe) (*Result, error) {
	c := &m.Config
	if t.Depth < 0 || t.N+t.Depth > c.ContextLen {
		return nil, fmt.Errorf("speed: %s exceeds the context of %d", t, c.ContextLen)
	}
	custom := newCache != nil
	if !custom {
		newCache = func(n int) (model.KVCache, error) { return m.NewFlatCache(max(t.Seqs, 1), n), nil }
	}
	if t.Kind == "tg" && t.Seqs > 1 && custom {
		return nil, fmt.Errorf("speed: %s: batched decode runs on the flat cache only", t)
	}
	newExec := func(n, _ int) (executor.Executor, error) {
		cache, err := newCache(n)
		if err != nil {
			return nil, err
		}
		return executor.NewLocal(m, cache), nil
	}
	var bws, pks []float64
	between := func() error {
		if probe == nil {
			return nil
		}
		bw, pk, err := probe()
		bws, pks = append(bws, bw), append(pks, pk)
		return err
	}
	samples, expertBytes, err := measure(t, reps, batch, c.VocabSize, newExec, m.ExpertBytesRead, between)
	if err != nil {
		return nil, err
	}
	r := &Result{Threads: m.Pool().Threads(), Params: c.Params(), MACsPerToken: float64(macsPerToken(m))}
	if slices.ContainsFunc(bws, func(x float64) bool { return x > 0 }) {
		r.PairedReadGBps = bws
	}
	if slices.ContainsFunc(pks, func(x float64) bool { return x > 0 }) {
		r.PairedInt8Peak = pks
	}
	r.SizeBytes, r.Quant = weightBytes(m)
	r.fill(t, batch, samples)
	if t.Kind == "tg" {
		// Weights are read once per step whatever the batch (of a
		// mixture-of-experts model, the experts some row selected).
		r.BytesPerToken = float64(r.SizeBytes-routedExpertBytes(m)) + float64(expertBytes)/float64(reps*t.N)
		r.GBps = r.Mean / float64(max(t.Seqs, 1)) * r.BytesPerToken / 1e9
	}
	return r, nil
}

// Info is what a result reports of a model measured through RunExecutor,
// whose executor runs it elsewhere (a tensor-parallel group of worker
// processes).
type Info struct {
	Vocab, Context int
	Params         int64
	SizeBytes      int64
	Quant          string
	// Threads is the threads of all the workers together.
	Threads int
}

// InfoOf is m's Info, threads its pool's.
func InfoOf(m *model.Model) Info {
	i := Info{Vocab: m.Config.VocabSize, Context: m.Config.ContextLen, Params: m.Config.Params(), Threads: m.Pool().Threads()}
	i.SizeBytes, i.Quant = weightBytes(m)
	return i
}

// RunExecutor measures t on the executors newExec makes, each on fresh
// KV storage for n positions of seqs sequences, reps times after one
// warm-up run. The executor plans its own KV (as a flat cache does).
func RunExecutor(info Info, t Test, reps, batch int, newExec func(n, seqs int) (executor.Executor, error)) (*Result, error) {
	if t.Depth < 0 || t.N+t.Depth > info.Context {
		return nil, fmt.Errorf("speed: %s exceeds the context of %d", t, info.Context)
	}
	samples, _, err := measure(t, reps, batch, info.Vocab, newExec, func() uint64 { return 0 }, func() error { return nil })
	if err != nil {
		return nil, err
	}
	r := &Result{Threads: info.Threads, Params: info.Params, SizeBytes: info.SizeBytes, Quant: info.Quant}
	r.fill(t, batch, samples)
	if t.Kind == "tg" {
		r.BytesPerToken = float64(info.SizeBytes)
		r.GBps = r.Mean / float64(max(t.Seqs, 1)) * r.BytesPerToken / 1e9
	}
	return r, nil
}

// fill sets what every result has from the test and its samples.
func (r *Result) fill(t Test, batch int, samples []float64) {
	seqs := max(t.Seqs, 1)
	if t.Kind != "tg" {
		seqs = 1
	}
	r.Test, r.Tokens, r.Batch = t.String(), t.N*seqs, cmp.Or(batch, 512)
	r.Commit, r.CPU, r.GoVersion = Commit(), CPUName(), runtime.Version()
	r.Samples = samples
	r.Mean, r.Stddev, r.Min, r.Max = stats(samples)
	if t.Kind == "tg" && seqs > 1 {
		r.Seqs, r.PerSeq = seqs, r.Mean/float64(seqs)
	}
}

// measure times t reps times after a warm-up, each run on a fresh
// executor, calling between after each timed run; expert counts what
// probe (the model's routed-expert counter) moved during the timed runs.
func measure(t Test, reps, batch, vocab int, newExec func(n, seqs int) (executor.Executor, error), probe func() uint64, between func() error) ([]float64, uint64, error) {
	if t.N <= 0 || reps <= 0 {
		return nil, 0, fmt.Errorf("speed: %s: N and repetitions must be positive", t)
	}
	if batch <= 0 {
		batch = 512
	}
	rng := rand.New(rand.NewPCG(1, 2))
	toks := make([]int32, t.Depth+t.N)
	for i := range toks {
		toks[i] = int32(rng.IntN(vocab))
	}
	seqs := max(t.Seqs, 1)
	if t.Kind != "tg" {
		seqs = 1
	}
	if seqs > 1024 {
		return nil, 0, fmt.Errorf("speed: %s: at most 1024 sequences", t)
	}
	// prompt fills [from, to) of every sequence.
	prompt := func(ex executor.Executor, from, to int) error {
		for s := range seqs {
			for lo := from; lo < to; lo += batch {
				hi := min(lo+batch, to)
				b := &executor.StepInput{Tokens: toks[lo:hi], Pos: make([]int32, hi-lo), Seq: make([]int32, hi-lo)}
				for i := range b.Pos {
					b.Pos[i], b.Seq[i] = int32(lo+i), int32(s)
				}
				if _, err := ex.Execute(b); err != nil {
					return err
				}
			}
		}
		return nil
	}
	var expertBytes uint64 // routed experts read by the timed passes
	once := func() (time.Duration, error) {
		ex, err := newExec(t.Depth+t.N, seqs)
		if err != nil {
			return 0, err
		}
		// The depth is filled first and not timed (llama-bench -d).
		if err := prompt(ex, 0, t.Depth); err != nil {
			return 0, err
		}
		e0 := probe()
		defer func() { expertBytes += probe() - e0 }()
		start := time.Now()
		switch t.Kind {
		case "pp": // seqs is 1
			if err := prompt(ex, t.Depth, t.Depth+t.N); err != nil {
				return 0, err
			}
		case "tg":
			// Every sequence decodes its own token at each step and
			// wants its logits, as in a server's decode step.
			b := &executor.StepInput{Tokens: make([]int32, seqs), Pos: make([]int32, seqs), Seq: make([]int32, seqs), Logits: make([]bool, seqs)}
			for s := range seqs {
				b.Seq[s] = int32(s)
				b.Logits[s] = true
			}
			for i := t.Depth; i < t.Depth+t.N; i++ {
				for s := range seqs {
					b.Tokens[s] = toks[t.Depth+(i-t.Depth+s*7)%t.N]
					b.Pos[s] = int32(i)
				}
				if _, err := ex.Execute(b); err != nil {
					return 0, err
				}
			}
		default:
			return 0, fmt.Errorf("speed: unknown test kind %q", t.Kind)
		}
		return time.Since(start), nil
	}
	if _, err := once(); err != nil {
		return nil, 0, err
	}
	expertBytes = 0
	var samples []float64
	for i := 0; i < reps; i++ {
		d, err := once()
		if err != nil {
			return nil, 0, err
		}
		samples = append(samples, float64(t.N*seqs)/d.Seconds())
		if err := between(); err != nil {
			return nil, 0, err
		}
	}
	return samples, expertBytes, nil
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

// routedExpertBytes is the size of all routed experts' matrices.
func routedExpertBytes(m *model.Model) int64 {
	var n int64
	for _, l := range m.W.Layers {
		for _, st := range [][]*kernels.Matrix{l.GateExps, l.UpExps, l.DownExps} {
			for _, w := range st {
				n += int64(len(w.Data))
			}
		}
	}
	return n
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

// macsPerToken is the multiply-adds of the weight products one token goes
// through: every element of every matrix but the embedding table (unless
// it doubles as the output matrix); 0 for a mixture of experts.
func macsPerToken(m *model.Model) int64 {
	if routedExpertBytes(m) > 0 {
		return 0
	}
	var n int64
	for _, w := range m.W.Matrices() {
		if w == m.W.Embd && m.W.Output != m.W.Embd {
			continue
		}
		n += int64(w.Rows) * int64(w.Cols)
	}
	return n
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

// PrintTable writes results in llama-bench's markdown table form; with a
// bandwidth measurement (nil for none) each tg row also says what share of
// it decode streams.
func PrintTable(w io.Writer, rs []*Result, bw *Bandwidth, pk *Int8Peak) {
	fmt.Fprintln(w, "| model | size | params | quant | threads | test | t/s | t/s per seq | weights GB/s | of read bw | of int8 peak |")
	fmt.Fprintln(w, "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, r := range rs {
		gb, frac, per, peak := "", "", "", ""
		if r.GBps > 0 {
			gb = fmt.Sprintf("%.1f", r.GBps)
			if s := r.BWShare(); s > 0 {
				frac = fmt.Sprintf("%.0f%%", 100*s)
			}
		}
		if r.PerSeq > 0 {
			per = fmt.Sprintf("%.2f", r.PerSeq)
		}
		if s := r.PeakShare(); s > 0 {
			peak = fmt.Sprintf("%.0f%%", 100*s)
		}
		fmt.Fprintf(w, "| %s | %.2f GiB | %.2f B | %s | %d | %s | %.2f ± %.2f | %s | %s | %s | %s |\n",
			r.Model, float64(r.SizeBytes)/(1<<30), float64(r.Params)/1e9, r.Quant, r.Threads, r.Test, r.Mean, r.Stddev, per, gb, frac, peak)
	}
	if bw != nil {
		fmt.Fprintf(w, "\nread bandwidth %.1f GB/s best, %.1f median (%d threads, %d MiB buffer)\n", bw.GBps, bw.Median, bw.Threads, bw.Bytes>>20)
	}
	if pk != nil {
		fmt.Fprintf(w, "int8 peak %.1f G multiply-adds/s best, %.1f median (%d threads, VPDPBUSD alone)\n", pk.MACps/1e9, pk.Median/1e9, pk.Threads)
	}
	if slices.ContainsFunc(rs, func(r *Result) bool { return len(r.PairedReadGBps)+len(r.PairedInt8Peak) > 0 }) {
		fmt.Fprintln(w, "shares: the median over repetitions of each one's ratio to the probe run right after it")
	}
	if len(rs) > 0 {
		fmt.Fprintf(w, "\ncommit %s, %s, %s\n", rs[0].Commit, rs[0].CPU, rs[0].GoVersion)
	}
}
