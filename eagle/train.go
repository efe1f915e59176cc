package eagle

import (
	"context"
	"fmt"
	"math"
	"time"

	"pagoda/model"
	"pagoda/quant"
	"pagoda/train"
)

// Data is self-distillation data: sequences the target sampled and the
// target's features (model.Batch.Hidden) at every position of each.
type Data struct {
	Seqs  [][]int32
	Feats [][]float32
}

// Tokens counts the data's tokens.
func (d *Data) Tokens() int64 {
	var n int64
	for _, s := range d.Seqs {
		n += int64(len(s))
	}
	return n
}

// Sample draws n sequences of up to length tokens from the target at
// temperature temp (each from BOS, or from a first token of the target's
// own choosing when there is none), and computes their features.
func Sample(ctx context.Context, target *model.Model, n, length int, temp float32, seed uint64, progress func(done int)) (*Data, error) {
	bos := int32(-1)
	if tk := target.Tokenizer(); tk != nil {
		bos = tk.Vocab().BOS
	}
	if bos < 0 {
		bos = 0
	}
	data := &Data{}
	for i := range n {
		seqs, err := train.SampleTarget(ctx, target, [][]int32{{bos}}, length, temp, seed+uint64(i)*7919)
		if err != nil {
			return nil, err
		}
		f, err := Features(target, seqs[0])
		if err != nil {
			return nil, err
		}
		data.Seqs = append(data.Seqs, seqs[0])
		data.Feats = append(data.Feats, f)
		if progress != nil {
			progress(i + 1)
		}
	}
	return data, nil
}

// Features runs the target over seq and returns its final hidden state at
// every position (len(seq)·NEmbd floats).
func Features(target *model.Model, seq []int32) ([]float32, error) {
	c := &target.Config
	T := len(seq)
	pos, sq := make([]int32, T), make([]int32, T)
	for i := range pos {
		pos[i] = int32(i)
	}
	hid := make([]float32, T*c.NEmbd)
	kv := model.NewFlatCache(c, 1, T)
	if _, err := target.Forward(&model.Batch{Tokens: seq, Pos: pos, Seq: sq, Hidden: hid}, kv); err != nil {
		return nil, err
	}
	return hid, nil
}

// TrainOptions sets up a training run.
type TrainOptions struct {
	FFN         int     // draft FFN width (0: the target's)
	Steps       int     // optimizer steps
	Batch       int     // sequences per step
	LR, MinLR   float64 // peak and final learning rate (cosine)
	Warmup      int
	WeightDecay float64
	Clip        float64
	WCls        float64 // weight of the classification loss (EAGLE: 0.1)
	Noise       float64 // uniform feature noise, ± Noise·(mean |f|)
	Depths      int     // depths the held-out accuracy is measured at
	Seed        uint64
	Threads     int
	// Progress, when set, hears about each step.
	Progress func(step int, loss float64)
}

// DefaultTrainOptions are the settings the shipped drafts were trained
// with but for Steps.
func DefaultTrainOptions() TrainOptions {
	return TrainOptions{Steps: 500, Batch: 8, LR: 3e-3, MinLR: 3e-4, Warmup: 30, WeightDecay: 0.01, Clip: 1,
		WCls: 0.1, Noise: 0.1, Depths: 5, Seed: 1, Threads: 2}
}

// Result is what a training run reports.
type Result struct {
	Draft       *Draft
	Hist        []train.Point
	Accuracy    []float64 // held-out top-1 agreement with the target's greedy token per depth
	Unigram     float64   // the same for the most frequent greedy token (a baseline)
	TrainTokens int64     // token positions trained on (rows × steps)
	Elapsed     time.Duration
}

// Train trains a fresh draft for target on data and measures it on held.
func Train(target *model.Model, targetSum string, data, held *Data, o TrainOptions) (*Result, error) {
	if len(data.Seqs) == 0 || len(held.Seqs) == 0 {
		return nil, fmt.Errorf("eagle: no training or held-out sequences")
	}
	if o.Batch <= 0 || o.Steps <= 0 {
		return nil, fmt.Errorf("eagle: steps %d and batch %d must be positive", o.Steps, o.Batch)
	}
	d, err := newDraft(ShapeOf(&target.Config, o.FFN), target, targetSum)
	if err != nil {
		return nil, err
	}
	d.SetThreads(o.Threads)
	d.init(o.Seed)
	if err := d.ensureHead(); err != nil {
		return nil, err
	}
	t := newTrainer(d, o)
	sched := train.Schedule{Max: o.LR, Min: o.MinLR, Warmup: o.Warmup, Total: o.Steps}
	res := &Result{Draft: d}
	start := time.Now()
	for step := range o.Steps {
		batch := make([]int, o.Batch)
		for i := range batch {
			batch[i] = t.rng.Intn(len(data.Seqs))
		}
		loss, rows, err := t.step(data, batch, sched.At(step))
		if err != nil {
			return nil, err
		}
		res.TrainTokens += int64(rows)
		res.Hist = append(res.Hist, train.Point{Step: step, Tokens: res.TrainTokens, Elapsed: time.Since(start), Loss: loss, LR: sched.At(step)})
		if o.Progress != nil {
			o.Progress(step, loss)
		}
	}
	res.Elapsed = time.Since(start)
	if o.Depths <= 0 {
		o.Depths = 5
	}
	res.Accuracy, err = d.DepthAccuracy(held, o.Depths)
	if err != nil {
		return nil, err
	}
	res.Unigram = d.unigram(data, held)
	d.Accuracy = res.Accuracy
	return res, nil
}

// init draws the weights: matrices N(0, 1/fan-in), scaled down on the
// residual outputs; the FC starts near passing the feature through, so
// that the untrained draft predicts "the feature stays", and norms at 1.
func (d *Draft) init(seed uint64) {
	rng := train.NewRNG(seed)
	for _, t := range d.Shape.tensors() {
		p := d.Params[t.off : t.off+t.size()]
		if !t.matrix {
			if t.name == "eagle.blk.0.ffn_norm.weight" {
				for i := range p {
					p[i] = 1
				}
			}
			continue
		}
		std := 1 / math.Sqrt(float64(t.cols))
		if t.name == "eagle.blk.0.attn_output.weight" || t.name == "eagle.blk.0.ffn_down.weight" {
			std *= 0.5
		}
		for i := range p {
			p[i] = float32(rng.Normal() * std)
		}
	}
	dd := d.Shape.D
	for i := range dd {
		for j := range 2 * dd {
			d.w.fc[i*2*dd+j] *= 0.5
		}
		d.w.fc[i*2*dd+dd+i] += 0.5
	}
}

// ensureHead dequantizes the target's output head for training.
func (d *Draft) ensureHead() error {
	if d.headF != nil {
		return nil
	}
	o := d.target.W.Output
	h := make([]float32, o.Rows*o.Cols)
	for r := range o.Rows {
		if err := quant.Dequantize(o.Type, o.Row(r), h[r*o.Cols:(r+1)*o.Cols]); err != nil {
			return fmt.Errorf("eagle: output head: %v", err)
		}
	}
	d.headF = h
	return nil
}

// embed writes the target's embedding of tok into dst.
func (d *Draft) embed(tok int32, dst []float32) error {
	e := d.target.W.Embd
	if tok < 0 || int(tok) >= e.Rows {
		return fmt.Errorf("eagle: token %d outside the vocabulary of %d", tok, e.Rows)
	}
	return quant.Dequantize(e.Type, e.Row(int(tok)), dst)
}

func newTrainer(d *Draft, o TrainOptions) *trainer {
	t := &trainer{d: d, o: o, rng: train.NewRNG(o.Seed + 17), grads: make([]float32, len(d.Params)),
		m: make([]float32, len(d.Params)), v: make([]float32, len(d.Params))}
	t.gw = d.Shape.views(t.grads)
	return t
}

type trainer struct {
	d           *Draft
	o           TrainOptions
	rng         *train.RNG
	grads, m, v []float32
	gw          weights
	p           pass
	pos, par    []int32
	tgt         []float32 // target feature rows
	lt, ld, dl  []float32 // target logits, draft logits, their gradient
	dout        []float32
	adamStep    int
}

// step runs one optimizer step on the sequences batch.
func (t *trainer) step(data *Data, batch []int, lr float64) (float64, int, error) {
	loss, n, err := t.grad(data, batch, true)
	if err != nil {
		return 0, 0, err
	}
	train.ClipGradNorm(t.grads, t.o.Clip)
	t.update(lr)
	return loss, n, nil
}

// grad computes the loss on the sequences batch and, when back, its
// gradient into t.grads.
func (t *trainer) grad(data *Data, batch []int, back bool) (float64, int, error) {
	d, s := t.d, t.d.Shape
	dd, V := s.D, s.Vocab
	n := 0
	for _, b := range batch {
		n += len(data.Seqs[b]) - 1
	}
	t.p.size(s, n)
	t.pos, t.par = growI(t.pos, n), growI(t.par, n)
	t.tgt = grow(t.tgt, n*dd)
	r := 0
	for _, b := range batch {
		seq, f := data.Seqs[b], data.Feats[b]
		var mean float32
		for _, v := range f {
			mean += float32(math.Abs(float64(v)))
		}
		amp := float32(t.o.Noise) * mean / float32(len(f))
		for j := 0; j+1 < len(seq); j++ {
			t.pos[r], t.par[r] = int32(j), int32(r-1)
			if j == 0 {
				t.par[r] = -1
			}
			in := t.p.xin[r*2*dd : (r+1)*2*dd]
			if err := d.embed(seq[j+1], in[:dd]); err != nil {
				return 0, 0, err
			}
			copy(in[dd:], f[j*dd:(j+1)*dd])
			if amp > 0 {
				for k := dd; k < 2*dd; k++ {
					in[k] += amp * float32(2*t.rng.Float64()-1)
				}
			}
			copy(t.tgt[r*dd:(r+1)*dd], f[(j+1)*dd:(j+2)*dd])
			r++
		}
	}
	d.forward(&t.p, &d.w, t.pos, nil, t.par, nil, nil, t.p.k, t.p.v, 0)
	loss := t.loss(n, dd, V)
	if back {
		clear(t.grads)
		d.backward(&t.p, &d.w, &t.gw, t.dout, t.pos, t.par)
	}
	return loss, n, nil
}

// loss is EAGLE's: smooth-L1 regression of the predicted features to the
// target's plus WCls × the cross-entropy of the draft's next-token
// distribution against the target's (both through the frozen head), each
// averaged over rows; it leaves the gradient at the outputs in t.dout.
func (t *trainer) loss(n, dd, V int) float64 {
	d := t.d
	t.lt, t.ld, t.dl = grow(t.lt, n*V), grow(t.ld, n*V), grow(t.dl, n*V)
	t.dout = grow(t.dout, n*dd)
	train.MatMul(d.pool, t.lt, t.tgt, d.headF, n, dd, V)
	train.MatMul(d.pool, t.ld, t.p.out, d.headF, n, dd, V)
	var reg, ce float64
	wcls := float32(t.o.WCls)
	for i := range n {
		out, tgt, g := t.p.out[i*dd:(i+1)*dd], t.tgt[i*dd:(i+1)*dd], t.dout[i*dd:(i+1)*dd]
		for j := range out {
			x := out[j] - tgt[j]
			if x > 1 || x < -1 {
				reg += math.Abs(float64(x)) - 0.5
				x = max(-1, min(1, x))
			} else {
				reg += 0.5 * float64(x) * float64(x)
			}
			g[j] = x / float32(n*dd)
		}
		lt, ld, dl := t.lt[i*V:(i+1)*V], t.ld[i*V:(i+1)*V], t.dl[i*V:(i+1)*V]
		softmax(lt)
		var dot float64
		for j, p := range lt {
			dot += float64(p) * float64(ld[j])
		}
		ce += softmax(ld) - dot // −Σ p·log q = lse − Σ p·logit
		for j, p := range lt {
			dl[j] = wcls * (ld[j] - p) / float32(n)
		}
	}
	t.p.tmp = grow(t.p.tmp, n*dd)
	t.p.backX(d.pool, t.p.tmp, t.dl, d.headF, n, dd, V)
	for i, v := range t.p.tmp[:n*dd] {
		t.dout[i] += v
	}
	return reg/float64(n*dd) + t.o.WCls*ce/float64(n)
}

// update is AdamW (β 0.9, 0.95), decay on matrices only.
func (t *trainer) update(lr float64) {
	t.adamStep++
	c1 := 1 - math.Pow(0.9, float64(t.adamStep))
	c2 := 1 - math.Pow(0.95, float64(t.adamStep))
	sq := float32(math.Sqrt(c2))
	step := float32(lr / c1)
	for _, ts := range t.d.Shape.tensors() {
		decay := float32(0)
		if ts.matrix {
			decay = float32(lr * t.o.WeightDecay)
		}
		p, g := t.d.Params[ts.off:ts.off+ts.size()], t.grads[ts.off:ts.off+ts.size()]
		m, v := t.m[ts.off:ts.off+ts.size()], t.v[ts.off:ts.off+ts.size()]
		for i := range p {
			m[i] = 0.9*m[i] + 0.1*g[i]
			v[i] = 0.95*v[i] + 0.05*g[i]*g[i]
			p[i] -= step*m[i]/(float32(math.Sqrt(float64(v[i])))/sq+1e-8) + decay*p[i]
		}
	}
}

func growI(s []int32, n int) []int32 {
	if cap(s) < n {
		return make([]int32, n, n+n/4)
	}
	return s[:n]
}

// softmax normalizes x in place and returns its log-sum-exp.
func softmax(x []float32) float64 {
	mx := x[0]
	for _, v := range x {
		mx = max(mx, v)
	}
	var sum float32
	for i, v := range x {
		e := float32(math.Exp(float64(v - mx)))
		x[i] = e
		sum += e
	}
	inv := 1 / sum
	for i := range x {
		x[i] *= inv
	}
	return float64(mx) + math.Log(float64(sum))
}

func logSumExp(x []float32) float64 {
	mx := x[0]
	for _, v := range x {
		mx = max(mx, v)
	}
	var s float64
	for _, v := range x {
		s += math.Exp(float64(v - mx))
	}
	return float64(mx) + math.Log(s)
}

func argmax(x []float32) int {
	b := 0
	for i, v := range x {
		if v > x[b] {
			b = i
		}
	}
	return b
}
