package eval

import (
	"errors"
	"fmt"
	"math"
	"time"

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
}

// Report is a whole run.
type Report struct {
	Tokens       int      `json:"tokens"`
	Segments     int      `json:"segments"`
	Chunk        int      `json:"chunk"`
	RefTokPerSec float64  `json:"ref_tokens_per_sec"`
	RefBytesTok  float64  `json:"ref_bytes_per_token"`
	Results      []Result `json:"results"`
}

// run is one cache being evaluated.
type run struct {
	cfg   Config
	cache *kvcache.Cache
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
	if len(tokens) < 2 {
		return nil, fmt.Errorf("eval: need at least two tokens, got %d", len(tokens))
	}
	for _, t := range tokens {
		if t < 0 || int(t) >= c.VocabSize {
			return nil, fmt.Errorf("eval: token %d outside the vocabulary of %d", t, c.VocabSize)
		}
	}
	runs := make([]*run, 0, len(cfgs)+1)
	for _, cf := range append([]Config{exact}, cfgs...) {
		r := &run{cfg: cf, lsm: make([]float32, c.VocabSize)}
		r.res.Name = cf.Name
		r.res.KFormat, r.res.VFormat = fmtName(cf.Setup.KFormat), fmtName(cf.Setup.VFormat)
		runs = append(runs, r)
	}
	rep := &Report{Tokens: len(tokens), Chunk: o.Chunk}
	total := len(tokens) * len(runs)
	done := 0
	ref := make([]float32, c.VocabSize)
	for lo := 0; lo < len(tokens); lo += o.Segment {
		seg := tokens[lo:min(lo+o.Segment, len(tokens))]
		if len(seg) < 2 {
			break
		}
		rep.Segments++
		for _, r := range runs {
			if err := r.open(c, len(seg)); err != nil {
				return nil, fmt.Errorf("eval: %s: %w", r.cfg.Name, err)
			}
		}
		for p := 0; p < len(seg); p += o.Chunk {
			q := min(p+o.Chunk, len(seg))
			b := &model.Batch{Tokens: seg[p:q], Pos: make([]int32, q-p), Seq: make([]int32, q-p), Logits: make([]bool, q-p)}
			for i := range b.Pos {
				b.Pos[i], b.Logits[i] = int32(p+i), true
			}
			var refLogits []float32
			for ri, r := range runs {
				logits, err := r.step(m, b, seg, q)
				if err != nil {
					return nil, fmt.Errorf("eval: %s: %w", r.cfg.Name, err)
				}
				if ri == 0 {
					refLogits = append(refLogits[:0], logits...)
				}
				for i := p; i < q && i+1 < len(seg); i++ {
					row := logits[(i-p)*c.VocabSize : (i-p+1)*c.VocabSize]
					sample.LogSoftmax(row, r.lsm)
					r.nll -= float64(r.lsm[seg[i+1]])
					r.res.Positions++
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
		}
	}
	for _, r := range runs {
		r.finish()
	}
	rep.RefTokPerSec, rep.RefBytesTok = runs[0].res.TokensPerSec, runs[0].res.BytesPerToken
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
	cache, err := kvcache.New(kvcache.Config{
		NLayer: c.NLayer, NKVHead: c.NKVHead, HeadDim: c.HeadDim, BlockSize: bs,
		NumBlocks: (n+bs-1)/bs + 1, DType: kvcache.F32, KFormat: kf, VFormat: vf,
		Window: c.SlidingWindow, Groups: policyGroups(c, s.Policy),
		Rope: &kvcache.Rotary{Freqs: c.Freqs(), Neox: c.RopeNeox, HeadDim: c.HeadDim},
	})
	if err != nil {
		return err
	}
	r.cache, r.bs = cache, cache.BlockSize()
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
func (r *run) step(m *model.Model, b *model.Batch, seg []int32, q int) ([]float32, error) {
	p := int(b.Pos[0])
	if !r.cache.Allocate(0, nil, p, q) {
		return nil, fmt.Errorf("cache full at position %d", p)
	}
	t0 := time.Now()
	logits, err := m.Forward(b, r.cache)
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

func (r *run) finish() {
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
