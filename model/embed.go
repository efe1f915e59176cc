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
// embeddings pool. The pass has its own flat KV cache holding only this
// batch, so it needs none from the engine and leaves nothing behind; a
// sequence attends causally to itself only, so its states are the same
// alone or in a batch.
func (m *Model) SequenceHidden(seqs [][]int32) ([][]float32, error) {
	c := &m.Config
	if !m.first() || !m.last() {
		return nil, fmt.Errorf("model: %v of %d is a pipeline stage: it has no whole forward pass", m.stage, c.NLayer)
	}
	var b Batch
	longest := 0
	for si, s := range seqs {
		if len(s) == 0 {
			return nil, fmt.Errorf("model: input %d is empty", si)
		}
		if len(s) > c.ContextLen {
			return nil, fmt.Errorf("model: input %d has %d tokens, more than the model's context of %d", si, len(s), c.ContextLen)
		}
		longest = max(longest, len(s))
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
	kv := m.NewFlatCache(len(seqs), longest)
	if err := m.begin(&b, kv); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.trunk(&b, kv, nil); err != nil {
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
