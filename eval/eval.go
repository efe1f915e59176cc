package eval

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"pagoda/executor"
	"pagoda/kvcache"
	"pagoda/model"
	"pagoda/sample"
)

// Options steer a run.
type Options struct {
	// Chunk is the tokens per forward pass (default 1: every token sees
	// the cache as it would while generating).
	Chunk int
	// Segment is the tokens evaluated on one fresh cache (default the
	// model's context length); a longer stream is cut into segments.
	Segment int
	// Prefill, when positive, makes the first Prefill tokens of every
	// segment one forward pass (the prompt: every cache is told its length,
	// so SnapKV compresses it when the pass commits); the rest are
	// teacher-forced Chunk at a time. Only the predictions of the tokens
	// after the prompt are measured (rows Prefill-1 on), so every policy
	// is scored on what it decodes after its prompt handling.
	Prefill int
	// PerPosition keeps every measured position's negative log-likelihood
	// (Result.NLL, Report.RefNLL), for plots against position.
	PerPosition bool
	// SinkTokens, when positive, measures on the exact cache the attention
	// mass queries put on the first SinkTokens positions (Report.Sinks).
	SinkTokens int
	// SinkFrom is the first query position counted for Sinks (default 64).
	SinkFrom int
	// Progress, when set, is called after every step with the tokens
	// done and the total, summed over the exact run and every config.
	Progress func(done, total int)
}

// Result is one configuration's measurements against the exact cache.
type Result struct {
	Name      string  `json:"name"`
	KFormat   string  `json:"k_format"`
	VFormat   string  `json:"v_format"`
	Positions int     `json:"positions"` // next-token predictions compared
	KLMean    float64 `json:"kl_mean"`   // mean KL(exact ‖ config), nats
	KLMax     float64 `json:"kl_max"`
	Top1      float64 `json:"top1"`    // fraction of positions whose argmax agrees
	PPL       float64 `json:"ppl"`     // perplexity of the text under the config
	RefPPL    float64 `json:"ref_ppl"` // under the exact cache
	DeltaPPL  float64 `json:"delta_ppl"`
	// KV bytes held (pool blocks, scales, residual windows) measured
	// after every step: BytesPerToken is their sum over the steps divided
	// by the tokens cached, summed likewise (a time-weighted mean with
	// partly filled blocks counted); PeakBytes is the most held at once.
	BytesPerToken float64 `json:"bytes_per_token"`
	PeakBytes     int64   `json:"peak_bytes"`
	TokensPerSec  float64 `json:"tokens_per_sec"` // forward passes over this config's cache
	// Budget and Series are the configuration's Setup.Budget and series
	// label (Setup.Series, else Name), for plots.
	Budget int    `json:"budget,omitempty"`
	Series string `json:"series,omitempty"`
	// NLL is, with Options.PerPosition, the negative log-likelihood of
	// every measured position in order (segments concatenated).
	NLL []float64 `json:"nll,omitempty"`
}

// SinkMass is the attention the exact cache's queries at SinkFrom and
// later put on the first Tokens positions, per layer: the mean over
// queries and heads of the summed weight, against Uniform, the same mean
// if every query spread its attention evenly over what it sees.
type SinkMass struct {
	Tokens  int       `json:"tokens"`
	From    int       `json:"from"`
	Mass    []float64 `json:"mass"`
	Uniform float64   `json:"uniform"`
}

// Report is a whole run.
type Report struct {
	Tokens       int       `json:"tokens"`
	Segments     int       `json:"segments"`
	Segment      int       `json:"segment"` // tokens per segment (the last may be shorter)
	Chunk        int       `json:"chunk"`
	Prefill      int       `json:"prefill,omitempty"`
	RefTokPerSec float64   `json:"ref_tokens_per_sec"`
	RefBytesTok  float64   `json:"ref_bytes_per_token"`
	Results      []Result  `json:"results"`
	RefNLL       []float64 `json:"ref_nll,omitempty"` // with Options.PerPosition
	Sinks        *SinkMass `json:"sinks,omitempty"`   // with Options.SinkTokens
}

// run is one cache being evaluated.
type run struct {
	cfg   Config
	cache *kvcache.Cache
	ex    *executor.Local // the model over cache
	bs    int
	res   Result
	// accumulators
	nll, kl float64
	agree   int
	held    float64 // Σ bytes held over the steps
	cached  float64 // Σ tokens cached over the steps
	elapsed time.Duration
	fwd     int // tokens through the model
	lsm     []float32
	m       *model.Model
}

// sinkObserver is the full cache, noting the attention weight on the
// first k positions of queries at from and later, per layer.
type sinkObserver struct {
	kvcache.FullPolicy
	k, from int
	mu      sync.Mutex
	mass, n []float64
	uni, nq float64
}

// ObserveScores implements kvcache.ScoreObserver.
func (s *sinkObserver) ObserveScores(layer int, _ int32, pos, _ int, spans []kvcache.Span, w []float32) {
	if pos < s.from || layer >= len(s.mass) {
		return
	}
	var m float64
	seen, i := 0, 0
	for _, sp := range spans {
		seen += sp.To - sp.From
		for t := sp.From; t < sp.To; t, i = t+1, i+1 {
			if t < s.k {
				m += float64(w[i])
			}
		}
	}
	s.mu.Lock()
	s.mass[layer] += m
	s.n[layer]++
	s.uni += float64(min(s.k, seen)) / float64(seen)
	s.nq++
	s.mu.Unlock()
}

func (s *sinkObserver) result() *SinkMass {
	r := &SinkMass{Tokens: s.k, From: s.from, Mass: make([]float64, len(s.mass))}
	for l := range s.mass {
		if s.n[l] > 0 {
			r.Mass[l] = s.mass[l] / s.n[l]
		}
	}
	if s.nq > 0 {
		r.Uniform = s.uni / s.nq
	}
	return r
}

// exact is the reference: f32 K and V, every position attended.
var exact = Config{Name: "exact (f32)"}

// Run evaluates tokens on m under every configuration of cfgs.
func Run(m *model.Model, tokens []int32, cfgs []Config, o Options) (*Report, error) {
	c := &m.Config
	if len(cfgs) == 0 {
		return nil, errors.New("eval: no KV configuration to evaluate")
	}
	if o.Chunk <= 0 {
		o.Chunk = 1
	}
	if o.Segment <= 0 || o.Segment > c.ContextLen {
		o.Segment = c.ContextLen
	}
	if o.Segment < 2 {
		return nil, fmt.Errorf("eval: segments of %d token(s) predict nothing; want at least 2", o.Segment)
	}
	if len(tokens) < 2 {
		return nil, fmt.Errorf("eval: need at least two tokens, got %d", len(tokens))
	}
	if o.Prefill < 0 || o.Prefill >= o.Segment || o.Prefill >= len(tokens) {
		return nil, fmt.Errorf("eval: a prompt of %d tokens leaves nothing to measure in segments of %d (%d tokens)", o.Prefill, min(o.Segment, len(tokens)), len(tokens))
	}
	if o.SinkFrom <= 0 {
		o.SinkFrom = 64
	}
	for _, t := range tokens {
		if t < 0 || int(t) >= c.VocabSize {
			return nil, fmt.Errorf("eval: token %d outside the vocabulary of %d", t, c.VocabSize)
		}
	}
	runs := make([]*run, 0, len(cfgs)+1)
	ref0 := exact
	var sinks *sinkObserver
	if o.SinkTokens > 0 {
		sinks = &sinkObserver{k: o.SinkTokens, from: o.SinkFrom, mass: make([]float64, c.NLayer), n: make([]float64, c.NLayer)}
		ref0.Setup.Policy = func() kvcache.Policy { return sinks }
	}
	for _, cf := range append([]Config{ref0}, cfgs...) {
		r := &run{cfg: cf, lsm: make([]float32, c.VocabSize), m: m}
		r.res.Name, r.res.Budget, r.res.Series = cf.Name, cf.Setup.Budget, cmp.Or(cf.Setup.Series, cf.Name)
		r.res.KFormat, r.res.VFormat = fmtName(cf.Setup.KFormat), fmtName(cf.Setup.VFormat)
		runs = append(runs, r)
	}
	rep := &Report{Tokens: len(tokens), Chunk: o.Chunk, Prefill: o.Prefill, Segment: o.Segment}
	total := len(tokens) * len(runs)
	done := 0
	ref := make([]float32, c.VocabSize)
	for lo := 0; lo < len(tokens); lo += o.Segment {
		seg := tokens[lo:min(lo+o.Segment, len(tokens))]
		if len(seg) < 2 || len(seg) <= o.Prefill {
			break // a last segment too short to measure after its prompt
		}
		rep.Segments++
		for _, r := range runs {
			if err := r.open(c, len(seg)); err != nil {
				return nil, fmt.Errorf("eval: %s: %w", r.cfg.Name, err)
			}
			if o.Prefill > 0 {
				r.cache.NotePrompt(0, o.Prefill)
			}
		}
		for p := 0; p < len(seg); {
			q := min(p+o.Chunk, len(seg))
			if p == 0 && o.Prefill > 0 {
				q = o.Prefill
			}
			b := &executor.StepInput{Tokens: seg[p:q], Pos: make([]int32, q-p), Seq: make([]int32, q-p), Logits: make([]bool, q-p)}
			for i := range b.Pos {
				b.Pos[i], b.Logits[i] = int32(p+i), true
			}
			var refLogits []float32
			for ri, r := range runs {
				logits, err := r.step(b, seg, q)
				if err != nil {
					return nil, fmt.Errorf("eval: %s: %w", r.cfg.Name, err)
				}
				if ri == 0 {
					refLogits = append(refLogits[:0], logits...)
				}
				for i := max(p, o.Prefill-1); i < q && i+1 < len(seg); i++ {
					row := logits[(i-p)*c.VocabSize : (i-p+1)*c.VocabSize]
					sample.LogSoftmax(row, r.lsm)
					nll := -float64(r.lsm[seg[i+1]])
					r.nll += nll
					r.res.Positions++
					if o.PerPosition {
						r.res.NLL = append(r.res.NLL, nll)
					}
					if ri == 0 {
						continue
					}
					sample.LogSoftmax(refLogits[(i-p)*c.VocabSize:(i-p+1)*c.VocabSize], ref)
					kl := klDiv(ref, r.lsm)
					r.kl += kl
					r.res.KLMax = max(r.res.KLMax, kl)
					if argmax(ref) == argmax(r.lsm) {
						r.agree++
					}
				}
				done += q - p
				if o.Progress != nil {
					o.Progress(done, total)
				}
			}
			p = q
		}
	}
	if rep.Segments == 0 {
		return nil, fmt.Errorf("eval: no segment of %d tokens left anything to measure", o.Segment)
	}
	for _, r := range runs {
		r.finish()
	}
	rep.RefTokPerSec, rep.RefBytesTok = runs[0].res.TokensPerSec, runs[0].res.BytesPerToken
	rep.RefNLL = runs[0].res.NLL
	if sinks != nil {
		rep.Sinks = sinks.result()
	}
	for _, r := range runs[1:] {
		r.res.RefPPL = runs[0].res.PPL
		r.res.DeltaPPL = r.res.PPL - r.res.RefPPL
		rep.Results = append(rep.Results, r.res)
	}
	return rep, nil
}

func fmtName(f kvcache.Format) string {
	if f == nil {
		return kvcache.F32.String()
	}
	return f.String()
}

// open makes a fresh cache for a segment of n tokens.
func (r *run) open(c *model.Config, n int) error {
	s := r.cfg.Setup
	kf, vf := s.KFormat, s.VFormat
	if kf == nil {
		kf = kvcache.F32
	}
	if vf == nil {
		vf = kvcache.F32
	}
	bs := s.BlockSize
	if bs == 0 {
		bs = max(kvcache.FormatBlockSize(kf), kvcache.FormatBlockSize(vf))
	}
	cfg := kvcache.Config{
		NLayer: c.NLayer, NKVHead: c.NKVHead, HeadDim: c.HeadDim, BlockSize: bs,
		NumBlocks: (n+bs-1)/bs + 1, DType: kvcache.F32, KFormat: kf, VFormat: vf,
		Window: c.SlidingWindow, Groups: policyGroups(c, s.Policy),
		Rope: &kvcache.Rotary{Freqs: c.Freqs(), Neox: c.RopeNeox, HeadDim: c.HeadDim},
	}
	if s.Layout != nil {
		if err := s.Layout(r.m, &cfg); err != nil {
			return err
		}
	}
	cache, err := kvcache.New(cfg)
	if err != nil {
		return err
	}
	r.close()
	r.cache, r.bs = cache, cache.BlockSize()
	r.ex = executor.NewLocal(r.m, cache)
	return nil
}

// policyGroups is the one layer group carrying policy, or none (the
// cache's default) when there is no policy.
func policyGroups(c *model.Config, newPolicy func() kvcache.Policy) []kvcache.GroupSpec {
	if newPolicy == nil {
		return nil
	}
	p := newPolicy()
	layers := make([]int, c.NLayer)
	for i := range layers {
		layers[i] = i
	}
	return []kvcache.GroupSpec{{Layers: layers, NKVHead: c.NKVHead, KDim: c.HeadDim, VDim: c.HeadDim, Policy: p}}
}

// step allocates, runs b and commits; q is the tokens computed after it.
func (r *run) step(b *executor.StepInput, seg []int32, q int) ([]float32, error) {
	p := int(b.Pos[0])
	if !r.cache.Allocate(0, nil, p, q) {
		return nil, fmt.Errorf("cache full at position %d", p)
	}
	t0 := time.Now()
	out, err := r.ex.Execute(b)
	logits := out.Logits
	r.elapsed += time.Since(t0)
	r.fwd += len(b.Tokens)
	if err != nil {
		return nil, err
	}
	r.cache.Commit(0, seg, q, 0)
	if q == len(seg) {
		defer r.cache.Free(0)
	}
	u := r.cache.Usage()
	held := int64(u.Used)*r.cache.Config().BlockBytes() + r.cache.ExtraBytes()
	r.res.PeakBytes = max(r.res.PeakBytes, held)
	r.held += float64(held)
	r.cached += float64(q)
	return logits, nil
}

// close releases the last segment's KV pages.
func (r *run) close() {
	if r.cache != nil {
		r.cache.Close()
		r.cache = nil
	}
}

func (r *run) finish() {
	r.close()
	n := float64(r.res.Positions)
	if n > 0 {
		r.res.PPL = math.Exp(r.nll / n)
		r.res.KLMean = r.kl / n
		r.res.Top1 = float64(r.agree) / n
	}
	if r.cached > 0 {
		r.res.BytesPerToken = r.held / r.cached
	}
	if s := r.elapsed.Seconds(); s > 0 {
		r.res.TokensPerSec = float64(r.fwd) / s
	}
}

// klDiv is KL(p‖q) = Σ p (log p − log q) from log-probabilities, in
// float64; terms with p = 0 add nothing.
func klDiv(lp, lq []float32) float64 {
	var s float64
	for i, a := range lp {
		if math.IsInf(float64(a), -1) {
			continue
		}
		pa := math.Exp(float64(a))
		s += pa * (float64(a) - float64(lq[i]))
	}
	return max(s, 0)
}

func argmax(x []float32) int {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return best
}
