package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"pagoda/model"
	"pagoda/speed"
)

func init() {
	register("bench", "llama-bench style throughput: prompt processing (pp) and generation (tg); 'bench serve' load-tests a server", runBench)
}

func intList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		v, err := strconv.Atoi(f)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("bad count %q", f)
		}
		out = append(out, v)
	}
	return out, nil
}

func runBench(args []string) error {
	if len(args) > 0 && args[0] == "serve" {
		return runBenchServe(args[1:])
	}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	modelPath := fs.String("m", "", "model file")
	pp := fs.String("p", "512", "prompt lengths to test, comma separated (0 = skip)")
	tg := fs.String("n", "128", "generation lengths to test, comma separated (0 = skip)")
	reps := fs.Int("r", 5, "repetitions")
	threads := fs.Int("t", 0, "threads (0 = number of CPUs)")
	batch := fs.Int("b", 512, "tokens per forward pass during pp")
	seqs := fs.String("s", "1", "sequences decoded together in tg, comma separated (batched decode, as a loaded server runs it)")
	bwMiB := fs.Int("bw", 512, "MiB streamed by the read-bandwidth probe reported next to tg (0 = skip)")
	peakMs := fs.Int("peak", 200, "milliseconds a repetition of the int8 compute probe runs, reported next to each test as the share of the limit its weight products reach (0 = skip)")
	paired := fs.Bool("paired", true, "also run the probes (-bw for tg, -peak) once right after every repetition and give each test's shares as the median of the repetitions' ratios to them: steadier where other processes share the cores")
	jsonOut := fs.Bool("json", false, "JSON output")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the measured runs to this file")
	depth := fs.Int("d", 0, "tokens already in the KV cache before each test (filled untimed, like llama-bench -d)")
	kvf := addKVFlags(fs)
	tpf := addTPFlags(fs)
	if err := parseFlags(fs, args, []limit{{"r", 1, 1 << 20}, {"t", 0, maxThreads}, {"b", 1, 1 << 20}, {"bw", 0, 1 << 16}, {"peak", 0, 60000}, {"d", 0, 1 << 24}}); err != nil {
		return err
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if *modelPath == "" {
		return fmt.Errorf("-m MODEL is required (pagoda synth makes benchmark models)")
	}
	pps, err := intList(*pp)
	if err != nil {
		return err
	}
	tgs, err := intList(*tg)
	if err != nil {
		return err
	}
	var tests []speed.Test
	for _, n := range pps {
		if n > 0 {
			tests = append(tests, speed.Test{Kind: "pp", N: n, Depth: *depth})
		}
	}
	nseqs, err := intList(*seqs)
	if err != nil {
		return err
	}
	for _, n := range tgs {
		for _, s := range nseqs {
			if n > 0 && s > 0 {
				tests = append(tests, speed.Test{Kind: "tg", N: n, Seqs: s, Depth: *depth})
			}
		}
	}
	maxN := 0
	for _, t := range tests {
		maxN = max(maxN, t.N)
	}
	grp, err := tpf.start(*modelPath, *threads, os.Stderr)
	if err != nil {
		return err
	}
	if grp != nil {
		defer grp.close()
		if *kvf.all != "" || *kvf.k != "" || *kvf.v != "" {
			return fmt.Errorf("bench --tensor-parallel/--pipeline-parallel/--workers: the workers' KV storage is f32 (--kv-dtype is not carried to them)")
		}
		rs, err := benchGroup(grp, *modelPath, tests, *reps, *batch, maxN+*depth)
		if err != nil {
			return err
		}
		return printBench(rs, nil, nil, *jsonOut)
	}
	m, err := openModel(*modelPath, model.Options{Threads: *threads, ContextLen: max(maxN+*depth, 0), MaxMemory: tpf.capBytes})
	if err != nil {
		return tpf.capError(err, nil)
	}
	defer m.Close()
	newCache, err := kvf.newCache(m)
	if err != nil {
		return err
	}
	var rs []*speed.Result
	for _, t := range tests {
		var probe speed.Probe
		if *paired {
			probe = pairedProbe(m, t, *bwMiB, *peakMs)
		}
		r, err := speed.RunPaired(m, t, *reps, *batch, newCache, probe)
		if err != nil {
			return err
		}
		r.Model = filepath.Base(*modelPath)
		rs = append(rs, r)
		if !*jsonOut {
			fmt.Fprintf(os.Stderr, "%s: %.2f ± %.2f t/s\n", t, r.Mean, r.Stddev)
		}
	}
	var bw *speed.Bandwidth
	if *bwMiB > 0 && len(tgs) > 0 {
		if bw, err = speed.ReadBandwidth(m.Pool(), m.Ops(), int64(*bwMiB)<<20, *reps); err != nil {
			return err
		}
		if !*jsonOut {
			fmt.Fprintf(os.Stderr, "read bandwidth: %.1f GB/s\n", bw.GBps)
		}
		for _, r := range rs {
			if r.GBps > 0 {
				r.ReadGBps = bw.GBps
			}
		}
	}
	pk, err := probePeak(m, rs, *peakMs, *reps, *jsonOut)
	if err != nil {
		return err
	}
	return printBench(rs, bw, pk, *jsonOut)
}

// pairedProbe is the probe run after each repetition of t: one pass of
// the read-bandwidth probe for a decode test, one repetition of the int8
// probe for any; nil when both are off.
func pairedProbe(m *model.Model, t speed.Test, bwMiB, peakMs int) speed.Probe {
	if bwMiB == 0 && peakMs == 0 {
		return nil
	}
	var rp *speed.ReadProbe // allocated at the first decode repetition, then reused
	return func() (gbps, macps float64, err error) {
		if bwMiB > 0 && t.Kind == "tg" {
			if rp == nil {
				if rp, err = speed.NewReadProbe(int64(bwMiB) << 20); err != nil {
					return 0, 0, err
				}
			}
			bw, err := rp.Run(m.Pool(), m.Ops(), 1)
			if err != nil {
				return 0, 0, err
			}
			gbps = bw.GBps
		}
		if peakMs > 0 {
			// Where the instruction set has no probe the shares fall
			// back to the run's probe, which says so.
			if pk, err := speed.MeasureInt8Peak(m.Pool(), m.Ops(), time.Duration(peakMs)*time.Millisecond, 1); err == nil {
				macps = pk.MACps
			}
		}
		return gbps, macps, nil
	}
}

// probePeak measures the int8 compute limit (ms per repetition; 0 skips)
// and gives each result its share; nil where the instruction set has no
// probe (said on stderr).
func probePeak(m *model.Model, rs []*speed.Result, ms, reps int, quiet bool) (*speed.Int8Peak, error) {
	if ms == 0 {
		return nil, nil
	}
	pk, err := speed.MeasureInt8Peak(m.Pool(), m.Ops(), time.Duration(ms)*time.Millisecond, reps)
	if err != nil {
		if !quiet {
			fmt.Fprintf(os.Stderr, "int8 peak: not measured: %v\n", err)
		}
		return nil, nil
	}
	if !quiet {
		fmt.Fprintf(os.Stderr, "int8 peak: %.1f G multiply-adds/s\n", pk.MACps/1e9)
	}
	for _, r := range rs {
		r.Int8Peak = pk.MACps
	}
	return pk, nil
}

func printBench(rs []*speed.Result, bw *speed.Bandwidth, pk *speed.Int8Peak, jsonOut bool) error {
	if jsonOut {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rs)
	}
	speed.PrintTable(os.Stdout, rs, bw, pk)
	return nil
}
