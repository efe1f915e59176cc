package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"

	"pagoda/cluster"
	"pagoda/engine"
	"pagoda/executor"
	"pagoda/kvcache"
	"pagoda/model"
	"pagoda/tokenizer"
)

func init() {
	register("worker", "serve one rank of a tensor-parallel group for a coordinator (serve --workers)", runWorker)
}

func runWorker(args []string) error {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:7100", "address to listen on for the coordinator and the other ranks (port 0 = any free port)")
	modelPath := fs.String("m", "", "model file (every rank opens the same one and loads only its shard; default: the built-in stories260K)")
	tokPath := fs.String("tokenizer", "", "tokenizer file overriding the model's")
	threads := fs.Int("threads", 0, "threads (0 = number of CPUs; the coordinator may set it per group)")
	quiet := fs.Bool("quiet", false, "log only errors")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("worker: unexpected argument %q", fs.Arg(0))
	}
	if *threads < 0 || *threads > maxThreads {
		return fmt.Errorf("worker: --threads %d out of range [0, %d]", *threads, maxThreads)
	}
	path, err := resolveModel(*modelPath)
	if err != nil {
		return err
	}
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	level := slog.LevelInfo
	if *quiet {
		level = slog.LevelError
	}
	w := &cluster.Worker{Model: path, Options: model.Options{Tokenizer: *tokPath, Threads: *threads},
		Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))}
	fmt.Printf("%s%s\n", cluster.ListenLine, ln.Addr())
	os.Stdout.Sync()
	return w.Serve(ln)
}

// tpFlags are serve's tensor-parallel flags.
type tpFlags struct {
	ranks   *int
	workers *string
}

func addTPFlags(fs *flag.FlagSet) *tpFlags {
	return &tpFlags{
		ranks:   fs.Int("tensor-parallel", 1, "tensor-parallel ranks: each worker process holds 1/N of every layer and of the KV cache (N > 1 without --workers starts N local `pagoda worker` processes)"),
		workers: fs.String("workers", "", "comma-separated host:port of running `pagoda worker` processes, rank 0 first (implies --tensor-parallel = their count)"),
	}
}

// tp is the tensor-parallel setup of one serve: the workers it started
// (if any) and the group, closed by close.
type tp struct {
	addrs   []string
	spawned *cluster.Spawned
	group   *cluster.Group
	threads int
}

// start resolves the flags: nil when serving in this process.
func (f *tpFlags) start(path string, threads int, log io.Writer) (*tp, error) {
	var addrs []string
	for _, a := range strings.Split(*f.workers, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	n := *f.ranks
	switch {
	case len(addrs) == 1:
		return nil, fmt.Errorf("--workers: one worker is no group; give at least two, or none to serve in this process")
	case len(addrs) > 0 && n != 1 && n != len(addrs):
		return nil, fmt.Errorf("--tensor-parallel %d but %d --workers", n, len(addrs))
	case len(addrs) > 0:
		return &tp{addrs: addrs, threads: threads}, nil
	case n < 1 || n > 64:
		return nil, fmt.Errorf("--tensor-parallel %d out of range [1, 64]", n)
	case n == 1:
		return nil, nil
	}
	bin, err := os.Executable()
	if err != nil {
		return nil, err
	}
	// The local workers share this machine's cores.
	per := max(1, (cmpOr(threads, runtime.NumCPU()))/n)
	s, err := cluster.Spawn(bin, path, n, per, log)
	if err != nil {
		return nil, fmt.Errorf("--tensor-parallel %d: %w", n, err)
	}
	return &tp{addrs: s.Addrs, spawned: s, threads: per}, nil
}

func cmpOr(a, b int) int {
	if a != 0 {
		return a
	}
	return b
}

// openModel opens the model in this process, or, for a group, the
// coordinator's view of it: rank 0's shard, for its shapes, tokenizer and
// metadata.
func (t *tp) openModel(path string, o model.Options) (*model.Model, error) {
	if t == nil {
		return openModel(path, o)
	}
	return cluster.OpenShape(path, len(t.addrs), o)
}

// rope is the rotary embedding the engine's policies may move positions
// with: none across workers (their storage would have to re-rotate), so
// StreamingLLM's sinks are refused there with the engine's own error.
func (t *tp) rope(m *model.Model) *kvcache.Rotary {
	if t != nil {
		return nil
	}
	return engine.ModelConfig(m, "").KVRope
}

// embedder runs embeddings in this process; a group's coordinator holds
// no whole layer to run them with.
func (t *tp) embedder(m *model.Model) *engine.Embedder {
	if t != nil {
		return nil
	}
	return newEmbedder(m)
}

// executor is the engine's hook: connect the group once the KV manager's
// configuration is known (nil: run the steps in this process).
func (t *tp) executor(m *model.Model, ctx int) func(kvcache.Config) (executor.Executor, error) {
	if t == nil {
		return nil
	}
	return func(kc kvcache.Config) (executor.Executor, error) {
		g, err := cluster.Connect(t.addrs, cluster.GroupOptions{Model: &m.Config, KV: kc, Threads: t.threads, Context: ctx})
		if err != nil {
			return nil, err
		}
		t.group = g
		return g, nil
	}
}

func (t *tp) close() {
	if t == nil {
		return
	}
	if t.group != nil {
		t.group.Close()
	}
	t.spawned.Stop()
}

// engine is a one-sequence engine whose steps run on the group, for run.
func (t *tp) engine(m *model.Model, tok tokenizer.Tokenizer, ctx int) (*engine.Engine, error) {
	cfg := engine.ModelConfig(m, "run")
	cfg.MaxNumSeqs = 1
	cfg.KVRope = nil
	cfg.Executor = t.executor(m, ctx)
	eng, err := engine.New(nil, tok, cfg)
	if err != nil {
		return nil, err
	}
	eng.Start()
	return eng, nil
}
