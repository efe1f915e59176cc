// Package medusa is Medusa-1 speculation (Cai et al. 2024): K small heads
// on the target's final hidden state, head k guessing the token k+1
// places ahead of the one the target's own head predicts, their top
// candidates arranged in a static sparse tree that the engine verifies in
// one pass.
//
// Head k is a residual block and its own vocabulary projection,
//
//	r = h + SiLU(W_k·h + b_k),   logits_k = O_k·r,
//
// O_k initialised from the target's output matrix. A head set may instead
// share the target's (frozen) output matrix, training only the residual
// blocks: a quarter of the parameters per head of a small-vocabulary
// model's, and a side file that stays small.
//
// Training (Train) is self-distillation with the target frozen: the
// target's own samples and, once, its hidden states over them; forward
// and backward are written out here in float32.
//
// Wiring (pagoda serve/run --spec medusa --heads FILE):
//
//	h, err := medusa.Load(file, target, targetPath) // GGUF side file or medusa_lm_head.safetensors
//	p := h.Proposer(medusa.ProposerOptions{})        // a spec.FeatureProposer
//
// A GGUF side file records the SHA-256 of the target it was trained for
// (model.FileChecksum) and is refused with any other. Medusa's published
// medusa_lm_head.safetensors carries no such identity: it is accepted
// whenever its shapes match the target's.
package medusa

import (
	"fmt"
	"math"

	"pagoda/kernels"
	"pagoda/model"
	"pagoda/quant"
)

// Heads is a trained set of Medusa heads for one target.
type Heads struct {
	K, D, V int
	// Params holds every trainable value, [W | B | Out], so that the
	// optimizer's moments line up with it: W is K·D·D (head k's row i
	// is output i), B is K·D, Out is K·V·D (empty when Shared).
	Params []float32
	W, B   []float32
	Out    []float32
	Shared bool
	target []float32 // the target's output matrix, V·D, for Shared heads
	// outT is each head's output matrix transposed (D·V), for training:
	// the backward pass's Oᵀ·g is then D dot products, which the kernels
	// vectorise, instead of V scalar row updates. refreshT rebuilds it.
	outT    []float32
	Tree    Tree
	TopK    int
	RankAcc []float64 // K·TopK: held-out fraction whose true token was head k's rank r
	// Checksum is the target's model.FileChecksum ("" for a published
	// checkpoint, which has none).
	Checksum string
	// Info is what training measured, written to the side file.
	Info TrainInfo
}

// TrainInfo is how a head set was trained, for the side file and the
// report.
type TrainInfo struct {
	Steps       int
	Positions   int64 // training positions seen (each feeds every head)
	Seconds     float64
	HeldOut     int // held-out positions measured
	Top1, TopK  []float64
	UnigramTop1 float64 // head 1's baseline: always the most frequent token
}

// New makes K heads for a D-wide, V-token target: zero residual weights
// (so each head starts as the target's own output head, shifted) and
// vocabulary projections copied from out (V·D), or shared with it.
func New(k, d, v int, out []float32, shared bool) (*Heads, error) {
	if k < 1 || k > 64 || d < 1 || v < 2 {
		return nil, fmt.Errorf("medusa: %d heads of width %d over %d tokens", k, d, v)
	}
	if len(out) != v*d {
		return nil, fmt.Errorf("medusa: output matrix has %d values, want %d×%d", len(out), v, d)
	}
	n := k*d*d + k*d
	if !shared {
		n += k * v * d
	}
	h := &Heads{K: k, D: d, V: v, Shared: shared, target: out, Params: make([]float32, n)}
	h.split()
	if !shared {
		for i := range k {
			copy(h.Out[i*v*d:(i+1)*v*d], out)
		}
	}
	return h, nil
}

func (h *Heads) split() {
	k, d, v := h.K, h.D, h.V
	h.W = h.Params[:k*d*d]
	h.B = h.Params[k*d*d : k*d*d+k*d]
	h.Out = nil
	if !h.Shared {
		h.Out = h.Params[k*d*d+k*d : k*d*d+k*d+k*v*d]
	}
}

// out is head k's vocabulary projection, V rows of D.
func (h *Heads) out(k int) []float32 {
	if h.Shared {
		return h.target
	}
	return h.Out[k*h.V*h.D : (k+1)*h.V*h.D]
}

// TargetOutput is m's output matrix (the tied embedding when there is
// none) as V·D float32s.
func TargetOutput(m *model.Model) ([]float32, error) {
	w := m.W.Output
	if w == nil {
		w = m.W.Embd
	}
	c := m.Config
	if w == nil || w.Rows != c.VocabSize || w.Cols != c.NEmbd {
		return nil, fmt.Errorf("medusa: the target's output matrix is not %d×%d (a vocabulary-split or missing head)", c.VocabSize, c.NEmbd)
	}
	if w.Perm != nil {
		return nil, fmt.Errorf("medusa: the target's output matrix is GPTQ act-order, which heads cannot start from")
	}
	out := make([]float32, w.Rows*w.Cols)
	for r := range w.Rows {
		if err := quant.Dequantize(w.Type, w.Row(r), out[r*w.Cols:(r+1)*w.Cols]); err != nil {
			return nil, fmt.Errorf("medusa: target output row %d: %w", r, err)
		}
	}
	return out, nil
}

func sigmoid(x float32) float32 { return 1 / (1 + float32(math.Exp(float64(-x)))) }

// resid computes head k's residual block on x: z = W_k·x + b_k (kept for
// the backward pass) and r = x + SiLU(z).
func (h *Heads) resid(k int, x, z, r []float32) {
	d := h.D
	w, b := h.W[k*d*d:(k+1)*d*d], h.B[k*d:(k+1)*d]
	for i := range d {
		zi := kernels.DotF32(w[i*d:(i+1)*d], x) + b[i]
		z[i] = zi
		r[i] = x[i] + zi*sigmoid(zi)
	}
}

// refreshT rebuilds outT from the current output matrices.
func (h *Heads) refreshT() {
	n := h.K
	if h.Shared {
		n = 1
	}
	if len(h.outT) != n*h.V*h.D {
		h.outT = make([]float32, n*h.V*h.D)
	}
	d, v := h.D, h.V
	for k := range n {
		o, t := h.out(k), h.outT[k*v*d:(k+1)*v*d]
		for r := range v {
			for c, x := range o[r*d : (r+1)*d] {
				t[c*v+r] = x
			}
		}
	}
}

// logits writes head k's V logits for residual output r.
func (h *Heads) logits(k int, r, out []float32) {
	o, d := h.out(k), h.D
	for v := range h.V {
		out[v] = kernels.DotF32(o[v*d:(v+1)*d], r)
	}
}

// axpy is y += a·x.
func axpy(a float32, x, y []float32) {
	y = y[:len(x)]
	i := 0
	for ; i+4 <= len(x); i += 4 {
		y[i] += a * x[i]
		y[i+1] += a * x[i+1]
		y[i+2] += a * x[i+2]
		y[i+3] += a * x[i+3]
	}
	for ; i < len(x); i++ {
		y[i] += a * x[i]
	}
}

// scratch is one worker's buffers for a row's forward and backward.
type scratch struct {
	z, r, dr, logits []float32
}

func (h *Heads) newScratch() *scratch {
	return &scratch{z: make([]float32, h.D), r: make([]float32, h.D), dr: make([]float32, h.D), logits: make([]float32, h.V)}
}

// lossGrad runs head k on feature x against token y, returns the
// cross-entropy and adds scale × its gradient to grad (laid out as
// Params). outT must be current (refreshT).
func (h *Heads) lossGrad(k int, x []float32, y int32, scale float32, grad []float32, s *scratch) float64 {
	d, v := h.D, h.V
	h.resid(k, x, s.z, s.r)
	h.logits(k, s.r, s.logits)
	loss := softmaxCE(s.logits, y)
	g := s.logits // now p − onehot(y)
	ot := h.outT
	if !h.Shared {
		ot = ot[k*v*d : (k+1)*v*d]
	}
	for j := range d {
		s.dr[j] = scale * kernels.DotF32(ot[j*v:(j+1)*v], g)
	}
	if !h.Shared {
		off := len(h.W) + len(h.B) + k*v*d
		dOut := grad[off : off+v*d]
		for t, gt := range g {
			if gt != 0 {
				axpy(gt*scale, s.r, dOut[t*d:(t+1)*d])
			}
		}
	}
	dW := grad[k*d*d : (k+1)*d*d]
	dB := grad[len(h.W)+k*d : len(h.W)+(k+1)*d]
	for i := range d {
		sg := sigmoid(s.z[i])
		dz := s.dr[i] * sg * (1 + s.z[i]*(1-sg))
		dB[i] += dz
		axpy(dz, x, dW[i*d:(i+1)*d])
	}
	return loss
}

// softmaxCE turns logits into p − onehot(y) in place and returns −log p_y.
func softmaxCE(l []float32, y int32) float64 {
	mx := l[0]
	for _, x := range l {
		mx = max(mx, x)
	}
	var sum float64
	for i, x := range l {
		e := math.Exp(float64(x - mx))
		l[i] = float32(e)
		sum += e
	}
	inv := float32(1 / sum)
	py := float64(l[y]) / sum
	for i := range l {
		l[i] *= inv
	}
	l[y] -= 1
	return -math.Log(max(py, 1e-30))
}

// topKIdx writes the indices of the k largest of l into idx (len k),
// largest first; ties go to the lower index, so that it is
// deterministic.
func topKIdx(l []float32, idx []int32) {
	k := len(idx)
	n := 0
	for i, x := range l {
		if n == k && x <= l[idx[k-1]] {
			continue
		}
		j := min(n, k-1)
		if n < k {
			n++
		}
		for j > 0 && l[idx[j-1]] < x {
			idx[j] = idx[j-1]
			j--
		}
		idx[j] = int32(i)
	}
}
