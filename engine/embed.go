package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"pagoda/encoder"
)

// HiddenRunner is what the embedder needs of a model: run whole sequences
// from position 0 in one pass and return each one's final hidden states.
// *model.Model (a decoder, through a pass with its own cache) and
// *encoder.Model (a BERT-family encoder) both are.
type HiddenRunner interface {
	SequenceHidden(seqs [][]int32) ([][]float32, error)
}

// EmbedConfig configures an Embedder.
type EmbedConfig struct {
	// Dim is the model's hidden width, ContextLen the most tokens one
	// input may have.
	Dim, ContextLen int
	// Pooling is the file's pooling type ("mean", "cls", "last"); "" means
	// the file does not say, and a decoder then pools by its last token
	// (DefaultDecoderPooling), the one state that has seen the whole input.
	Pooling string
	// MaxBatchTokens caps the tokens of one forward pass (0: 4096, at
	// least ContextLen). Inputs are never split across passes.
	MaxBatchTokens int
}

// DefaultDecoderPooling is the pooling of a decoder whose file has no
// pooling_type.
const DefaultDecoderPooling = "last"

// Embedder computes embeddings. Concurrent Embed calls are gathered into
// one forward pass (up to MaxBatchTokens) by a single goroutine, so
// requests share passes the way the engine's steps share generation; a
// model that also serves generation is shared under the model's own lock.
type Embedder struct {
	m       HiddenRunner
	cfg     EmbedConfig
	pooling encoder.Pooling
	in      chan *embedJob
	done    chan struct{}
	wg      sync.WaitGroup
	once    sync.Once
}

type embedJob struct {
	ctx    context.Context
	inputs [][]int32
	out    chan embedResult
}

type embedResult struct {
	vecs [][]float32
	err  error
}

// NewEmbedder starts an embedder over m; Close stops it.
func NewEmbedder(m HiddenRunner, cfg EmbedConfig) (*Embedder, error) {
	if m == nil || cfg.Dim <= 0 || cfg.ContextLen <= 0 {
		return nil, errors.New("engine: embedder needs a model, its width and its context length")
	}
	name := cfg.Pooling
	if name == "" {
		name = DefaultDecoderPooling
	}
	p, err := encoder.ParsePooling(name)
	if err != nil || p == encoder.PoolNone {
		return nil, fmt.Errorf("engine: the model's pooling %q gives no sequence embedding (want mean, cls or last)", name)
	}
	cfg.Pooling = name
	if cfg.MaxBatchTokens <= 0 {
		cfg.MaxBatchTokens = 4096
	}
	cfg.MaxBatchTokens = max(cfg.MaxBatchTokens, cfg.ContextLen)
	e := &Embedder{m: m, cfg: cfg, pooling: p, in: make(chan *embedJob), done: make(chan struct{})}
	e.wg.Add(1)
	go e.loop()
	return e, nil
}

// Dim is the width of the embeddings.
func (e *Embedder) Dim() int { return e.cfg.Dim }

// ContextLen is the most tokens one input may have.
func (e *Embedder) ContextLen() int { return e.cfg.ContextLen }

// Pooling is the pooling in use.
func (e *Embedder) Pooling() string { return e.cfg.Pooling }

// Close stops the embedder; calls after it fail.
func (e *Embedder) Close() {
	e.once.Do(func() { close(e.done) })
	e.wg.Wait()
}

// ErrEmbedderClosed is returned by Embed after Close.
var ErrEmbedderClosed = errors.New("engine: embedder closed")

// Embed returns one pooled, unnormalized vector per input. An empty input
// or one longer than ContextLen is an error.
func (e *Embedder) Embed(ctx context.Context, inputs [][]int32) ([][]float32, error) {
	if len(inputs) == 0 {
		return nil, errors.New("engine: no input to embed")
	}
	for i, s := range inputs {
		if len(s) == 0 {
			return nil, fmt.Errorf("engine: input %d is empty", i)
		}
		if len(s) > e.cfg.ContextLen {
			return nil, fmt.Errorf("engine: input %d has %d tokens, more than the model's context of %d", i, len(s), e.cfg.ContextLen)
		}
	}
	j := &embedJob{ctx: ctx, inputs: inputs, out: make(chan embedResult, 1)}
	select {
	case e.in <- j:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-e.done:
		return nil, ErrEmbedderClosed
	}
	select {
	case r := <-j.out:
		return r.vecs, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (e *Embedder) loop() {
	defer e.wg.Done()
	for {
		var jobs []*embedJob
		select {
		case j := <-e.in:
			jobs = append(jobs, j)
		case <-e.done:
			return
		}
		// Gather whatever else is waiting into the same passes.
	gather:
		for {
			select {
			case j := <-e.in:
				jobs = append(jobs, j)
			default:
				break gather
			}
		}
		e.run(jobs)
	}
}

// run computes the jobs' inputs in passes of at most MaxBatchTokens
// tokens, in arrival order, and answers each job.
func (e *Embedder) run(jobs []*embedJob) {
	type item struct{ job, idx int }
	var items []item
	res := make([]embedResult, len(jobs))
	for ji, j := range jobs {
		if j.ctx.Err() != nil {
			res[ji].err = j.ctx.Err()
			continue
		}
		res[ji].vecs = make([][]float32, len(j.inputs))
		for i := range j.inputs {
			items = append(items, item{ji, i})
		}
	}
	for lo := 0; lo < len(items); {
		hi, toks := lo, 0
		for hi < len(items) {
			n := len(jobs[items[hi].job].inputs[items[hi].idx])
			if hi > lo && toks+n > e.cfg.MaxBatchTokens {
				break
			}
			toks += n
			hi++
		}
		seqs := make([][]int32, 0, hi-lo)
		for _, it := range items[lo:hi] {
			seqs = append(seqs, jobs[it.job].inputs[it.idx])
		}
		hs, err := e.m.SequenceHidden(seqs)
		for k, it := range items[lo:hi] {
			r := &res[it.job]
			if r.err != nil {
				continue
			}
			if err != nil {
				r.err = err
				continue
			}
			r.vecs[it.idx], r.err = encoder.Pool(e.pooling, hs[k], len(seqs[k]), e.cfg.Dim)
		}
		lo = hi
	}
	for ji, j := range jobs {
		if res[ji].err != nil {
			res[ji].vecs = nil
		}
		j.out <- res[ji]
	}
}
