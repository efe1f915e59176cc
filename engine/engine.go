package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"pagoda/kvcache"
	"pagoda/model"
	"pagoda/sample"
	"pagoda/tokenizer"
)

// Forwarder is what the engine needs of a model: one forward pass over a
// flat batch, reading and writing K/V through kv. *model.Model satisfies it.
type Forwarder interface {
	Forward(b *model.Batch, kv model.KVCache) ([]float32, error)
}

// Config sets up an Engine. The shape fields come from the model's config.
type Config struct {
	ModelName string // the model_name label of the metrics

	NLayer, NKVHead, HeadDim int
	VocabSize, ContextLen    int

	BlockSize          int           // tokens per KV block; 0 = 16
	KVBlocks           int           // pool size; 0 = as many as KVBytes holds
	KVBytes            int64         // pool budget; 0 (and no KVBlocks) = room for MaxNumSeqs full contexts, at most 1 GiB
	KVDType            kvcache.DType // f16 by default
	DisablePrefixCache bool
	CacheSalt          uint64 // extra prefix-hash key: engines sharing nothing should differ
	// SlidingWindow is the model's attention window (model.Config's
	// SlidingWindow; 0 = full attention). With it, KV blocks that have
	// slid out of the window are released while a sequence runs, so one
	// sequence holds about SlidingWindow/BlockSize+1 blocks and may grow
	// past what the pool holds.
	SlidingWindow int

	MaxNumBatchedTokens int // token budget of one step; 0 = 512
	MaxNumSeqs          int // sequences in one step; 0 = 64
	MaxWaiting          int // requests queued before Submit says ErrQueueFull; 0 = 1024
	// LongPrefillThreshold caps the prefill tokens one request gets in a
	// step, so several long prompts advance together instead of queueing
	// behind the first (vLLM's long_prefill_token_threshold); 0 = off.
	LongPrefillThreshold int
	Static               bool // static batching baseline: a batch starts and finishes together

	Registry *prometheus.Registry // where the vllm:* metrics go; nil = nowhere
}

var (
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
	return fmt.Sprintf("engine: prompt of %d tokens + max_tokens %d = %d exceeds the %s of %d tokens",
		e.Prompt, e.MaxTokens, e.Prompt+e.MaxTokens, e.What, e.Limit)
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
}

// Engine runs requests with continuous batching. One goroutine (started by
// Start) owns the scheduler and the KV cache; Submit, Stats and Stop may be
// called from any goroutine.
type Engine struct {
	fw    Forwarder
	tok   tokenizer.Tokenizer
	vocab *tokenizer.Vocab
	cfg   Config
	kv    *kvcache.Cache
	m     *metrics

	mu       sync.Mutex
	inNew    []*request
	inCancel []*request
	stopping bool
	wake     chan struct{}
	queued   atomic.Int64

	startOnce, forceOnce sync.Once
	stopCh, forceCh      chan struct{}
	done                 chan struct{}
	stats                atomic.Pointer[Stats]

	// Owned by the loop goroutine.
	waiting, running []*sequence
	nextSeq          int32
	st               Stats
	batch            model.Batch
	scratch          []float32
}

type request struct {
	r         Request
	maxTokens int
	extra     uint64 // prefix-cache key: the engine's salt with the request's
	samplers  []tokenSampler
	stopAfter func() bool
	out       *outbox

	seqs       []*sequence
	forked     bool
	admitted   bool
	ended      bool
	done       int
	cached     int
	completion int
	arrival    time.Time
	firstTok   time.Time
}

type sequence struct {
	req         *request
	index       int
	id          int32
	tokens      []int32 // prompt then output
	numComputed int     // chases len(tokens)
	nOut        int
	sampler     tokenSampler
	text        *textOut
	lastTok     time.Time
	finished    bool
}

// New builds an engine and its KV cache; call Start to run it.
func New(fw Forwarder, tok tokenizer.Tokenizer, cfg Config) (*Engine, error) {
	if fw == nil || tok == nil {
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
	if cfg.MaxNumBatchedTokens < 0 || cfg.MaxNumSeqs < 0 || cfg.MaxWaiting < 0 || cfg.LongPrefillThreshold < 0 {
		return nil, fmt.Errorf("engine: negative limits: max_num_batched_tokens %d, max_num_seqs %d, max_waiting %d",
			cfg.MaxNumBatchedTokens, cfg.MaxNumSeqs, cfg.MaxWaiting)
	}
	if cfg.ModelName == "" {
		cfg.ModelName = "pagoda"
	}
	kcfg := kvcache.Config{
		NLayer: cfg.NLayer, NKVHead: cfg.NKVHead, HeadDim: cfg.HeadDim,
		BlockSize: cfg.BlockSize, NumBlocks: cfg.KVBlocks, Bytes: cfg.KVBytes,
		DType: cfg.KVDType, PrefixCache: !cfg.DisablePrefixCache, Window: cfg.SlidingWindow,
	}
	if kcfg.NumBlocks == 0 && kcfg.Bytes == 0 {
		per := kvcache.KVBytesPerToken(kvcache.Shape{NLayer: cfg.NLayer, NKVHead: cfg.NKVHead, HeadDim: cfg.HeadDim}, cfg.KVDType)
		kcfg.Bytes = min(per*int64(cfg.ContextLen+kvcache.DefaultBlockSize)*int64(cfg.MaxNumSeqs), 1<<30)
	}
	kv, err := kvcache.New(kcfg)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	m, err := newMetrics(cfg.Registry, cfg.ModelName)
	if err != nil {
		return nil, err
	}
	e := &Engine{
		fw: fw, tok: tok, vocab: tok.Vocab(), cfg: cfg, kv: kv, m: m,
		wake:   make(chan struct{}, 1),
		stopCh: make(chan struct{}), forceCh: make(chan struct{}), done: make(chan struct{}),
	}
	if e.vocab == nil {
		e.vocab = &tokenizer.Vocab{BOS: -1, EOS: -1, UNK: -1, PAD: -1, EOT: -1}
	}
	e.publish()
	return e, nil
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

// Stats returns the snapshot of the last step.
func (e *Engine) Stats() Stats { return *e.stats.Load() }

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
	if err := ctx.Err(); err != nil {
		return nil, err
	}
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
	go req.out.pump(ctx, out)
	e.poke()
	return out, nil
}

func (e *Engine) poke() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
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
	kvTokens := e.kv.Pool().NumBlocks() * e.kv.BlockSize()
	if peak := e.kv.MaxSeqBlocks(e.maxChunk()); peak > 0 && peak <= e.kv.Pool().NumBlocks() {
		// The window bounds what a sequence ever holds at once (the
		// largest chunk included), so only the context limits it.
		kvTokens = c.ContextLen
	}
	n := len(r.Prompt)
	switch {
	case r.MaxTokens == 0:
		limit, what := c.ContextLen, "context"
		if kvTokens < limit {
			limit, what = kvTokens, "KV cache"
		}
		if n >= limit {
			return nil, &TooLongError{Prompt: n, Limit: limit, What: what}
		}
		q.maxTokens = limit - n
	case n+r.MaxTokens > c.ContextLen:
		return nil, &TooLongError{Prompt: n, MaxTokens: r.MaxTokens, Limit: c.ContextLen, What: "context"}
	case n+r.MaxTokens > kvTokens:
		return nil, &TooLongError{Prompt: n, MaxTokens: r.MaxTokens, Limit: kvTokens, What: "KV cache"}
	default:
		q.maxTokens = r.MaxTokens
	}
	q.extra = kvcache.SaltKey(c.CacheSalt, r.CacheSalt)
	for i := 0; i < q.r.N; i++ {
		s, err := newSampler(r.Sampling, i)
		if err != nil {
			return nil, fmt.Errorf("engine: request %q: %w", r.ID, err)
		}
		q.samplers = append(q.samplers, s)
	}
	return q, nil
}

func (e *Engine) loop() {
	defer close(e.done)
	for {
		e.takeInbox()
		select {
		case <-e.forceCh:
			e.cancelAll()
			e.publish()
			return
		default:
		}
		if len(e.running) == 0 && len(e.waiting) == 0 {
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
	news, cancels := e.inNew, e.inCancel
	e.inNew, e.inCancel = nil, nil
	e.mu.Unlock()
	for _, r := range news {
		s := e.newSequence(r, 0, r.r.Prompt, 0)
		r.seqs = []*sequence{s}
		e.waiting = append(e.waiting, s)
	}
	for _, r := range cancels {
		e.endRequest(r, FinishCancelled, nil)
	}
}

func (e *Engine) newSequence(r *request, index int, tokens []int32, computed int) *sequence {
	s := &sequence{
		req: r, index: index, id: e.nextSeq,
		tokens:      append(make([]int32, 0, len(tokens)+16), tokens...),
		numComputed: computed,
		sampler:     r.samplers[index],
		text:        newTextOut(e.tok, r.r.Prompt, r.r.StopStrings),
	}
	e.nextSeq++
	return s
}

// scheduled is one sequence's share of a step: tokens
// [numComputed, numComputed+n).
type scheduled struct {
	s *sequence
	n int
}

// schedule picks this step's work within the token budget and the
// sequence cap, allocating KV blocks. Decodes go first so a long prefill
// (chunked to what the budget leaves) never stalls them; then running
// prefills; then waiting requests in arrival order, unless a preemption
// happened this step. When blocks run out, the newest running sequence is
// preempted by recompute: its blocks are freed and it goes back to the
// front of the waiting queue.
func (e *Engine) schedule() []scheduled {
	budget := e.cfg.MaxNumBatchedTokens
	var out []scheduled
	picked := map[*sequence]bool{}
	preempted := false
	runningAtStart := len(e.running)

	order := make([]*sequence, 0, len(e.running))
	for _, s := range e.running {
		if len(s.tokens)-s.numComputed == 1 {
			order = append(order, s)
		}
	}
	for _, s := range e.running {
		if len(s.tokens)-s.numComputed > 1 {
			order = append(order, s)
		}
	}
	for _, s := range order {
		if budget == 0 {
			break
		}
		if s.finished || !e.isRunning(s) {
			continue // preempted as a victim earlier in this loop
		}
		n := e.chunk(len(s.tokens)-s.numComputed, budget)
		if n <= 0 {
			continue // nothing to compute; cannot happen while the invariant holds
		}
		for !e.kv.CanAllocate(s.id, nil, s.numComputed, s.numComputed+n) {
			v := e.victim(picked)
			e.preempt(v)
			preempted = true
			if v == s {
				break
			}
		}
		if !e.isRunning(s) {
			continue
		}
		e.kv.Allocate(s.id, nil, s.numComputed, s.numComputed+n)
		out = append(out, scheduled{s, n})
		picked[s] = true
		budget -= n
	}
	if preempted || (e.cfg.Static && runningAtStart > 0) {
		return out
	}
	for len(e.waiting) > 0 && budget > 0 {
		s := e.waiting[0]
		seats := 1
		if !s.req.forked {
			seats = s.req.r.N
		}
		if len(e.running)+seats > e.cfg.MaxNumSeqs {
			break
		}
		var hit []int32
		if s.numComputed == 0 {
			hit = e.kv.Lookup(s.tokens, s.req.extra)
		}
		from := len(hit) * e.kv.BlockSize()
		n := e.chunk(len(s.tokens)-from, budget)
		if !e.kv.Allocate(s.id, hit, from, from+n) {
			break
		}
		s.numComputed = from
		if !s.req.admitted {
			s.req.admitted = true
			s.req.cached = from
			e.queued.Add(-1)
			e.kv.RecordPrefixQuery(len(s.tokens), from)
			e.m.prefixQueries.Add(float64(len(s.tokens)))
			e.m.prefixHits.Add(float64(from))
		}
		e.waiting = e.waiting[1:]
		e.running = append(e.running, s)
		out = append(out, scheduled{s, n})
		picked[s] = true
		budget -= n
	}
	return out
}

// maxChunk is the most tokens one sequence computes in a step.
func (e *Engine) maxChunk() int {
	n := e.cfg.MaxNumBatchedTokens
	if t := e.cfg.LongPrefillThreshold; t > 0 && t < n {
		n = t
	}
	return n
}

// chunk is how many of a sequence's remaining tokens fit this step.
func (e *Engine) chunk(remaining, budget int) int {
	n := min(remaining, budget)
	if t := e.cfg.LongPrefillThreshold; t > 0 && n > t {
		n = t
	}
	return n
}

func (e *Engine) isRunning(s *sequence) bool {
	for _, r := range e.running {
		if r == s {
			return true
		}
	}
	return false
}

// victim is the newest running sequence not yet given work this step.
func (e *Engine) victim(picked map[*sequence]bool) *sequence {
	for i := len(e.running) - 1; i >= 0; i-- {
		if !picked[e.running[i]] {
			return e.running[i]
		}
	}
	panic("engine: no sequence to preempt")
}

func (e *Engine) preempt(s *sequence) {
	e.kv.Free(s.id)
	s.numComputed = 0
	e.removeRunning(s)
	e.waiting = append([]*sequence{s}, e.waiting...)
	e.st.Preemptions++
	e.m.preemptions.Inc()
}

func (e *Engine) removeRunning(s *sequence) {
	for i, r := range e.running {
		if r == s {
			e.running = append(e.running[:i], e.running[i+1:]...)
			return
		}
	}
}

func (e *Engine) removeWaiting(s *sequence) {
	for i, r := range e.waiting {
		if r == s {
			e.waiting = append(e.waiting[:i], e.waiting[i+1:]...)
			return
		}
	}
}

// step runs one scheduled batch through the model; false when there was
// nothing to run.
func (e *Engine) step() bool {
	work := e.schedule()
	if len(work) == 0 {
		return false
	}
	b := &e.batch
	b.Tokens, b.Pos, b.Seq, b.Logits = b.Tokens[:0], b.Pos[:0], b.Seq[:0], b.Logits[:0]
	rows := 0
	for _, w := range work {
		s := w.s
		for i := 0; i < w.n; i++ {
			p := s.numComputed + i
			b.Tokens = append(b.Tokens, s.tokens[p])
			b.Pos = append(b.Pos, int32(p))
			b.Seq = append(b.Seq, s.id)
			last := i == w.n-1 && p+1 == len(s.tokens)
			b.Logits = append(b.Logits, last)
			if last {
				rows++
			}
		}
	}
	e.st.Steps++
	e.st.BatchedTokens += uint64(len(b.Tokens))
	logits, err := e.fw.Forward(b, e.kv)
	if err == nil && len(logits) != rows*e.cfg.VocabSize {
		err = fmt.Errorf("engine: model returned %d logits for %d rows of %d", len(logits), rows, e.cfg.VocabSize)
	}
	if err != nil {
		for _, w := range work {
			if !w.s.req.ended {
				e.endRequest(w.s.req, FinishError, fmt.Errorf("engine: forward pass: %w", err))
			}
		}
		return true
	}
	now := time.Now()
	row := 0
	V := e.cfg.VocabSize
	for _, w := range work {
		s := w.s
		s.numComputed += w.n
		e.kv.Commit(s.id, s.tokens, s.numComputed, s.req.extra)
		if s.numComputed < len(s.tokens) {
			continue
		}
		lg := logits[row*V : (row+1)*V]
		row++
		e.onLogits(s, lg, now)
	}
	e.compactRunning()
	return true
}

func (e *Engine) compactRunning() {
	k := 0
	for _, s := range e.running {
		if !s.finished {
			e.running[k] = s
			k++
		}
	}
	clear(e.running[k:])
	e.running = e.running[:k]
}

// onLogits samples the next token of s; the first sample of a request with
// N > 1 forks the other completions off the prompt's blocks.
func (e *Engine) onLogits(s *sequence, lg []float32, now time.Time) {
	r := s.req
	if r.r.N > 1 && !r.forked {
		r.forked = true
		for i := 1; i < r.r.N; i++ {
			c := e.newSequence(r, i, s.tokens, s.numComputed)
			if err := e.kv.Fork(s.id, c.id); err != nil {
				panic(err) // s is running, so it has blocks
			}
			r.seqs = append(r.seqs, c)
			e.running = append(e.running, c)
		}
		base := append([]float32(nil), lg...)
		for _, c := range r.seqs {
			if c.finished {
				continue
			}
			buf := append(make([]float32, 0, len(base)), base...)
			e.sampleOne(c, buf, now)
		}
		return
	}
	e.sampleOne(s, lg, now)
}

func (e *Engine) sampleOne(s *sequence, lg []float32, now time.Time) {
	r := s.req
	// Logprobs are of the raw model distribution (as vLLM reports them),
	// taken before Sample edits the logits in place.
	var lp float32
	var top []TokenLogprob
	want := r.r.Logprobs || r.r.TopLogprobs > 0
	if want {
		e.scratch = append(e.scratch[:0], lg...)
		top = topLogprobs(e.scratch, r.r.TopLogprobs)
	}
	tok := s.sampler.Sample(lg, s.tokens)
	if want {
		lp = sample.Logprob(e.scratch, tok)
	}
	s.tokens = append(s.tokens, tok)
	s.nOut++
	r.completion++
	e.st.GenerationTokens++
	e.m.genTokens.Inc()
	if r.firstTok.IsZero() {
		r.firstTok = now
		e.m.ttft.Observe(now.Sub(r.arrival).Seconds())
		e.st.PromptTokens += uint64(len(r.r.Prompt))
		e.m.promptTokens.Add(float64(len(r.r.Prompt)))
	} else if !s.lastTok.IsZero() {
		e.m.itl.Observe(now.Sub(s.lastTok).Seconds())
	}
	s.lastTok = now

	ev := Event{Index: s.index, Tokens: []int32{tok}}
	if want {
		ev.Logprob = []float32{lp}
		if r.r.TopLogprobs > 0 {
			ev.Top = [][]TokenLogprob{top}
		}
	}
	finish := FinishNone
	if !r.r.IgnoreEOS && e.vocab.IsEOG(tok) {
		finish = FinishStop
	}
	for _, st := range r.r.StopTokens {
		if tok == st {
			finish = FinishStop
		}
	}
	if finish == FinishNone {
		text, stopped := s.text.add(tok)
		ev.Text = text
		switch {
		case stopped:
			finish = FinishStop
		case s.nOut >= r.maxTokens || len(s.tokens) >= e.cfg.ContextLen:
			finish = FinishLength
			ev.Text += s.text.flush()
		}
	} else {
		ev.Text = s.text.flush()
	}
	if finish == FinishNone {
		r.out.push(ev, false)
		return
	}
	ev.Finish = finish
	e.finishSeq(s, ev)
}

// finishSeq ends one completion with its final event ev, freeing its
// blocks; the last completion of the request ends the request.
func (e *Engine) finishSeq(s *sequence, ev Event) {
	r := s.req
	s.finished = true
	e.kv.Free(s.id)
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
			s.finished = true
			e.kv.Free(s.id)
			e.removeRunning(s)
			e.removeWaiting(s)
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
}

func (e *Engine) cancelAll() {
	for len(e.running) > 0 {
		e.endRequest(e.running[0].req, FinishCancelled, nil)
	}
	for len(e.waiting) > 0 {
		e.endRequest(e.waiting[0].req, FinishCancelled, nil)
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
	st := e.st
	reqs := map[*request]bool{}
	for _, s := range e.running {
		reqs[s.req] = true
	}
	st.Running, st.RunningSeqs = len(reqs), len(e.running)
	st.Waiting = int(e.queued.Load())
	for _, s := range e.waiting {
		if s.req.admitted && !reqs[s.req] { // preempted: waits again
			reqs[s.req] = true
			st.Waiting++
		}
	}
	st.KV = e.kv.Usage()
	st.KVUsage = st.KV.UsedFrac()
	st.PrefixQueries, st.PrefixHits = e.kv.Pool().Queries, e.kv.Pool().Hits
	e.stats.Store(&st)
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
