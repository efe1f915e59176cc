package model

import (
	"errors"
	"fmt"

	"pagoda/arch"
)

// Stage is a contiguous range of layers [Lo, Hi) that one pipeline stage
// holds. The zero value is the whole model.
type Stage struct{ Lo, Hi int }

// resolve checks s against a model of n layers and fills in the whole
// model for the zero value.
func (s Stage) resolve(n int) (Stage, error) {
	if s == (Stage{}) {
		return Stage{0, n}, nil
	}
	if s.Lo < 0 || s.Hi > n || s.Lo >= s.Hi {
		return Stage{}, fmt.Errorf("pipeline stage: layers [%d, %d) of a %d-layer model", s.Lo, s.Hi, n)
	}
	return s, nil
}

func (s Stage) String() string { return fmt.Sprintf("layers [%d, %d)", s.Lo, s.Hi) }

// Stage is the range of layers this model holds: [0, NLayer) unless it
// was opened as one stage of a pipeline (Options.Stage).
func (m *Model) Stage() Stage { return m.stage }

// first and last report whether the model holds the token embedding's
// look-up (the first stage) and the output head (the last).
func (m *Model) first() bool { return m.stage.Lo == 0 }
func (m *Model) last() bool  { return m.stage.Hi == m.Config.NLayer }

// inStage reports whether a stage binds tensor t: its own layers' tensors,
// the token embedding on the first stage (and on the last, when the output
// head is the embedding), the final norm and head on the last. Tensors
// outside the blocks that are none of these are every stage's.
func inStage(t arch.Named, c *Config, st Stage) bool {
	first, last := st.Lo == 0, st.Hi == c.NLayer
	if t.Layer >= 0 {
		return t.Layer >= st.Lo && t.Layer < st.Hi
	}
	switch t.Role {
	case arch.TokenEmbd:
		return first || (last && c.TiedOutput)
	case arch.OutputNorm, arch.Output:
		return last
	}
	return true
}

// ForwardStage runs the batch through this stage's layers, storing their
// K/V in kv (which holds only this stage's layers, numbered from 0). The
// first stage takes the tokens (in is nil); a later one takes in, the
// residual stream (len(b.Tokens) × NEmbd) the previous stage returned. The
// last stage returns the logits of the rows marked in b.Logits, as
// Forward does; any other returns its residual stream after its last
// layer, a fresh slice.
func (m *Model) ForwardStage(b *Batch, kv KVCache, in []float32) ([]float32, error) {
	T, d := len(b.Tokens), m.Config.NEmbd
	switch {
	case m.first() && in != nil:
		return nil, errors.New("model: the first pipeline stage takes tokens, not hidden states")
	case !m.first() && len(in) != T*d:
		return nil, fmt.Errorf("model: pipeline stage %v needs %d×%d hidden states, got %d values", m.stage, T, d, len(in))
	}
	if err := m.begin(b, kv); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.trunk(b, kv, in); err != nil {
		return nil, err
	}
	if m.last() {
		return m.head(b)
	}
	return append([]float32(nil), m.buf.x[:T*d]...), nil
}
