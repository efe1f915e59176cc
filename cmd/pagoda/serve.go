package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"pagoda/embedded"
	"pagoda/engine"
	"pagoda/grammar"
	"pagoda/kvcache"
	"pagoda/model"
	"pagoda/progress"
	"pagoda/server"
)

func init() {
	register("serve", "serve a model over an OpenAI-compatible HTTP API", runServe)
}

// parseBytes reads "512MiB", "2GB", "1.5GiB" or a plain byte count.
func parseBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   float64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1}}
	mult := 1.0
	for _, u := range units {
		if strings.HasSuffix(strings.ToUpper(s), strings.ToUpper(u.suffix)) {
			s, mult = strings.TrimSpace(s[:len(s)-len(u.suffix)]), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(s, 64)
	// Written so that NaN fails too.
	if err != nil || !(v >= 0 && v*mult <= 1<<50) {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return int64(v * mult), nil
}

// serveLimits are the ranges of serve's numeric flags. The upper bounds
// are far past useful values; they stop typos that would allocate the
// machine away.
var serveLimits = []limit{
	{"port", 0, 65535}, {"threads", 0, maxThreads}, {"ctx", 0, maxCtx},
	{"kv-cache-fraction", 0.01, 0.95}, {"kv-seqs", 1, 1 << 16}, {"block-size", 1, 1024},
	{"max-num-batched-tokens", 1, 1 << 20}, {"max-num-seqs", 1, 1 << 16}, {"max-waiting", 1, 1 << 24},
	{"grace", 0, inf}, {"max-connections", 1, 1 << 20},
	{"grammar-max-states", 1000, 1 << 24}, {"grammar-timeout", 0.001, 600},
}

// checkBudget refuses a KV budget over the avail bytes the machine has (0 =
// unknown: no check). Refusing beats clamping: the user named a size, and
// going past it would end in the runtime's out-of-memory crash or in swap.
func checkBudget(budget, avail int64) error {
	if avail > 0 && budget > avail {
		return fmt.Errorf("%.1f GiB is more than the %.1f GiB of memory available; give a smaller size", float64(budget)/(1<<30), float64(avail)/(1<<30))
	}
	return nil
}

// servedName is the API model name for a model path: the file name
// without its model-format extension.
func servedName(path string) string {
	base := filepath.Base(filepath.Clean(path))
	for _, ext := range []string{".gguf", ".bin"} {
		if b, ok := strings.CutSuffix(base, ext); ok && b != "" {
			return b
		}
	}
	return base
}

// splitList reads a comma-separated flag value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// drainSignals turns SIGINT/SIGTERM into contexts: the first signal ends
// ctx (the server drains), a second aborts the drain and ends hard, for
// an operator who will not wait out --grace.
func drainSignals(abort func()) (ctx, hard context.Context, stop func()) {
	ctx, soft := context.WithCancel(context.Background())
	hard, hardStop := context.WithCancel(context.Background())
	sigc := make(chan os.Signal, 2)
	signal.Notify(sigc, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case <-sigc:
		case <-hard.Done():
			return
		}
		soft()
		select {
		case <-sigc:
			log.Printf("pagoda: second signal, cancelling in-flight requests")
			abort()
			hardStop()
		case <-hard.Done():
		}
	}()
	return ctx, hard, func() { signal.Stop(sigc); soft(); hardStop() }
}

func runServe(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	modelPath := fs.String("m", "", "model: GGUF file, llama2.c .bin or Hugging Face directory (default: the built-in stories260K)")
	tokPath := fs.String("tokenizer", "", "tokenizer file overriding the model's")
	name := fs.String("served-model-name", "", "model name in the API (default: the file name); a comma-separated list gives aliases; requests naming another model get 404")
	host := fs.String("host", "127.0.0.1", "listen address")
	port := fs.Int("port", 8000, "listen port (0 = any free port)")
	apiKey := fs.String("api-key", "", "require this bearer token on /v1/* (default $PAGODA_API_KEY); /health, /version and /metrics stay open, as in vLLM")
	metricsAuth := fs.Bool("metrics-auth", false, "with --api-key: require the key on /metrics, /version and /api/version too (/health stays open)")
	threads := fs.Int("threads", 0, "threads (0 = number of CPUs)")
	tpf := addTPFlags(fs)
	ctxLen := fs.Int("ctx", 0, "context length (0 = the model's)")
	kvMem := fs.String("kv-cache-memory", "", "KV-cache budget, e.g. 2GiB (default: sized from the model, its context and --kv-seqs, at most 25% of available RAM); refused when over the memory available (Linux: MemAvailable, or a cgroup v2 memory.max)")
	kvFrac := fs.Float64("kv-cache-fraction", defaultKVFraction, "when set: this fraction of available RAM is the KV cache, instead of the budget sized from the model")
	kvSeqs := fs.Int("kv-seqs", 4, "sequences at full context the default KV budget holds at once (more shorter ones fit; capped at 25% of available RAM)")
	kvDType := fs.String("kv-dtype", "f16", "KV-cache storage: f16, bf16, f32, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl (head dims multiples of 32), kivi2, kivi4 (options kivi2:g=32,r=128; --block-size defaults to g)")
	kvDTypeK := fs.String("kv-dtype-k", "", "KV-cache storage of keys (default --kv-dtype)")
	kvDTypeV := fs.String("kv-dtype-v", "", "KV-cache storage of values (default --kv-dtype)")
	blockSize := fs.Int("block-size", 16, "tokens per KV block")
	maxTokens := fs.Int("max-num-batched-tokens", 512, "token budget of one engine step")
	maxSeqs := fs.Int("max-num-seqs", 64, "sequences in one engine step")
	maxWaiting := fs.Int("max-waiting", 1024, "queued requests before 429")
	static := fs.Bool("static-batching", false, "static batching baseline (a batch starts and finishes together)")
	noPrefix := fs.Bool("no-prefix-cache", false, "disable prefix caching")
	kvEvents := fs.Int("kv-events", kvcache.DefaultEventBatches, "KV-event batches (one per engine step that changed the prefix cache) kept for GET /v1/kv_events?since= replay; 0 = publish no KV events")
	kvPolicy := fs.String("kv-policy", "", kvPolicyHelp)
	chatTmpl := fs.String("chat-template", "", "file with a Jinja chat template overriding the model's")
	grace := fs.Duration("grace", 30*time.Second, "on SIGTERM, how long in-flight requests may finish (a second signal cuts it short)")
	maxConns := fs.Int("max-connections", 2048, "open client connections at most; more wait to be accepted")
	origins := fs.String("allowed-origins", "", "comma-separated origins that get CORS headers (\"*\" = any); default none")
	hosts := fs.String("allowed-hosts", "", "comma-separated Host names accepted besides localhost when listening on loopback (\"*\" = any)")
	gStates := fs.Int("grammar-max-states", grammar.DefaultMaxStates, "automaton states one response_format schema or forced tool call may compile to")
	gMem := fs.String("grammar-max-memory", "16MiB", "memory one schema's grammar may take while compiled (a schema needing more is refused as soon as it does)")
	gTime := fs.Duration("grammar-timeout", grammar.DefaultMaxTime, "time one schema may take to compile")
	var spf specFlags
	spf.register(fs)
	if err := parseFlags(fs, args, append(serveLimits, specLimits...)); err != nil {
		return err
	}
	gLim := grammar.Limits{MaxStates: *gStates, MaxTime: *gTime}
	var err error
	if gLim.MaxBytes, err = parseBytes(*gMem); err != nil || gLim.MaxBytes < 1<<20 || gLim.MaxBytes > 1<<34 {
		return fmt.Errorf("--grammar-max-memory %q: want a size from 1MiB to 16GiB", *gMem)
	}
	builtin := *modelPath == ""
	path, err := resolveModel(*modelPath)
	if err != nil {
		return err
	}
	*modelPath = path
	if *apiKey == "" {
		*apiKey = os.Getenv("PAGODA_API_KEY")
	}
	if *metricsAuth && *apiKey == "" {
		return fmt.Errorf("--metrics-auth needs --api-key (or $PAGODA_API_KEY): there is no key to require")
	}
	if isEncoderFile(path) {
		if *name == "" {
			*name = servedName(path)
		}
		return serveEncoder(path, *name, *threads, net.JoinHostPort(*host, strconv.Itoa(*port)), *apiKey, *grace,
			server.Options{MaxConnections: *maxConns, AllowedOrigins: splitList(*origins), AllowedHosts: splitList(*hosts), MetricsAuth: *metricsAuth})
	}
	kf, err := parseKVFormat(*kvDType, "")
	if err != nil {
		return err
	}
	kfK, err := parseKVFormat(*kvDTypeK, *kvDType)
	if err != nil {
		return err
	}
	kfV, err := parseKVFormat(*kvDTypeV, *kvDType)
	if err != nil {
		return err
	}
	// A float --kv-dtype stays the cache's DType, the default of groups
	// the K/V formats do not reach.
	dt, _ := kf.(kvcache.DType)
	if !flagSet(fs, "block-size") {
		*blockSize = max(kvcache.FormatBlockSize(kfK), kvcache.FormatBlockSize(kfV))
	}
	var budget int64
	if *kvMem != "" {
		if budget, err = parseBytes(*kvMem); err != nil {
			return fmt.Errorf("--kv-cache-memory: %v", err)
		}
		if err := checkBudget(budget, systemMemory()); err != nil {
			return fmt.Errorf("--kv-cache-memory %s: %v", *kvMem, err)
		}
	} else if flagSet(fs, "kv-cache-fraction") {
		if avail := systemMemory(); avail > 0 {
			budget = int64(float64(avail) * *kvFrac)
		}
	}
	tmpl := ""
	if *chatTmpl != "" {
		b, err := os.ReadFile(*chatTmpl)
		if err != nil {
			return err
		}
		tmpl = string(b)
	}
	grp, err := tpf.start(*modelPath, *threads, os.Stderr)
	if err != nil {
		return err
	}
	defer grp.close()
	var kvGiven []string
	for _, f := range []string{"kv-dtype", "kv-dtype-k", "kv-dtype-v"} {
		if flagSet(fs, f) {
			kvGiven = append(kvGiven, fs.Lookup(f).Value.String())
		}
	}
	if err := grp.seqRefuse(kvGiven, *kvPolicy, spf.method != "" || spf.draft != ""); err != nil {
		return err
	}
	m, err := grp.openModel(*modelPath, model.Options{Tokenizer: *tokPath, Threads: *threads, ContextLen: *ctxLen,
		MaxMemory: tpf.capBytes, Reserve: kvReserve(grp, budget)})
	if err != nil {
		return tpf.capError(err, grp)
	}
	defer m.Close()
	tok := m.Tokenizer()
	if tok == nil {
		return fmt.Errorf("%s has no tokenizer; pass --tokenizer FILE", *modelPath)
	}
	aliases := splitList(*name)
	*name = ""
	if len(aliases) > 0 {
		*name, aliases = aliases[0], aliases[1:]
	}
	if *name == "" {
		*name = servedName(*modelPath)
		if builtin {
			*name = embedded.Name
		}
	}
	sc, closeDraft, err := spf.build(m, *modelPath, *threads)
	if err != nil {
		return err
	}
	defer closeDraft()
	c := m.Config
	pol, apiCtx, err := kvPolicyFlag(*kvPolicy, c.ContextLen)
	if err != nil {
		return err
	}
	nkv, kd, vd := c.KVShape()
	_, floatK := kfK.(kvcache.DType)
	_, floatV := kfV.(kvcache.DType)
	if vd == 0 && (!floatK || !floatV) {
		return fmt.Errorf("--kv-dtype %v/%v: an MLA model's latent cache is stored as f32, f16 or bf16 only", kfK, kfV)
	}
	// KIVI keeps each sequence's most recent tokens in f16 beside the
	// block pool: that room comes out of the budget first.
	shape := kvcache.Shape{NLayer: c.NLayer, NHead: c.NHead, NKVHead: c.NKVHead, HeadDim: c.HeadDim}
	if sz := kvcache.SizeOf(shape, kfK, kfV, *blockSize); sz.Err != nil && vd != 0 {
		return fmt.Errorf("--kv-dtype K %v V %v with --block-size %d: %w", kfK, kfV, *blockSize, sz.Err)
	}
	if budget > 0 && vd != 0 {
		if sz := kvcache.SizeOf(shape, kfK, kfV, *blockSize); sz.ResidualPerSeq > 0 {
			resid := sz.ResidualPerSeq * int64(*maxSeqs)
			if resid >= budget {
				return fmt.Errorf("--kv-cache-memory: %d sequences' residual windows of %s (%s each) leave nothing of %s for blocks; lower --max-num-seqs or the residual r=",
					*maxSeqs, kfK, progress.Bytes(sz.ResidualPerSeq), progress.Bytes(budget))
			}
			budget -= resid
		}
	}
	if *kvEvents < 0 {
		return fmt.Errorf("--kv-events %d is negative", *kvEvents)
	}
	var kvLog *kvcache.EventLog
	if *kvEvents > 0 && !*noPrefix {
		kvLog = kvcache.NewEventLog(*kvEvents)
	}
	reg := prometheus.NewRegistry()
	ecfg := engine.Config{
		ModelName: *name, NLayer: c.NLayer, NKVHead: nkv, HeadDim: kd, KVLatent: vd == 0,
		VocabSize: c.VocabSize, ContextLen: c.ContextLen, SlidingWindow: c.SlidingWindow,
		BlockSize: *blockSize, KVBytes: budget, KVDType: dt, KVFormatK: kfK, KVFormatV: kfV, DisablePrefixCache: *noPrefix,
		MaxNumBatchedTokens: *maxTokens, MaxNumSeqs: *maxSeqs, MaxWaiting: *maxWaiting, Static: *static,
		Registry: reg, KVPolicy: pol, KVRope: grp.rope(m), Spec: sc, Executor: grp.executor(m, *ctxLen), InFlight: grp.inFlight(), KVEvents: kvLog, GrammarLimits: gLim,
	}
	grp.seqEngine(&ecfg)
	blockBytes := engine.KVBlockBytes(ecfg)
	formats := fmt.Sprintf("K %v V %v", kfK, kfV)
	var kvReport string
	if budget == 0 {
		z := kvSizing{BlockBytes: blockBytes, BlockSize: *blockSize, Context: c.ContextLen, Seqs: *kvSeqs, Avail: kvRoom(grp, tpf.capBytes, m), Formats: formats}
		if vd != 0 {
			z.Residual = kvcache.SizeOf(shape, kfK, kfV, *blockSize).ResidualPerSeq * int64(*maxSeqs)
		}
		kb, err := sizedKVBudget(z)
		if err != nil {
			return err
		}
		ecfg.KVBlocks, ecfg.KVBytes, kvReport = kb.Blocks, kb.Bytes, kb.Report
	}
	if grp == nil {
		if err := model.CheckMemory(tpf.capBytes, m.WeightBytes(), ecfg.KVBytes); err != nil {
			return tpf.capError(err, grp)
		}
	}
	eng, err := engine.New(m, tok, ecfg)
	if err != nil {
		return err
	}
	st := eng.Stats()
	if kvReport == "" {
		flag := "--kv-cache-memory " + *kvMem
		if *kvMem == "" {
			flag = fmt.Sprintf("--kv-cache-fraction %g", *kvFrac)
		}
		kvReport = givenKVReport(formats, st.KV.Blocks, *blockSize, blockBytes, c.ContextLen, flag)
	}
	budget = int64(st.KV.Blocks) * blockBytes
	log.Printf("pagoda: %s", kvReport)
	if c.NExpert > 0 {
		reg.MustRegister(engine.NewExpertCollector(m, *name))
	}
	if c := grp.collector(); c != nil {
		reg.MustRegister(c)
	}
	reg.MustRegister(grp.pipelineGauges()...)
	eng.Start()
	backend, err := server.NewEngineBackend(eng, tok, *name, apiCtx, tmpl)
	if err != nil {
		return err
	}
	if err := backend.SetChatTemplate(chatTemplate(tok.Vocab(), tmpl, builtin)); err != nil {
		return err
	}
	backend.SetModelInfo(modelInfo(m, *modelPath, budget))
	so := server.Options{APIKey: *apiKey, MetricsAuth: *metricsAuth, ServedNames: aliases, Version: version(), Registry: reg, MaxWaiting: *maxWaiting,
		MaxConnections: *maxConns, GrammarLimits: gLim, AllowedOrigins: splitList(*origins), AllowedHosts: splitList(*hosts), Engine: eng, KVEvents: kvLog, Health: grp.health()}
	if emb := grp.embedder(m); emb != nil {
		defer emb.Close()
		so.Embedder = emb
	}
	srv := server.New(backend, so)
	ctx, hard, stopSignals := drainSignals(srv.Abort)
	defer stopSignals()
	addr := net.JoinHostPort(*host, strconv.Itoa(*port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	log.Printf("pagoda: serving %s on http://%s (threads %d)", *name, ln.Addr(), m.Pool().Threads())
	if sc.Proposer != nil {
		log.Printf("pagoda: speculative decoding: %s, up to %d draft tokens", sc.Method, cmp.Or(sc.Tokens, engine.DefaultSpecTokens))
	}
	err = srv.Serve(ctx, ln, *grace)
	sctx, cancel := context.WithTimeout(hard, *grace)
	defer cancel()
	if serr := eng.Stop(sctx); err == nil && serr != nil && serr != context.DeadlineExceeded && serr != context.Canceled {
		err = serr
	}
	log.Printf("pagoda: stopped")
	return err
}

// kvReserve is the KV storage a model opened in this process will take
// beside its weights, for --max-memory: the budget given, when one was
// (a sized default is checked once sized). A coordinator's KV storage
// is on its workers.
func kvReserve(grp *tp, budget int64) func(*model.Config, model.Stage) (int64, error) {
	if grp != nil || budget <= 0 {
		return nil
	}
	return func(*model.Config, model.Stage) (int64, error) { return budget, nil }
}

// kvRoom is the memory a default KV budget is sized from: what the
// machine has, and under --max-memory no more than the cap leaves beside
// the weights.
func kvRoom(grp *tp, capBytes int64, m *model.Model) int64 {
	avail := systemMemory()
	if grp != nil || capBytes <= 0 {
		return avail
	}
	room := max(capBytes-m.WeightBytes(), 1)
	if avail <= 0 || room < avail {
		return room
	}
	return avail
}

// parseKVFormat reads a --kv-dtype flag, s falling back to def when empty.
func parseKVFormat(s, def string) (kvcache.Format, error) {
	if s == "" {
		s = def
	}
	f, err := kvcache.ParseFormat(s)
	if err != nil {
		return nil, fmt.Errorf("--kv-dtype: %w", err)
	}
	return f, nil
}

// flagSet says whether name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
