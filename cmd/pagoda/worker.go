package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"pagoda/cluster"
	"pagoda/engine"
	"pagoda/executor"
	"pagoda/kvcache"
	"pagoda/model"
	"pagoda/tokenizer"
)

func init() {
	register("worker", "serve one rank of a tensor-parallel group, one pipeline stage, or one rank of a stage (tensor × pipeline), for a coordinator (serve --workers)", runWorker)
}

func runWorker(args []string) error {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:7100", "address to listen on for the coordinator and the other ranks (port 0 = any free port)")
	modelPath := fs.String("m", "", "model file (every rank opens the same one and loads only its shard; default: the built-in stories260K)")
	tokPath := fs.String("tokenizer", "", "tokenizer file overriding the model's")
	threads := fs.Int("threads", 0, "threads (0 = number of CPUs; the coordinator may set it per group)")
	quiet := fs.Bool("quiet", false, "log only errors")
	wire := fs.String("wire-dtype", "", "take only coordinators that send activations in this form: f32, f16 or bf16 (default: whatever the coordinator's --wire-dtype says)")
	maxMem := fs.String("max-memory", "", maxMemoryHelp)
	if err := fs.Parse(args); err != nil {
		return err
	}
	capBytes, err := parseMaxMemory(*maxMem)
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	if *wire != "" {
		if _, err := cluster.ParseWireDType(*wire); err != nil {
			return fmt.Errorf("worker: --wire-dtype: %w", err)
		}
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
	w := &cluster.Worker{Model: path, Options: model.Options{Tokenizer: *tokPath, Threads: *threads, MaxMemory: capBytes}, Wire: *wire,
		Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))}
	fmt.Printf("%s%s\n", cluster.ListenLine, ln.Addr())
	os.Stdout.Sync()
	return w.Serve(ln)
}

// tpFlags are serve's tensor- and pipeline-parallel flags.
type tpFlags struct {
	ranks   *int
	seq     *int
	stages  *int
	micro   *int
	minRows *int
	flight  *int
	workers *string
	wire    *string
	maxMem  *string
	// capBytes is --max-memory parsed by start (0: no cap).
	capBytes int64
	stall    *time.Duration
	retry    *time.Duration
}

const maxMemoryHelp = "most memory this process may bind for the model, e.g. 512MiB or 2GiB: the weights of its shard (all of them in one process) plus its KV storage; a model over it is refused before loading (default: no cap)"

// parseMaxMemory reads --max-memory ("" is no cap).
func parseMaxMemory(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	n, err := parseBytes(s)
	if err != nil || n < 1<<20 {
		return 0, fmt.Errorf("--max-memory %q: want a size of at least 1MiB, e.g. 512MiB or 2GiB", s)
	}
	return n, nil
}

// capError adds the fix to a model refused by --max-memory: in one
// process, split it across workers; a coordinator (grp), which binds a
// rank's shard or the first stage, takes more of them.
func (f *tpFlags) capError(err error, grp *tp) error {
	var me *model.MemoryError
	if !errors.As(err, &me) {
		return err
	}
	if grp != nil {
		return fmt.Errorf("--max-memory %s: the coordinator's own share of the model: %w; split it across more workers or raise --max-memory", *f.maxMem, err)
	}
	n := max(2, int((me.Need()+me.Cap-1)/me.Cap))
	return fmt.Errorf("--max-memory %s: %w; split the model across worker processes, each binding about 1/%d of it: use --tensor-parallel %d or --pipeline-parallel %d (each worker gets the same --max-memory), or raise --max-memory", *f.maxMem, err, n, n, n)
}

func addTPFlags(fs *flag.FlagSet) *tpFlags {
	return &tpFlags{
		seq:     fs.Int("sequence-parallel", 1, "sequence-parallel ranks (Ring Attention): each worker process holds the whole model and 1/N of the sequence's keys and values, attention passes them around a ring; one sequence at a time, for long prompts (N > 1 without --workers starts N local `pagoda worker` processes)"),
		ranks:   fs.Int("tensor-parallel", 1, "tensor-parallel ranks: each worker process holds 1/N of every layer and of the KV cache (N > 1 without --workers starts N local `pagoda worker` processes)"),
		stages:  fs.Int("pipeline-parallel", 1, "pipeline stages: each worker process holds a contiguous range of the layers and their KV cache (M > 1 without --workers starts M local `pagoda worker` processes)"),
		micro:   fs.Int("pipeline-micro-batches", 0, "micro-batches each step is cut into so the pipeline's stages overlap (0 = the number of stages; 1 = whole steps)"),
		flight:  fs.Int("pipeline-inflight", 0, "engine steps in flight through the pipeline at once, over disjoint sets of sequences (vLLM's virtual engines), so the stages overlap across steps: 0 = the number of stages, 1 = one step at a time (speculative decoding, static batching and KV policies whose state lives on the workers run one at a time)"),
		minRows: fs.Int("pipeline-min-rows", 4, "rows a micro-batch keeps at least: smaller steps are cut into fewer micro-batches (on a CPU a product of 1 row costs about what 4 rows do)"),
		maxMem:  fs.String("max-memory", "", maxMemoryHelp+"; with workers started here, each worker's cap"),
		wire:    fs.String("wire-dtype", "f32", "form of activations between workers: f32, or f16/bf16 for half the bytes (the collectives' payloads and the pipeline's hidden states, rounded once on leaving a worker; sums stay f32)"),
		stall:   fs.Duration("worker-timeout", 2*time.Minute, "how long a worker waits on another (a mesh exchange, a stage hand-off) before the step fails, and, plus a tenth (at least 1s), the coordinator on a worker's answer: a stopped or hung worker becomes an error after about this long (it must exceed the slowest step's compute)"),
		retry:   fs.Duration("worker-reconnect", 5*time.Second, "longest wait between attempts to reconnect a broken worker group (a worker died, stalled past --worker-timeout or was cut off; a local worker that exited is started again): the first comes after 200ms, each failure doubles the wait up to this; meanwhile /health and new requests answer 503"),
		workers: fs.String("workers", "", "comma-separated host:port of running `pagoda worker` processes, rank (stage) 0 first; with both --tensor-parallel N and --pipeline-parallel M, N×M of them stage-major: stage 0's ranks 0…N-1, then stage 1's, … (implies --tensor-parallel = their count unless --pipeline-parallel is given)"),
	}
}

// tp is the tensor- or pipeline-parallel setup of one serve: the workers
// it started (if any) and the group or pipeline, closed by close.
type tp struct {
	addrs    []string
	spawned  *cluster.Spawned
	threads  int
	pipeline bool
	// seq: the workers are a sequence-parallel group (Ring Attention).
	seq bool
	// tensor is the ranks of every pipeline stage (tensor × pipeline;
	// 0 or 1: one worker per stage).
	tensor  int
	micro   int
	minRows int
	flight  int // engine steps in flight (engine.Config.InFlight)
	wire    cluster.WireDType
	stall   time.Duration
	pipe    atomic.Pointer[cluster.Pipeline] // the latest, for its stats
	ring    atomic.Pointer[cluster.SeqGroup] // the latest, for its stats
	log     io.Writer
	// sup runs the group or pipeline and reconnects it when it breaks;
	// retry is its longest wait between attempts.
	sup   *cluster.Supervisor
	retry time.Duration
}

// start resolves the flags: nil when serving in this process.
func (f *tpFlags) start(path string, threads int, log io.Writer) (*tp, error) {
	wire, err := cluster.ParseWireDType(*f.wire)
	if err != nil {
		return nil, fmt.Errorf("--wire-dtype: %w", err)
	}
	if f.capBytes, err = parseMaxMemory(*f.maxMem); err != nil {
		return nil, err
	}
	if *f.stall < 100*time.Millisecond || *f.stall > 24*time.Hour {
		return nil, fmt.Errorf("--worker-timeout %v out of range [100ms, 24h]", *f.stall)
	}
	if *f.retry < 200*time.Millisecond || *f.retry > time.Hour {
		return nil, fmt.Errorf("--worker-reconnect %v out of range [200ms, 1h]", *f.retry)
	}
	if *f.seq != 1 && wire != cluster.WireF32 {
		return nil, fmt.Errorf("--wire-dtype %s: a sequence-parallel ring passes f32 keys and values only", wire)
	}
	t, err := f.start1(path, threads, log)
	switch {
	case err != nil:
		return nil, err
	case t == nil && wire != cluster.WireF32:
		return nil, fmt.Errorf("--wire-dtype %s: activations travel only between workers (give --tensor-parallel, --pipeline-parallel or --workers)", wire)
	case t != nil:
		t.wire, t.stall, t.retry, t.log = wire, *f.stall, *f.retry, log
	}
	return t, nil
}

func (f *tpFlags) start1(path string, threads int, log io.Writer) (*tp, error) {
	addrs := splitList(*f.workers)
	n, m := *f.ranks, *f.stages
	if *f.seq != 1 {
		return f.startSeq(path, addrs, threads, log)
	}
	switch {
	case n > 1 && m > 1 && (n > 64 || n*m > 256):
		return nil, fmt.Errorf("--tensor-parallel %d × --pipeline-parallel %d: %d workers (at most 256)", n, m, n*m)
	case m < 1 || m > 64:
		return nil, fmt.Errorf("--pipeline-parallel %d out of range [1, 64]", m)
	case *f.micro < 0 || *f.micro > 1024:
		return nil, fmt.Errorf("--pipeline-micro-batches %d out of range [0, 1024]", *f.micro)
	case *f.flight < 0 || *f.flight > 64:
		return nil, fmt.Errorf("--pipeline-inflight %d out of range [0, 64]", *f.flight)
	case *f.minRows < 1 || *f.minRows > 1<<20:
		return nil, fmt.Errorf("--pipeline-min-rows %d out of range [1, %d]", *f.minRows, 1<<20)
	case n < 1:
		return nil, fmt.Errorf("--tensor-parallel %d out of range [1, 64]", n)
	case m > 1:
		return f.startPipeline(path, addrs, n, threads, log)
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
	s, per, err := spawn(path, n, threads, *f.maxMem, log)
	if err != nil {
		return nil, fmt.Errorf("--tensor-parallel %d: %w", n, err)
	}
	return &tp{addrs: s.Addrs, spawned: s, threads: per}, nil
}

// startSeq is start for --sequence-parallel N: the workers given, or N
// local ones.
func (f *tpFlags) startSeq(path string, addrs []string, threads int, log io.Writer) (*tp, error) {
	n := *f.seq
	switch {
	case n < 2 || n > 64:
		return nil, fmt.Errorf("--sequence-parallel %d out of range [2, 64] (1: one process)", n)
	case *f.ranks != 1 || *f.stages != 1:
		return nil, fmt.Errorf("--sequence-parallel %d does not combine with --tensor-parallel or --pipeline-parallel (each rank holds the whole model; a shard or a stage cannot also split the sequence)", n)
	case len(addrs) > 0 && len(addrs) != n:
		return nil, fmt.Errorf("--sequence-parallel %d but %d --workers", n, len(addrs))
	case len(addrs) > 0:
		return &tp{addrs: addrs, threads: threads, seq: true}, nil
	}
	s, per, err := spawn(path, n, threads, *f.maxMem, log)
	if err != nil {
		return nil, fmt.Errorf("--sequence-parallel %d: %w", n, err)
	}
	return &tp{addrs: s.Addrs, spawned: s, threads: per, seq: true}, nil
}

// startPipeline is start for --pipeline-parallel M, each stage of n
// tensor-parallel ranks: the workers given (stage-major), or n×M local
// ones.
func (f *tpFlags) startPipeline(path string, addrs []string, n, threads int, log io.Writer) (*tp, error) {
	m := *f.stages
	micro := cmp.Or(*f.micro, m)
	what := fmt.Sprintf("--pipeline-parallel %d", m)
	if n > 1 {
		what = fmt.Sprintf("--tensor-parallel %d × --pipeline-parallel %d", n, m)
	}
	t := &tp{threads: threads, pipeline: true, tensor: n, micro: micro, minRows: *f.minRows, flight: cmp.Or(*f.flight, m), log: log}
	if len(addrs) > 0 {
		if len(addrs) != n*m {
			if n > 1 {
				return nil, fmt.Errorf("%s needs %d --workers, stage-major (stage 0's ranks first), but %d are given", what, n*m, len(addrs))
			}
			return nil, fmt.Errorf("--pipeline-parallel %d but %d --workers", m, len(addrs))
		}
		t.addrs = addrs
		return t, nil
	}
	s, per, err := spawn(path, n*m, threads, *f.maxMem, log)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	t.addrs, t.spawned, t.threads = s.Addrs, s, per
	return t, nil
}

// spawn starts n local workers sharing this machine's cores, each with
// the --max-memory maxMem ("" for none).
func spawn(path string, n, threads int, maxMem string, log io.Writer) (*cluster.Spawned, int, error) {
	bin, err := os.Executable()
	if err != nil {
		return nil, 0, err
	}
	per := max(1, cmp.Or(threads, runtime.NumCPU())/n)
	var extra []string
	if maxMem != "" {
		extra = []string{"--max-memory", maxMem}
	}
	s, err := cluster.Spawn(bin, path, n, per, log, extra...)
	return s, per, err
}

// openModel opens the model in this process, or, for a group, the
// coordinator's view of it: rank 0's shard, for its shapes, tokenizer and
// metadata.
func (t *tp) openModel(path string, o model.Options) (*model.Model, error) {
	if t == nil {
		return openModel(path, o)
	}
	if t.seq {
		// Every rank holds the whole model, so the coordinator may too
		// (it never computes with it).
		m, err := openModel(path, o)
		if err == nil && m.Config.MLA {
			m.Close()
			return nil, errors.New("--sequence-parallel: MLA models attend through their latent cache, which Ring Attention does not split")
		}
		return m, err
	}
	if t.pipeline {
		return cluster.OpenGridShape(path, t.tensor, o)
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
// configuration is known (nil: run the steps in this process). The group
// runs under a supervisor, which reconnects it (with the same KV
// configuration) when it breaks.
func (t *tp) executor(m *model.Model, ctx int) func(kvcache.Config) (executor.Executor, error) {
	if t == nil {
		return nil
	}
	return func(kc kvcache.Config) (executor.Executor, error) {
		connect := func(addrs []string) (executor.Executor, error) {
			if t.seq {
				g, err := cluster.ConnectSeq(addrs, cluster.SeqOptions{Model: &m.Config, Threads: t.threads, Context: ctx, Exchange: t.stall})
				if err != nil {
					return nil, err
				}
				t.ring.Store(g)
				return g, nil
			}
			if t.pipeline {
				p, err := cluster.ConnectPipeline(addrs, cluster.PipelineOptions{Model: &m.Config, KV: kc, Threads: t.threads,
					Context: ctx, MicroBatches: t.micro, MinRows: t.minRows, Wire: t.wire, Tensor: t.tensor, Exchange: t.stall})
				if err != nil {
					return nil, err
				}
				t.pipe.Store(p)
				return p, nil
			}
			g, err := cluster.Connect(addrs, cluster.GroupOptions{Model: &m.Config, KV: kc, Threads: t.threads, Context: ctx, Wire: t.wire, Exchange: t.stall})
			if err != nil {
				return nil, err // not a nil *Group in a non-nil interface
			}
			return g, nil
		}
		what := "tensor parallel" // as the group's own errors name it
		switch {
		case t.pipeline:
			what = "pipeline parallel"
		case t.seq:
			what = "sequence parallel"
		}
		sup, err := cluster.Supervise(cluster.SuperviseOptions{Addrs: t.addrs, Connect: connect, Name: t.workerName, What: what,
			Spawned: t.spawned, MaxBackoff: t.retry, Probe: time.Second, Log: t.log})
		if err != nil {
			return nil, err
		}
		t.sup = sup
		return sup, nil
	}
}

// inFlight is the engine's steps in flight: --pipeline-inflight for a
// pipeline, else one.
func (t *tp) inFlight() int {
	if t == nil {
		return 0
	}
	return t.flight
}

// workerName is worker i's place: its rank, stage, or stage and rank.
func (t *tp) workerName(i int) string {
	switch {
	case !t.pipeline:
		return fmt.Sprintf("rank %d", i)
	case t.tensor > 1:
		return fmt.Sprintf("stage %d rank %d", i/t.tensor, i%t.tensor)
	}
	return fmt.Sprintf("stage %d", i)
}

// health is the server's health hook: the supervisor's (nil: always up).
func (t *tp) health() func() error {
	if t == nil {
		return nil
	}
	return func() error {
		if t.sup == nil {
			return nil
		}
		return t.sup.Health()
	}
}

// collector is the supervisor's metrics (nil without workers).
func (t *tp) collector() prometheus.Collector {
	if t == nil || t.sup == nil {
		return nil
	}
	return t.sup.Collector()
}

// pipelineGauges are the pipeline's bubble fraction and the most steps
// it held at once so far (its stages' own measure, PipelineStats), for
// /metrics; nil without a pipeline. After a reconnect they restart with
// the new pipeline.
func (t *tp) pipelineGauges() []prometheus.Collector {
	if t == nil || !t.pipeline {
		return nil
	}
	stat := func(f func(cluster.PipelineStats) float64) func() float64 {
		return func() float64 {
			if p := t.pipe.Load(); p != nil {
				return f(p.Stats())
			}
			return 0
		}
	}
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "pagoda_pipeline_bubble_fraction",
			Help: "Share of the pipeline stages' time spent idle while steps were in flight: 1 - sum(stage busy) / (stages * wall)."},
			stat(func(s cluster.PipelineStats) float64 { return s.Bubble() })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "pagoda_pipeline_steps_in_flight_max",
			Help: "Most engine steps the pipeline held at once (--pipeline-inflight)."},
			stat(func(s cluster.PipelineStats) float64 { return float64(s.MaxInFlight) })),
	}
}

func (t *tp) close() {
	if t == nil {
		return
	}
	if t.sup != nil {
		t.sup.Close()
	}
	if p := t.pipe.Load(); p != nil {
		st := p.Stats()
		fmt.Fprintf(t.log, "pipeline: %d steps in %d micro-batches, at most %d in flight, %v, stage busy %v, bubble %.3f\n",
			st.Steps, st.MicroBatches, st.MaxInFlight, st.Wall, st.Busy, st.Bubble())
	}
	if g := t.ring.Load(); g != nil {
		st := g.Stats()
		fmt.Fprintf(t.log, "sequence parallel: %d ranks, %d sequences in %d steps, the last one's prompt rows by rank %v\n",
			len(t.addrs), st.Sequences, st.Steps, st.Split)
	}
	t.spawned.Stop()
}

// engine is a one-sequence engine whose steps run on the group, for run.
func (t *tp) engine(m *model.Model, tok tokenizer.Tokenizer, ctx int) (*engine.Engine, error) {
	cfg := engine.ModelConfig(m, "run")
	cfg.MaxNumSeqs = 1
	cfg.KVRope = nil
	cfg.Executor = t.executor(m, ctx)
	t.seqEngine(&cfg)
	eng, err := engine.New(nil, tok, cfg)
	if err != nil {
		return nil, err
	}
	eng.Start()
	return eng, nil
}

// seqEngine makes an engine configuration fit a sequence-parallel group:
// one sequence at a time (the ranks hold one; others queue), from its
// first token (no prefix cache: the ranks cannot share a prefix between
// sequences), the whole prompt in one step (each ring pass then carries
// the whole sequence's blocks once, not once per chunk).
func (t *tp) seqEngine(cfg *engine.Config) {
	if t == nil || !t.seq {
		return
	}
	cfg.MaxNumSeqs = 1
	cfg.DisablePrefixCache = true
	cfg.MaxNumBatchedTokens = max(cfg.MaxNumBatchedTokens, cfg.ContextLen)
	cfg.LongPrefillThreshold = 0
}

// seqRefuse names what a sequence-parallel group does not run: the
// ranks keep f32 keys and values of one sequence, attend them all, and
// compute no hidden states or trees.
func (t *tp) seqRefuse(kvDTypes []string, kvPolicy string, spec bool) error {
	if t == nil || !t.seq {
		return nil
	}
	for _, d := range kvDTypes {
		if d != "" && d != "f32" {
			return fmt.Errorf("--sequence-parallel: --kv-dtype %s: the ranks keep their keys and values in f32 (give f32 or leave it out)", d)
		}
	}
	switch {
	case kvPolicy != "":
		return fmt.Errorf("--sequence-parallel: --kv-policy %s: the ranks attend every position; KV policies are not supported", kvPolicy)
	case spec:
		return errors.New("--sequence-parallel: speculative decoding (--spec/--draft) is not supported: the ranks run one row per position, no trees")
	}
	return nil
}
