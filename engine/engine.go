package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"pagoda/executor"
	"pagoda/grammar"
	"pagoda/kernels"
	"pagoda/kvcache"
	"pagoda/model"
	"pagoda/sample"
	"pagoda/spec"
	"pagoda/tokenizer"
)

// Forwarder is what the engine needs of a model: one forward pass over a
// flat batch, reading and writing K/V through kv. *model.Model satisfies
// it. The engine reaches it only through an executor (executor.Local), so
// every step it runs is plain data that could go to another process.
type Forwarder = executor.Forwarder

// Config sets up an Engine. The shape fields come from the model's config.
type Config struct {
	ModelName string // the model_name label of the metrics

	NLayer, NKVHead, HeadDim int
	// KVLatent: the K row also serves as V, so the cache stores no values
	// (MLA's latent + rope key; model.Config.KVShape's vdim 0).
	KVLatent              bool
	VocabSize, ContextLen int

	BlockSize int           // tokens per KV block; 0 = 16
	KVBlocks  int           // pool size; 0 = as many as KVBytes holds
	KVBytes   int64         // pool budget; 0 (and no KVBlocks) = room for MaxNumSeqs full contexts, at most 1 GiB
	KVDType   kvcache.DType // f16 by default
	// KVFormatK and KVFormatV store keys and values in another format
	// (q8_0, q4_0); nil means KVDType. The default KV budget counts their
	// real bytes, so a quantized cache holds more tokens in it.
	KVFormatK, KVFormatV kvcache.Format
	DisablePrefixCache   bool
	// KVEvents, when set, receives the blocks that enter and leave the
	// prefix cache, a batch per step (kvcache.EventLog; a log serves one
	// engine).
	KVEvents  *kvcache.EventLog
	CacheSalt uint64 // extra prefix-hash key: engines sharing nothing should differ
	// SlidingWindow is the model's attention window (model.Config's
	// SlidingWindow; 0 = full attention). With it, KV blocks that have
	// slid out of the window are released while a sequence runs, so one
	// sequence holds about SlidingWindow/BlockSize+1 blocks and may grow
	// past what the pool holds.
	SlidingWindow int
	// KVPolicy decides what each sequence attends and which blocks it
	// gives back (kvcache.ParsePolicy; nil: full attention, or the
	// sliding window). A policy that keeps distances bounded
	// (StreamingLLM) lets a request generate past ContextLen: only an
	// explicit max_tokens then limits it.
	KVPolicy kvcache.Policy
	// KVRope is the model's rotary embedding, for policies that move
	// positions (ModelConfig fills it).
	KVRope *kvcache.Rotary

	MaxNumBatchedTokens int // token budget of one step; 0 = 512
	MaxNumSeqs          int // sequences in one step; 0 = 64
	MaxWaiting          int // requests queued before Submit says ErrQueueFull; 0 = 1024
	// LongPrefillThreshold caps the prefill tokens one request gets in a
	// step, so several long prompts advance together instead of queueing
	// behind the first (vLLM's long_prefill_token_threshold); 0 = off.
	LongPrefillThreshold int
	Static               bool // static batching baseline: a batch starts and finishes together

	// Spec configures speculative decoding (off without a proposer).
	Spec SpecConfig

	// Constraints compiles requests' constraints (nil: grammars over the
	// tokenizer's vocabulary, cached, within GrammarLimits).
	Constraints   ConstraintCompiler
	GrammarLimits grammar.Limits

	Registry *prometheus.Registry // where the vllm:* metrics go; nil = nowhere
	// Executor, when set, runs the steps elsewhere (worker processes of a
	// tensor-parallel group): the engine keeps only the KV manager, with
	// no pages, and Executor gets the KV configuration the workers'
	// storage must be built with. The Forwarder given to New is unused.
	Executor func(kvcache.Config) (executor.Executor, error)
	// InFlight is how many steps the engine keeps in flight when its
	// executor takes a step before the last one's output is back (a
	// Submitter: a pipeline of stages, which then overlap across steps);
	// 0 or 1: one at a time (at most 64). See inflight.go for when it
	// still runs one.
	InFlight int
	// Ops computes attention in the KV cache (nil: kernels.Best()); the
	// model's own set (model.Ops) keeps a reference model plain Go.
	Ops *kernels.Ops
}

var (
	// ErrBadKVPolicy matches (errors.Is) a request's KV policy the cache
	// cannot run (Request.KVPolicy).
	ErrBadKVPolicy = errors.New("engine: bad KV policy")
	// ErrQueueFull is returned by Submit when MaxWaiting requests already wait.
	ErrQueueFull = errors.New("engine: waiting queue is full")
	// ErrStopped is returned by Submit once Stop has been called.
	ErrStopped = errors.New("engine: stopped")
	// ErrTooLong matches (errors.Is) every *TooLongError.
	ErrTooLong = errors.New("engine: request too long")
)

// TooLongError says a request cannot fit: prompt plus max_tokens exceed the
// model's context or what the KV cache can ever hold.
type TooLongError struct {
	Prompt, MaxTokens int
	Limit             int    // tokens
	What              string // "context" or "KV cache"
}

func (e *TooLongError) Error() string {
	if e.MaxTokens == 0 {
		return fmt.Sprintf("engine: prompt of %d tokens leaves no room in the %s of %d tokens", e.Prompt, e.What, e.Limit)
	}
	// Both are non-negative ints, so their sum fits a uint64 where it may
	// not fit an int.
	return fmt.Sprintf("engine: prompt of %d tokens + max_tokens %d = %d exceeds the %s of %d tokens",
		e.Prompt, e.MaxTokens, uint64(e.Prompt)+uint64(e.MaxTokens), e.What, e.Limit)
}

// Is makes errors.Is(err, ErrTooLong) true.
func (e *TooLongError) Is(target error) bool { return target == ErrTooLong }

// Stats is a snapshot of the engine, published after every step.
type Stats struct {
	Running, Waiting int // requests
	RunningSeqs      int
	KV               kvcache.Usage
	KVUsage          float64 // fraction of blocks in use
	PrefixQueries    uint64  // prompt tokens looked up in the prefix cache
	PrefixHits       uint64  // of which found
	Preemptions      uint64
	Steps            uint64
	PromptTokens     uint64
	GenerationTokens uint64
	BatchedTokens    uint64 // tokens forwarded, recomputation included

	// Speculative decoding: verifications that carried drafts, the draft
	// tokens verified, and those accepted.
	SpecDrafts, SpecDraftTokens, SpecAccepted uint64
	SpecErrors                                uint64 // proposer failures (steps run without drafts)
}

// Engine runs requests with continuous batching. One goroutine (started by
// Start) owns the scheduler and the KV cache; Submit, Stats and Stop may be
// called from any goroutine.
type Engine struct {
	// ex runs the steps: in this process, the model over e.kv.
	ex     executor.Executor
	epoch  uint64 // the executor's storage's, when it can restart (restart.go)
	maxLen int    // tokens a sequence may reach: ContextLen, or more under a streaming policy
	tok    tokenizer.Tokenizer
	vocab  *tokenizer.Vocab
	cfg    Config
	kv     *kvcache.Cache
	m      *metrics
	cons   ConstraintCompiler

	mu       sync.Mutex
	inNew    []*request
	inCancel []*request
	inStop   []stopMsg
	inBlocks []chan kvcache.BlockMap
	stopping bool
	wake     chan struct{}
	queued   atomic.Int64

	startOnce, forceOnce sync.Once
	stopCh, forceCh      chan struct{}
	done                 chan struct{}
	stats                atomic.Pointer[Stats]

	// Owned by the loop goroutine.
	sch       *scheduler
	st        Stats
	blockWant []chan kvcache.BlockMap // Blocks callers, answered at publish
	in        executor.StepInput      // the step being built, reused
	plan      model.KVPlan            // its KV plan, from the KV manager
	scratch   []float32
	topRows   []float32 // logits rows spread from a top-k step (topone.go)

	specMax   int       // Config.Spec.Tokens, defaulted
	cost      spec.Cost // measured step costs: when speculation pays
	specReqs  []*spec.Req
	specCands []draftCand
	specErrs  uint64
	specSteps uint64  // steps with speculation candidates: the probes' clock
	hist      []int32 // a sequence's tokens and its accepted drafts, while verifying
	// accept is the acceptance test, spec.Accept; the tests swap in a
	// wrong one to show that the exactness test can fail.
	accept func(p, q []float32, x int32, u float64) bool

	// ctl decides whether to speculate at all (nil: always; specctl.go).
	ctl *specCtl

	// Speculation trees (tree.go) and features (features.go).
	trees   bool      // the storage and executor take trees; else first branches
	feat    *featBook // nil: the proposer reads no hidden states
	moves   []int32   // slot moves for the next step: accepted paths compacted
	rope    []int32   // the step's rotary positions, when it carries trees
	treePar []int32   // the step's rows' tree parents, when it carries trees
	pk      picker    // draws at each node of a verification walk

	pp *inflight // steps in flight (nil: one at a time)
}

type request struct {
	r         Request
	maxTokens int
	extra     uint64 // prefix-cache key: the engine's salt with the request's
	// kvPolicy is what the request's sequences are bound to in the KV
	// cache (nil: the engine's default); kvLossy says its effective policy
	// is not full attention (no speculation); maxLen is the tokens one of
	// its sequences may reach.
	kvPolicy kvcache.Policy
	kvLossy  bool
	maxLen   int
	// constraint makes each completion's constraint (nil: none), from
	// Request.Constraint.
	constraint func() sample.Constraint
	show       []int32 // WithShowTokens
	comps      []completion
	stopAfter  func() bool
	out        *outbox

	// Kept by the scheduler.
	seqs     []*sequence // by completion index, as they are forked
	forked   bool
	admitted bool
	cached   int
	// promptDone counts prompt positions already scored for
	// PromptLogprobs, so a recompute after preemption does not repeat them.
	promptDone int

	ended      bool
	done       int
	completion int
	arrival    time.Time
	firstTok   time.Time
}

// completion is the streaming side of one of a request's N completions;
// it exists before the scheduler forks its sequence, so the fork's first
// token can be sampled and streamed in the step that forks it.
type completion struct {
	sampler tokenSampler
	draft   *sample.Sampler // a sampling proposer's copy of the settings
	vrng    *rand.Rand      // uniforms for verifying drafts
	nOut    int
	lastTok time.Time
}

// New builds an engine and its KV cache; call Start to run it.
func New(fw Forwarder, tok tokenizer.Tokenizer, cfg Config) (*Engine, error) {
	if (fw == nil && cfg.Executor == nil) || tok == nil {
		return nil, fmt.Errorf("engine: model and tokenizer are required")
	}
	if cfg.VocabSize <= 0 || cfg.ContextLen <= 0 {
		return nil, fmt.Errorf("engine: vocabulary size %d and context length %d must be positive", cfg.VocabSize, cfg.ContextLen)
	}
	if cfg.MaxNumBatchedTokens == 0 {
		cfg.MaxNumBatchedTokens = 512
	}
	if cfg.MaxNumSeqs == 0 {
		cfg.MaxNumSeqs = 64
	}
	if cfg.MaxWaiting == 0 {
		cfg.MaxWaiting = 1024
	}
	if cfg.SlidingWindow < 0 {
		return nil, fmt.Errorf("engine: sliding window %d is negative", cfg.SlidingWindow)
	}
	if cfg.MaxNumBatchedTokens < 0 || cfg.MaxNumSeqs < 0 || cfg.MaxWaiting < 0 || cfg.LongPrefillThreshold < 0 || cfg.InFlight < 0 {
		return nil, fmt.Errorf("engine: negative limits: max_num_batched_tokens %d, max_num_seqs %d, max_waiting %d, steps in flight %d",
			cfg.MaxNumBatchedTokens, cfg.MaxNumSeqs, cfg.MaxWaiting, cfg.InFlight)
	}
	if cfg.ModelName == "" {
		cfg.ModelName = "pagoda"
	}
	kcfg := kvConfig(cfg)
	if kcfg.NumBlocks == 0 && kcfg.Bytes == 0 {
		// Every format's bytes are linear in the block's tokens, so this
		// is exact, and it counts a quantized format's scales.
		per := kcfg.BlockBytes() / int64(cmp.Or(kcfg.BlockSize, kvcache.DefaultBlockSize))
		kcfg.Bytes = min(mulCap(mulCap(per, int64(cfg.ContextLen)+kvcache.DefaultBlockSize, 1<<30), int64(cfg.MaxNumSeqs), 1<<30), 1<<30)
	}
	if cfg.Spec.Tokens < 0 {
		return nil, fmt.Errorf("engine: speculative tokens %d is negative", cfg.Spec.Tokens)
	}
	kv, ex, err := newKV(fw, kcfg, cfg.Executor)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	specMax := cmp.Or(cfg.Spec.Tokens, DefaultSpecTokens)
	m, err := newMetrics(cfg.Registry, cfg.ModelName, cfg.Spec.Proposer != nil, specMax)
	if err != nil {
		kv.Close()
		return nil, err
	}
	var km kvManager = managerKV{kv}
	if cfg.Spec.Proposer != nil {
		km = specKV{km, cfg.Spec.Proposer}
	}
	e := &Engine{
		ex: ex, tok: tok, vocab: tok.Vocab(), cfg: cfg, kv: kv, m: m, sch: newScheduler(cfg, km), specMax: specMax, accept: spec.Accept,
		maxLen: cfg.ContextLen,
		wake:   make(chan struct{}, 1),
		stopCh: make(chan struct{}), forceCh: make(chan struct{}), done: make(chan struct{}),
	}
	if e.vocab == nil {
		e.vocab = &tokenizer.Vocab{BOS: -1, EOS: -1, UNK: -1, PAD: -1, EOT: -1}
	}
	e.cons = cfg.Constraints
	if e.cons == nil {
		e.cons = newGrammarCompiler(tok, cfg.GrammarLimits)
	}
	if kv.PositionLimit() > 0 && kv.MaxSeqBlocks(e.sch.maxChunk()) > 0 {
		e.maxLen = kv.PositionLimit()
	}
	// Trees need exact slot moves, the storage in this process, and full
	// attention: a sliding window would clip tree nodes by their storage
	// positions rather than their depths.
	e.trees = kcfg.ExactSlotMoves() && cfg.Executor == nil && cfg.SlidingWindow == 0
	if e.feat, err = newFeatBook(fw, cfg); err != nil {
		kv.Close()
		return nil, err
	}
	e.pp = newInflight(ex, cfg, e.sch)
	e.publish()
	return e, nil
}

// kvConfig is the KV cache configuration cfg asks for.
func kvConfig(cfg Config) kvcache.Config {
	kcfg := kvcache.Config{
		NLayer: cfg.NLayer, NKVHead: cfg.NKVHead, HeadDim: cfg.HeadDim,
		BlockSize: cfg.BlockSize, NumBlocks: cfg.KVBlocks, Bytes: cfg.KVBytes,
		DType: cfg.KVDType, KFormat: cfg.KVFormatK, VFormat: cfg.KVFormatV, PrefixCache: !cfg.DisablePrefixCache, Window: cfg.SlidingWindow, Ops: cfg.Ops,
		Policy: cfg.KVPolicy, Rope: cfg.KVRope, Events: cfg.KVEvents,
	}
	if cfg.KVLatent {
		layers := make([]int, cfg.NLayer)
		for i := range layers {
			layers[i] = i
		}
		kcfg.Groups = []kvcache.GroupSpec{{Layers: layers, NKVHead: cfg.NKVHead, KDim: cfg.HeadDim}}
	}
	return kcfg
}

// KVBlockBytes is the pool storage of one KV block under cfg (every
// layer group, K and V, scales included): what sizing a budget in blocks
// needs before the engine exists.
func KVBlockBytes(cfg Config) int64 { return kvConfig(cfg).BlockBytes() }

// mulCap is a*b for non-negative a and b, or limit when the product
// exceeds it: a model's context length times the sequence count can wrap
// an int64 and turn the default KV budget negative.
func mulCap(a, b, limit int64) int64 {
	if a != 0 && b > limit/a {
		return limit
	}
	return min(a*b, limit)
}

// Start runs the engine loop; calling it again does nothing.
func (e *Engine) Start() { e.startOnce.Do(func() { go e.loop() }) }

// Stop stops taking requests and lets the running and waiting ones finish;
// when ctx ends first, what is left is cancelled (each completion gets a
// FinishCancelled event) and ctx's error returned.
func (e *Engine) Stop(ctx context.Context) error {
	e.mu.Lock()
	first := !e.stopping
	e.stopping = true
	e.mu.Unlock()
	if first {
		close(e.stopCh)
	}
	e.Start()
	select {
	case <-e.done:
		return nil
	case <-ctx.Done():
		e.forceOnce.Do(func() { close(e.forceCh) })
		<-e.done
		return ctx.Err()
	}
}

// newKV is the KV cache and the executor of the steps: a local cache with
// its pages run by fw, or, with remote, the manager alone and the
// executor remote builds for the workers' storage.
func newKV(fw Forwarder, kcfg kvcache.Config, remote func(kvcache.Config) (executor.Executor, error)) (*kvcache.Cache, executor.Executor, error) {
	if remote == nil {
		kv, err := kvcache.New(kcfg)
		if err != nil {
			return nil, nil, err
		}
		return kv, executor.NewLocal(fw, kv), nil
	}
	kv, err := kvcache.NewManager(kcfg)
	if err != nil {
		return nil, nil, err
	}
	// The workers build their pages from the manager's resolved
	// configuration, so both count the same blocks.
	ex, err := remote(kv.Config())
	if err != nil {
		kv.Close()
		return nil, nil, err
	}
	return kv, ex, nil
}

// Stats returns the snapshot of the last step.
func (e *Engine) Stats() Stats { return *e.stats.Load() }

// Blocks returns a picture of the KV block pool. The loop goroutine owns
// the cache, so it takes the copy between steps; the copy is O(blocks), so
// it is made only when asked for, never every step. Before Start it waits
// for ctx.
func (e *Engine) Blocks(ctx context.Context) (kvcache.BlockMap, error) {
	ch := make(chan kvcache.BlockMap, 1)
	e.mu.Lock()
	e.inBlocks = append(e.inBlocks, ch)
	e.mu.Unlock()
	e.poke()
	select {
	case m := <-ch:
		return m, nil
	case <-e.done:
		select {
		case m := <-ch:
			return m, nil
		default:
		}
		// The loop has returned, so nothing changes the cache any more.
		var m kvcache.BlockMap
		e.kv.Blocks(&m)
		return m, nil
	case <-ctx.Done():
		return kvcache.BlockMap{}, ctx.Err()
	}
}

// Submit queues r and returns its event stream, closed after the final
// event (the one carrying Usage). Cancelling ctx cancels the request and
// frees its KV blocks; the stream then closes without further events. The
// caller must read the stream to its end or cancel ctx.
func (e *Engine) Submit(ctx context.Context, r *Request) (<-chan Event, error) {
	if r == nil {
		return nil, fmt.Errorf("engine: nil request")
	}
	req, err := e.validate(r)
	if err != nil {
		return nil, err
	}
	if err := req.compile(ctx, e.cons); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := req.makeSamplers(); err != nil {
		return nil, err
	}
	req.show = showTokens(ctx)
	proc := newOutProc(e.tok, req, func(index int) {
		e.mu.Lock()
		e.inStop = append(e.inStop, stopMsg{req, index})
		e.mu.Unlock()
		e.poke()
	})
	// Unbuffered: events wait in the outbox, where they can be merged.
	out := make(chan Event)
	req.out = newOutbox()
	req.arrival = time.Now()

	e.mu.Lock()
	if e.stopping {
		e.mu.Unlock()
		return nil, ErrStopped
	}
	if e.queued.Load() >= int64(e.cfg.MaxWaiting) {
		e.mu.Unlock()
		return nil, ErrQueueFull
	}
	e.queued.Add(1)
	e.inNew = append(e.inNew, req)
	// Under the lock: the loop reads stopAfter only after taking req from
	// the inbox. The callback runs on its own goroutine, so it may lock.
	req.stopAfter = context.AfterFunc(ctx, func() {
		e.mu.Lock()
		e.inCancel = append(e.inCancel, req)
		e.mu.Unlock()
		e.poke()
	})
	e.mu.Unlock()
	go req.out.pump(ctx, out, proc)
	e.poke()
	return out, nil
}

func (e *Engine) poke() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// checkRequestPolicy refuses a request's own KV policy that the cache
// cannot run or whose token counts exceed the context.
func checkRequestPolicy(kv *kvcache.Cache, p kvcache.Policy, ctx int) error {
	if err := kv.Policies.Check(p); err != nil {
		return err
	}
	return kvcache.CheckContext(p, ctx)
}

// validate checks r against the model and fills in defaults.
func (e *Engine) validate(r *Request) (*request, error) {
	c := e.cfg
	q := &request{r: *r}
	q.r.Prompt = append([]int32(nil), r.Prompt...)
	if len(r.Prompt) == 0 {
		return nil, fmt.Errorf("engine: request %q: empty prompt", r.ID)
	}
	for i, id := range r.Prompt {
		if id < 0 || int(id) >= c.VocabSize {
			return nil, fmt.Errorf("engine: request %q: prompt token %d is id %d, outside the vocabulary of %d", r.ID, i, id, c.VocabSize)
		}
	}
	if q.r.N == 0 {
		q.r.N = 1
	}
	if q.r.N < 0 || q.r.N > c.MaxNumSeqs {
		return nil, fmt.Errorf("engine: request %q: n = %d must be in [1, %d]", r.ID, r.N, c.MaxNumSeqs)
	}
	if r.MaxTokens < 0 {
		return nil, fmt.Errorf("engine: request %q: max_tokens %d is negative", r.ID, r.MaxTokens)
	}
	if r.TopLogprobs < 0 || r.TopLogprobs > 20 {
		return nil, fmt.Errorf("engine: request %q: top_logprobs %d must be in [0, 20]", r.ID, r.TopLogprobs)
	}
	if err := r.Sampling.CheckVocab(c.VocabSize); err != nil {
		return nil, fmt.Errorf("engine: request %q: %w", r.ID, err)
	}
	if err := e.bindPolicy(q); err != nil {
		return nil, err
	}
	maxLen := q.maxLen
	kvTokens := e.kv.Pool().NumBlocks() * e.kv.BlockSize()
	if peak := e.kv.Policies.MaxSeqBlocks(q.kvPolicy, e.sch.maxChunk()); peak > 0 && peak <= e.kv.Pool().NumBlocks() {
		// The window bounds what a sequence ever holds at once (the
		// largest chunk included), so only the context limits it.
		kvTokens = maxLen
	}
	n := len(r.Prompt)
	switch {
	case r.MaxTokens == 0:
		// Without max_tokens a request stops at the model's context even
		// when a streaming policy would let it run on.
		limit, what := c.ContextLen, "context"
		if kvTokens < limit {
			limit, what = kvTokens, "KV cache"
		}
		if n >= maxLen || (maxLen == c.ContextLen && n >= limit) {
			return nil, &TooLongError{Prompt: n, Limit: limit, What: what}
		}
		q.maxTokens = max(limit-n, 1)
	// Subtract rather than add: a client's max_tokens near MaxInt would
	// make n+MaxTokens wrap negative and slip past both limits.
	case r.MaxTokens > maxLen-n:
		return nil, &TooLongError{Prompt: n, MaxTokens: r.MaxTokens, Limit: maxLen, What: "context"}
	case r.MaxTokens > kvTokens-n:
		return nil, &TooLongError{Prompt: n, MaxTokens: r.MaxTokens, Limit: kvTokens, What: "KV cache"}
	default:
		q.maxTokens = r.MaxTokens
	}
	q.extra = kvcache.SaltKey(c.CacheSalt, r.CacheSalt)
	if err := r.Sampling.Validate(); err != nil {
		return nil, fmt.Errorf("engine: request %q: %w", r.ID, err)
	}
	return q, nil
}

// bindPolicy parses the request's KV policy and decides what it implies:
// whether it is lossy (no speculation) and how long a sequence may grow.
func (e *Engine) bindPolicy(q *request) error {
	c, r := e.cfg, &q.r
	q.maxLen = e.maxLen
	if r.KVPolicy != "" {
		p, err := kvcache.ParsePolicy(r.KVPolicy)
		if err == nil {
			err = checkRequestPolicy(e.kv, p, c.ContextLen)
		}
		if err != nil {
			return fmt.Errorf("engine: request %q: %w: %w", r.ID, ErrBadKVPolicy, err)
		}
		q.kvPolicy = p
		// Past the context only where the engine's policy goes there
		// too (the model checks positions against the cache's default)
		// and the request's own keeps distances and blocks bounded.
		if e.maxLen == c.ContextLen || e.kv.Policies.PositionLimit(p) == 0 || e.kv.Policies.MaxSeqBlocks(p, e.sch.maxChunk()) == 0 {
			q.maxLen = c.ContextLen
		}
	}
	eff := c.KVPolicy
	if q.kvPolicy != nil {
		eff = q.kvPolicy
	}
	if eff != nil {
		_, full := eff.(kvcache.FullPolicy)
		q.kvLossy = !full
	}
	return nil
}

// makeSamplers gives each completion its sampler (with its own
// constraint) and its verification stream.
func (q *request) makeSamplers() error {
	for i := 0; i < q.r.N; i++ {
		var con sample.Constraint
		if q.constraint != nil {
			con = q.constraint()
		}
		s, err := newSampler(q.r.Sampling, i, con)
		if err != nil {
			return fmt.Errorf("engine: request %q: %w", q.r.ID, err)
		}
		q.comps = append(q.comps, completion{sampler: s, vrng: verifyRNG(q.r.Sampling, i)})
	}
	return nil
}

func (e *Engine) loop() {
	defer close(e.done)
	// The loop is the cache's only user: once it has returned nothing
	// steps any more, so the pages (mapped outside the heap) go now, not
	// whenever the collector finds the engine unreachable. What Stop's
	// callers may still ask (Blocks, Stats) reads the manager's side.
	defer e.kv.Close()
	for {
		e.takeInbox()
		select {
		case <-e.forceCh:
			e.cancelAll()
			settle(e)
			e.publish()
			return
		default:
		}
		settle(e)
		if e.sch.idle() {
			e.publish()
			e.mu.Lock()
			quit := e.stopping && len(e.inNew) == 0 && len(e.inCancel) == 0
			e.mu.Unlock()
			if quit {
				return
			}
			select {
			case <-e.wake:
			case <-e.stopCh:
			case <-e.forceCh:
			}
			continue
		}
		if !e.step() {
			// Nothing could be scheduled (cannot happen with the checks in
			// Submit, but never spin): wait for something to change.
			select {
			case <-e.wake:
			case <-e.forceCh:
			}
		}
		e.publish()
	}
}

func (e *Engine) takeInbox() {
	e.mu.Lock()
	news, cancels, stops := e.inNew, e.inCancel, e.inStop
	e.inNew, e.inCancel, e.inStop = nil, nil, nil
	e.blockWant = append(e.blockWant, e.inBlocks...)
	e.inBlocks = nil
	e.mu.Unlock()
	for _, r := range news {
		e.sch.add(r) // the scheduler binds its policy and prompt at admission
	}
	for _, st := range stops {
		if s := st.r.live(st.index); s != nil {
			e.sch.abort(s)
			e.finishCompletion(st.r, Event{Index: st.index, Finish: FinishStop})
		}
	}
	for _, r := range cancels {
		e.endRequest(r, FinishCancelled, nil)
	}
}

// stopMsg is an output processor's word that a stop string ended
// completion index of r: the loop frees its sequence as a cancellation
// would, but it finishes with FinishStop.
type stopMsg struct {
	r     *request
	index int
}

// live is the sequence of completion index while it still runs or waits;
// nil once it has finished (or the request has ended).
func (r *request) live(index int) *sequence {
	if r.ended || index >= len(r.seqs) || r.seqs[index] == nil || r.seqs[index].finished {
		return nil
	}
	return r.seqs[index]
}

// finishCompletion streams the final event ev of one completion (the
// scheduler frees its blocks); the last completion ends the request.
func (e *Engine) finishCompletion(r *request, ev Event) {
	r.done++
	if r.done < r.r.N {
		r.out.push(ev, false)
		return
	}
	r.ended = true
	ev.Usage = &Usage{PromptTokens: len(r.r.Prompt), CompletionTokens: r.completion, CachedTokens: r.cached}
	r.out.push(ev, true)
	r.stopAfter()
	now := time.Now()
	e.m.success.WithLabelValues(string(ev.Finish)).Inc()
	e.m.e2e.Observe(now.Sub(r.arrival).Seconds())
	if r.completion > 1 && !r.firstTok.IsZero() {
		e.m.tpot.Observe(now.Sub(r.firstTok).Seconds() / float64(r.completion-1))
	}
}

// endRequest ends every unfinished completion of r with reason (and err),
// freeing their blocks at once.
func (e *Engine) endRequest(r *request, reason FinishReason, err error) {
	if r.ended {
		return
	}
	r.ended = true
	if !r.admitted {
		r.admitted = true
		e.queued.Add(-1)
	}
	var evs []Event
	for i := 0; i < r.r.N; i++ {
		var s *sequence
		if i < len(r.seqs) {
			s = r.seqs[i]
		}
		if s != nil {
			if s.finished {
				continue
			}
			e.sch.abort(s)
		}
		evs = append(evs, Event{Index: i, Finish: reason, Err: err})
	}
	if len(evs) == 0 {
		return
	}
	evs[len(evs)-1].Usage = &Usage{PromptTokens: len(r.r.Prompt), CompletionTokens: r.completion, CachedTokens: r.cached}
	for i, ev := range evs {
		r.out.push(ev, i == len(evs)-1)
	}
	r.stopAfter()
	if reason == FinishCancelled {
		e.m.success.WithLabelValues(abortLabel).Inc()
	}
}

func (e *Engine) cancelAll() {
	for len(e.sch.running) > 0 {
		e.endRequest(e.sch.running[0].req, FinishCancelled, nil)
	}
	for len(e.sch.waiting) > 0 {
		e.endRequest(e.sch.waiting[0].req, FinishCancelled, nil)
	}
	e.mu.Lock()
	news := e.inNew
	e.inNew = nil
	e.mu.Unlock()
	for _, r := range news {
		e.endRequest(r, FinishCancelled, nil)
	}
}

func (e *Engine) publish() {
	if l := e.cfg.KVEvents; l != nil {
		l.Flush() // the step's block events, one batch
	}
	st := e.st
	reqs := map[*request]bool{}
	for _, s := range e.sch.running {
		reqs[s.req] = true
	}
	st.Running, st.RunningSeqs = len(reqs), len(e.sch.running)
	st.Waiting = int(e.queued.Load())
	for _, s := range e.sch.waiting {
		if s.req.admitted && !reqs[s.req] { // preempted: waits again
			reqs[s.req] = true
			st.Waiting++
		}
	}
	st.KV = e.kv.Usage()
	st.KVUsage = st.KV.UsedFrac()
	st.PrefixQueries, st.PrefixHits = e.kv.Pool().Queries, e.kv.Pool().Hits
	st.SpecErrors = e.specErrs
	e.stats.Store(&st)
	for _, ch := range e.blockWant {
		var m kvcache.BlockMap
		e.kv.Blocks(&m)
		ch <- m
	}
	e.blockWant = e.blockWant[:0]
	e.m.running.Set(float64(st.Running))
	e.m.waiting.Set(float64(st.Waiting))
	e.m.kvUsage.Set(st.KVUsage)
	if st.KV.Seqs > 0 {
		e.m.slotsFilled.Add(float64(st.KV.Filled))
		e.m.slotsReserved.Add(float64(st.KV.Reserved))
	}
	if alloc := st.KV.Filled + st.KV.Reserved; alloc > 0 {
		e.m.wasteRatio.Set(float64(st.KV.Reserved) / float64(alloc))
	} else {
		e.m.wasteRatio.Set(0)
	}
	e.m.blocks.WithLabelValues("used").Set(float64(st.KV.Used))
	e.m.blocks.WithLabelValues("free").Set(float64(st.KV.Free - st.KV.CachedFree))
	e.m.blocks.WithLabelValues("cached").Set(float64(st.KV.CachedFree))
}
