package model

import (
	"errors"
	"fmt"
	"math"
)

// Pooling names, as llama.cpp's --pooling spells them; index = GGUF
// <arch>.pooling_type.
var poolingNames = []string{"none", "mean", "cls", "last", "rank"}

// PoolingName maps a GGUF pooling_type to its name ("" when unknown).
func PoolingName(v int64) string {
	if v < 0 || v >= int64(len(poolingNames)) {
		return ""
	}
	return poolingNames[v]
}

// SequenceHidden runs each sequence from position 0 through the model in
// one forward pass and returns each one's final hidden states after the
// output norm (len(seq)·NEmbd floats), the vectors llama.cpp's decoder
// embeddings pool. The pass has its own KV cache holding only this batch,
// so it needs none from the engine and leaves nothing behind; a sequence
// attends causally to itself only, so its states are the same alone or in
// a batch.
func (m *Model) SequenceHidden(seqs [][]int32) ([][]float32, error) {
	c := &m.Config
	if c.MLA {
		return nil, errors.New("model: embeddings from multi-head latent attention models are not supported")
	}
	var b Batch
	for si, s := range seqs {
		if len(s) == 0 {
			return nil, fmt.Errorf("model: input %d is empty", si)
		}
		if len(s) > c.ContextLen {
			return nil, fmt.Errorf("model: input %d has %d tokens, more than the model's context of %d", si, len(s), c.ContextLen)
		}
		for p, t := range s {
			b.Tokens = append(b.Tokens, t)
			b.Pos = append(b.Pos, int32(p))
			b.Seq = append(b.Seq, int32(si))
		}
	}
	if len(b.Tokens) == 0 {
		return nil, errors.New("model: no input")
	}
	b.Logits = make([]bool, len(b.Tokens))
	kv := &batchKV{nkv: c.NKVHead, hd: c.HeadDim}
	if err := m.begin(&b, kv); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.trunk(&b, kv); err != nil {
		return nil, err
	}
	d := c.NEmbd
	out := make([][]float32, len(seqs))
	r := 0
	for si, s := range seqs {
		h := make([]float32, len(s)*d)
		for i := range s {
			m.ops.RMSNorm(h[i*d:(i+1)*d], m.buf.x[r*d:(r+1)*d], m.W.OutputNorm, c.RMSEps)
			r++
		}
		for _, v := range h {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return nil, fmt.Errorf("model: non-finite hidden state in input %d (corrupt weights?)", si)
			}
		}
		out[si] = h
	}
	return out, nil
}

// batchKV is a KV cache for one forward pass that holds only the batch's
// own keys and values: each row attends to the rows of its sequence at
// positions up to its own (within the sliding window), computed in
// float32 with float64 softmax sums.
type batchKV struct {
	nkv, hd int
	b       *Batch
	k, v    [][]float32 // per layer, T × nkv·hd
}

func (c *batchKV) Begin(b *Batch) error {
	c.b = b
	c.k, c.v = nil, nil
	return nil
}

func (c *batchKV) Store(layer, row int, k, v []float32) {
	T, w := len(c.b.Tokens), c.nkv*c.hd
	for len(c.k) <= layer {
		c.k = append(c.k, make([]float32, T*w))
		c.v = append(c.v, make([]float32, T*w))
	}
	copy(c.k[layer][row*w:(row+1)*w], k)
	copy(c.v[layer][row*w:(row+1)*w], v)
}

func (c *batchKV) Attend(layer, lo, hi int, q, out []float32, p AttnParams) {
	b, w, hd := c.b, c.nkv*c.hd, p.HeadDim
	group := p.NHead / p.NKVHead
	var sc []float32
	for i := lo; i < hi; i++ {
		var rows []int
		for t := range b.Tokens {
			if b.Seq[t] != b.Seq[i] || b.Pos[t] > b.Pos[i] {
				continue
			}
			if p.Window > 0 && b.Pos[i]-b.Pos[t] >= int32(p.Window) {
				continue
			}
			rows = append(rows, t)
		}
		sc = grow(sc, len(rows))
		for h := 0; h < p.NHead; h++ {
			kh := h / group
			qh := q[(i-lo)*p.NHead*hd+h*hd:][:hd]
			mx := float32(math.Inf(-1))
			for j, t := range rows {
				kr := c.k[layer][t*w+kh*hd:][:hd]
				var s float32
				for e := range qh {
					s += qh[e] * kr[e]
				}
				sc[j] = s * p.Scale
				mx = max(mx, sc[j])
			}
			var sum float64
			for j := range sc {
				sc[j] = float32(math.Exp(float64(sc[j] - mx)))
				sum += float64(sc[j])
			}
			o := out[(i-lo)*p.NHead*hd+h*hd:][:hd]
			clear(o)
			inv := float32(1 / sum)
			for j, t := range rows {
				vr := c.v[layer][t*w+kh*hd:][:hd]
				a := sc[j] * inv
				for e := range o {
					o[e] += a * vr[e]
				}
			}
		}
	}
}
