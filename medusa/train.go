package medusa

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"pagoda/model"
	"pagoda/train"
)

// Data is sequences and the target's final hidden state at each of their
// positions: row t of Feats[s] is what the target's output head read to
// predict Seqs[s][t+1].
type Data struct {
	D     int
	Seqs  [][]int32
	Feats [][]float32
}

// Features runs the target once over each sequence (a prefill, as the
// engine's would be) and keeps every position's hidden state.
func Features(ctx context.Context, m *model.Model, seqs [][]int32, progress func(done, total int)) (*Data, error) {
	c := m.Config
	d := &Data{D: c.NEmbd, Seqs: seqs, Feats: make([][]float32, len(seqs))}
	for i, s := range seqs {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if len(s) == 0 || len(s) > c.ContextLen {
			return nil, fmt.Errorf("medusa: sequence %d has %d tokens (context %d)", i, len(s), c.ContextLen)
		}
		pos, seq := make([]int32, len(s)), make([]int32, len(s))
		for j := range pos {
			pos[j] = int32(j)
		}
		hid := make([]float32, len(s)*c.NEmbd)
		kv := model.NewFlatCache(&c, 1, len(s))
		if _, err := m.Forward(&model.Batch{Tokens: s, Pos: pos, Seq: seq, Hidden: hid}, kv); err != nil {
			return nil, fmt.Errorf("medusa: target forward over sequence %d: %w", i, err)
		}
		d.Feats[i] = hid
		if progress != nil {
			progress(i+1, len(seqs))
		}
	}
	return d, nil
}

// positions lists (sequence, position) pairs whose feature has at least
// head 0's target (position+2) inside the sequence.
func (d *Data) positions() [][2]int32 {
	var ps [][2]int32
	for s, seq := range d.Seqs {
		for t := 0; t+2 < len(seq); t++ {
			ps = append(ps, [2]int32{int32(s), int32(t)})
		}
	}
	return ps
}

// Options are the training settings.
type Options struct {
	Steps       int           // schedule length in steps (0: by Time alone)
	Time        time.Duration // schedule length in time (0: by Steps alone)
	Batch       int           // positions per step; each trains every head
	LR, MinLR   float64
	Warmup      int
	WeightDecay float64
	Clip        float64
	Threads     int
	Seed        uint64
	TopK        int // ranks measured per head, the tree's branching bound
	TreeNodes   int // the static tree's node budget
	EvalMax     int // held-out positions per intermediate measurement (0: 512)
}

// Trainer trains a head set on the target's features.
type Trainer struct {
	H        *Heads
	O        Options
	Step     int
	Pos      int64
	History  []train.Point
	opt      *train.AdamW
	tr, held *Data
	order    [][2]int32
	next     int
	rng      *rand.Rand
	grads    [][]float32
	scr      []*scratch
	start    time.Time
	elapsed  time.Duration
}

// NewTrainer prepares to train h on tr, measuring on held.
func NewTrainer(h *Heads, tr, held *Data, o Options) (*Trainer, error) {
	switch {
	case o.Steps <= 0 && o.Time <= 0:
		return nil, fmt.Errorf("medusa: give a step count or a time to train for")
	case o.Batch < 1 || o.TopK < 1 || o.TopK > 64 || o.TreeNodes < 1:
		return nil, fmt.Errorf("medusa: batch %d, top-k %d, tree %d nodes out of range", o.Batch, o.TopK, o.TreeNodes)
	case tr.D != h.D || held.D != h.D:
		return nil, fmt.Errorf("medusa: features of width %d/%d for heads of width %d", tr.D, held.D, h.D)
	}
	o.Threads = max(1, o.Threads)
	if o.EvalMax <= 0 {
		o.EvalMax = 512
	}
	t := &Trainer{H: h, O: o, opt: train.NewAdamW(len(h.Params), o.WeightDecay), tr: tr, held: held,
		order: tr.positions(), rng: rand.New(rand.NewPCG(o.Seed, 0x6d6564757361))}
	if len(t.order) == 0 || len(held.positions()) == 0 {
		return nil, fmt.Errorf("medusa: no training or held-out positions (sequences shorter than 3 tokens)")
	}
	for range o.Threads {
		t.grads = append(t.grads, make([]float32, len(h.Params)))
		t.scr = append(t.scr, h.newScratch())
	}
	t.next = len(t.order)
	h.refreshT()
	return t, nil
}

// Fraction is how far along the schedule the run is, 0…1.
func (t *Trainer) Fraction() float64 {
	f := 0.0
	if t.O.Steps > 0 {
		f = float64(t.Step) / float64(t.O.Steps)
	}
	if t.O.Time > 0 {
		f = max(f, float64(t.elapsed)/float64(t.O.Time))
	}
	return min(f, 1)
}

// Done reports whether the schedule has run out.
func (t *Trainer) Done() bool { return t.Fraction() >= 1 }

// LR is the learning rate of the next step: linear warm-up, then cosine
// decay over the rest of the schedule (in steps or time).
func (t *Trainer) LR() float64 {
	o := t.O
	if t.Step < o.Warmup {
		return o.LR * float64(t.Step+1) / float64(o.Warmup)
	}
	return o.MinLR + 0.5*(o.LR-o.MinLR)*(1+math.Cos(math.Pi*t.Fraction()))
}

func (t *Trainer) batch() [][2]int32 {
	b := make([][2]int32, t.O.Batch)
	for i := range b {
		if t.next >= len(t.order) {
			t.rng.Shuffle(len(t.order), func(i, j int) { t.order[i], t.order[j] = t.order[j], t.order[i] })
			t.next = 0
		}
		b[i] = t.order[t.next]
		t.next++
	}
	return b
}

// TrainStep runs one optimizer step and returns the mean cross-entropy
// over heads and the gradient norm before clipping.
func (t *Trainer) TrainStep() (loss, gradNorm float64) {
	if t.start.IsZero() {
		t.start = time.Now()
	}
	t0 := time.Now()
	h, b := t.H, t.batch()
	// Each head's loss is its mean over the rows that have its target.
	count := make([]int, h.K)
	for _, p := range b {
		n := len(t.tr.Seqs[p[0]])
		for k := range h.K {
			if int(p[1])+2+k < n {
				count[k]++
			}
		}
	}
	losses := make([]float64, len(t.grads))
	var wg sync.WaitGroup
	for w := range t.grads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g := t.grads[w]
			clear(g)
			for i := w; i < len(b); i += len(t.grads) {
				s, pos := b[i][0], int(b[i][1])
				seq := t.tr.Seqs[s]
				x := t.tr.Feats[s][pos*h.D : (pos+1)*h.D]
				for k := range h.K {
					if pos+2+k < len(seq) {
						losses[w] += h.lossGrad(k, x, seq[pos+2+k], 1/float32(count[k]), g, t.scr[w]) / float64(count[k])
					}
				}
			}
		}()
	}
	wg.Wait()
	g := t.grads[0]
	for _, o := range t.grads[1:] {
		for i, v := range o {
			g[i] += v
		}
	}
	for _, l := range losses {
		loss += l
	}
	loss /= float64(h.K)
	gradNorm = train.ClipGradNorm(g, t.O.Clip)
	lr := t.LR()
	t.update(g, lr)
	if !h.Shared {
		h.refreshT()
	}
	t.Step++
	t.Pos += int64(len(b))
	t.elapsed += time.Since(t0)
	t.History = append(t.History, train.Point{Step: t.Step, Tokens: t.Pos, Elapsed: t.elapsed, Loss: loss, LR: lr})
	return loss, gradNorm
}

// update is AdamW over Params, decaying the matrices only.
func (t *Trainer) update(g []float32, lr float64) {
	o, h := t.opt, t.H
	o.Step++
	b1, b2, eps := float32(o.Beta1), float32(o.Beta2), float32(o.Eps)
	step := float32(lr / (1 - math.Pow(o.Beta1, float64(o.Step))))
	sq := float32(math.Sqrt(1 - math.Pow(o.Beta2, float64(o.Step))))
	nw, nb := len(h.W), len(h.B)
	for i, p := range h.Params {
		decay := float32(lr * o.WeightDecay)
		if i >= nw && i < nw+nb {
			decay = 0
		}
		m := b1*o.M[i] + (1-b1)*g[i]
		v := b2*o.V[i] + (1-b2)*g[i]*g[i]
		o.M[i], o.V[i] = m, v
		h.Params[i] = p - step*m/(float32(math.Sqrt(float64(v)))/sq+eps) - decay*p
	}
}

// Eval is what a measurement over held-out positions found.
type Eval struct {
	N       int       // positions measured (head k: those with its target)
	PerHead []int     // positions with head k's target
	RankAcc []float64 // K·TopK: fraction whose true token was rank r of head k
	Loss    []float64 // per head mean cross-entropy
}

// Top1 is head k's top-1 accuracy, TopK its top-k accuracy.
func (e *Eval) Top1(k int) float64 { return e.RankAcc[k*len(e.RankAcc)/len(e.Loss)] }

// TopKAcc is head k's accuracy within its top k ranks.
func (e *Eval) TopKAcc(k int) float64 {
	tk := len(e.RankAcc) / len(e.Loss)
	s := 0.0
	for _, a := range e.RankAcc[k*tk : (k+1)*tk] {
		s += a
	}
	return s
}

// Evaluate measures h on up to max positions of d (spread evenly over
// them), with topK ranks per head.
func Evaluate(h *Heads, d *Data, topK, max, threads int) *Eval {
	ps := d.positions()
	if max > 0 && len(ps) > max {
		sub := make([][2]int32, max)
		for i := range sub {
			sub[i] = ps[i*len(ps)/max]
		}
		ps = sub
	}
	threads = min(threads, len(ps))
	threads = maxInt(threads, 1)
	type acc struct {
		hits []int
		n    []int
		loss []float64
	}
	accs := make([]acc, threads)
	var wg sync.WaitGroup
	for w := range threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := acc{hits: make([]int, h.K*topK), n: make([]int, h.K), loss: make([]float64, h.K)}
			s := h.newScratch()
			idx := make([]int32, topK)
			for i := w; i < len(ps); i += threads {
				seq := d.Seqs[ps[i][0]]
				pos := int(ps[i][1])
				x := d.Feats[ps[i][0]][pos*h.D : (pos+1)*h.D]
				for k := range h.K {
					if pos+2+k >= len(seq) {
						continue
					}
					y := seq[pos+2+k]
					h.resid(k, x, s.z, s.r)
					h.logits(k, s.r, s.logits)
					topKIdx(s.logits, idx)
					for r, v := range idx {
						if v == y {
							a.hits[k*topK+r]++
						}
					}
					a.loss[k] += softmaxCE(s.logits, y)
					a.n[k]++
				}
			}
			accs[w] = a
		}()
	}
	wg.Wait()
	e := &Eval{N: len(ps), PerHead: make([]int, h.K), RankAcc: make([]float64, h.K*topK), Loss: make([]float64, h.K)}
	for _, a := range accs {
		for k := range h.K {
			e.PerHead[k] += a.n[k]
			e.Loss[k] += a.loss[k]
			for r := range topK {
				e.RankAcc[k*topK+r] += float64(a.hits[k*topK+r])
			}
		}
	}
	for k := range h.K {
		n := float64(maxInt(e.PerHead[k], 1))
		e.Loss[k] /= n
		for r := range topK {
			e.RankAcc[k*topK+r] /= n
		}
	}
	return e
}

func maxInt(a, b int) int {
	if a > b {
		return a
	}
	return b
}

// HeldOut measures the held-out loss (mean over heads) on a subset and
// records it in the history.
func (t *Trainer) HeldOut() float64 {
	e := Evaluate(t.H, t.held, t.O.TopK, t.O.EvalMax, t.O.Threads)
	l := 0.0
	for _, x := range e.Loss {
		l += x
	}
	l /= float64(len(e.Loss))
	if n := len(t.History); n > 0 {
		t.History[n-1].HeldOut, t.History[n-1].HasHeldOut = l, true
	}
	return l
}

// Finish measures the heads on all held-out positions, builds the static
// tree from their rank accuracies and records how training went.
func (t *Trainer) Finish() (*Eval, error) {
	h := t.H
	e := Evaluate(h, t.held, t.O.TopK, 0, t.O.Threads)
	tree, err := BuildTree(e.RankAcc, h.K, t.O.TopK, t.O.TreeNodes)
	if err != nil {
		return nil, err
	}
	h.Tree, h.TopK, h.RankAcc = tree, t.O.TopK, e.RankAcc
	info := TrainInfo{Steps: t.Step, Positions: t.Pos, Seconds: t.elapsed.Seconds(), HeldOut: e.N,
		UnigramTop1: unigramTop1(t.tr, t.held)}
	for k := range h.K {
		info.Top1 = append(info.Top1, e.Top1(k))
		info.TopK = append(info.TopK, e.TopKAcc(k))
	}
	h.Info = info
	return e, nil
}

// unigramTop1 is the held-out accuracy of always guessing the training
// targets' most frequent token for head 0's position: the baseline a head
// must beat to have learnt anything from the features.
func unigramTop1(tr, held *Data) float64 {
	freq := map[int32]int{}
	for _, s := range tr.Seqs {
		for _, t := range s[min(2, len(s)):] {
			freq[t]++
		}
	}
	best, bn := int32(0), -1
	for t, n := range freq {
		if n > bn || n == bn && t < best {
			best, bn = t, n
		}
	}
	hit, n := 0, 0
	for _, p := range held.positions() {
		n++
		if held.Seqs[p[0]][p[1]+2] == best {
			hit++
		}
	}
	return float64(hit) / float64(maxInt(n, 1))
}
