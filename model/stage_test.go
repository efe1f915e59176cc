package model

import (
	"math"
	"path/filepath"
	"strings"
	"testing"

	"pagoda/testutil"
)

// runStages runs tpSteps through the stages in order, each with a flat
// cache of its own layers, handing each stage's hidden states to the next.
func runStages(t *testing.T, stages []*Model) [][]float32 {
	t.Helper()
	kvs := make([]*FlatCache, len(stages))
	for i, s := range stages {
		kvs[i] = s.NewFlatCache(2, 16)
	}
	var out [][]float32
	for _, b := range tpSteps() {
		var h []float32
		for i, s := range stages {
			var err error
			if h, err = s.ForwardStage(b, kvs[i], h); err != nil {
				t.Fatalf("stage %v: %v", s.Stage(), err)
			}
		}
		out = append(out, h)
	}
	return out
}

// TestPipelineStages: the golden llamas (2 and 3 layers; a separate and a
// tied output head), qwen2 (biases), qwen3 (q/k norm, tied), the
// mixtures of experts (Mixtral-style, qwen2moe) and deepseek2 (MLA, a
// dense first layer then experts) cut into 2 and 3 stages, each binding
// only its own layers, chained in process give the whole model's logits
// bit for bit: every layer runs the same arithmetic on the same rows,
// only in another model.
func TestPipelineStages(t *testing.T) {
	dir := testutil.Shared(t, "golden/models")
	for _, c := range []struct {
		file   string
		stages []Stage
	}{
		{"g-llama3-ropefreqs.F32.gguf", []Stage{{0, 1}, {1, 2}}},
		{"g-llama-mqa.F16.gguf", []Stage{{0, 2}, {2, 3}}},
		{"g-llama-mqa.F16.gguf", []Stage{{0, 1}, {1, 2}, {2, 3}}},
		{"g-llama-mqa.Q8_0.gguf", []Stage{{0, 1}, {1, 3}}},
		{"g-qwen2.F32.gguf", []Stage{{0, 1}, {1, 2}}},
		{"g-qwen3.Q8_0.gguf", []Stage{{0, 1}, {1, 2}}},
		{"g-mixtral.F32.gguf", []Stage{{0, 1}, {1, 2}}},
		{"g-qwen2moe.Q8_0.gguf", []Stage{{0, 1}, {1, 2}}},
		{"g-deepseek2.F32.gguf", []Stage{{0, 1}, {1, 2}, {2, 3}}},
		{"g-deepseek2-lite.F32.gguf", []Stage{{0, 2}, {2, 3}}},
	} {
		path := filepath.Join(dir, c.file)
		whole, err := Open(path, Options{Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		want := runSteps(t, whole)
		wholeBytes := weightBytes(whole)
		whole.Close()
		ms := make([]*Model, len(c.stages))
		for i, st := range c.stages {
			if ms[i], err = Open(path, Options{Threads: 1, Stage: st}); err != nil {
				t.Fatal(err)
			}
			defer ms[i].Close()
			checkStageBinding(t, ms[i])
			if b := weightBytes(ms[i]); b >= wholeBytes {
				t.Errorf("%s %v holds %d weight bytes, the whole model %d", c.file, st, b, wholeBytes)
			}
		}
		got := runStages(t, ms)
		for s := range want {
			if len(got[s]) != len(want[s]) {
				t.Fatalf("%s %v step %d: %d logits, want %d", c.file, c.stages, s, len(got[s]), len(want[s]))
			}
			for i := range want[s] {
				if math.Float32bits(got[s][i]) != math.Float32bits(want[s][i]) {
					t.Fatalf("%s %v step %d logit %d: %g, want %g (not bit-identical)", c.file, c.stages, s, i, got[s][i], want[s][i])
				}
			}
		}
		t.Logf("%s as %v: %d steps bit-identical to the whole model", c.file, c.stages, len(want))
	}
}

// checkStageBinding: a stage binds its own layers only, the embedding only
// where it is looked up (first) or is the tied head (last), and the head
// only on the last stage.
func checkStageBinding(t *testing.T, m *Model) {
	t.Helper()
	st := m.Stage()
	for li, l := range m.W.Layers {
		if in := li >= st.Lo && li < st.Hi; in != (l.AttnNorm != nil) || in != (l.FFNNorm != nil) || in != (l.O != nil) {
			t.Errorf("stage %v: layer %d bound %v", st, li, l.AttnNorm != nil)
		}
	}
	if want := m.first() || (m.last() && m.Config.TiedOutput); (m.W.Embd != nil) != want {
		t.Errorf("stage %v: embedding bound %v, want %v", st, m.W.Embd != nil, want)
	}
	if (m.W.Output != nil) != m.last() || (m.W.OutputNorm != nil) != m.last() {
		t.Errorf("stage %v: output head bound %v", st, m.W.Output != nil)
	}
}

func weightBytes(m *Model) int {
	n := 0
	for _, mat := range m.W.Matrices() {
		n += len(mat.Data)
	}
	return n
}

// TestPipelineStageRefusals: a stage outside the model, the whole forward
// pass on a stage, and hidden states of the wrong size are errors.
func TestPipelineStageRefusals(t *testing.T) {
	path := filepath.Join(testutil.Shared(t, "golden/models"), "g-llama-mqa.F16.gguf")
	for _, st := range []Stage{{2, 1}, {0, 4}, {-1, 2}, {1, 1}} {
		if m, err := Open(path, Options{Threads: 1, Stage: st}); err == nil || !strings.Contains(err.Error(), "pipeline stage") {
			if m != nil {
				m.Close()
			}
			t.Errorf("stage %v: %v", st, err)
		}
	}
	first, err := Open(path, Options{Threads: 1, Stage: Stage{0, 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	mid, err := Open(path, Options{Threads: 1, Stage: Stage{1, 2}})
	if err != nil {
		t.Fatal(err)
	}
	defer mid.Close()
	b := tpSteps()[0]
	if _, err := first.Forward(b, first.NewFlatCache(2, 16)); err == nil || !strings.Contains(err.Error(), "ForwardStage") {
		t.Errorf("Forward on a stage: %v", err)
	}
	if _, err := mid.ForwardStage(b, mid.NewFlatCache(2, 16), make([]float32, 3)); err == nil || !strings.Contains(err.Error(), "hidden states") {
		t.Errorf("short hidden states: %v", err)
	}
	if _, err := first.ForwardStage(b, first.NewFlatCache(2, 16), make([]float32, len(b.Tokens)*first.Config.NEmbd)); err == nil {
		t.Error("the first stage took hidden states")
	}
	if _, err := first.SequenceHidden([][]int32{{1, 2}}); err == nil {
		t.Error("SequenceHidden ran on a stage")
	}
}

// TestRowSplitSteps: a step cut by rows into consecutive pieces run one
// after another (what a pipeline's micro-batches do) gives the whole
// step's logits; the log says whether bit for bit (the kernels may
// accumulate a product of a few rows in another order than of many).
func TestRowSplitSteps(t *testing.T) {
	dir := testutil.Shared(t, "golden/models")
	for _, file := range []string{"g-llama3-ropefreqs.F32.gguf", "g-llama-mqa.Q8_0.gguf"} {
		m, err := Open(filepath.Join(dir, file), Options{Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		want := runSteps(t, m)
		kv := m.NewFlatCache(2, 16)
		worst := 0.0
		for s, b := range tpSteps() {
			var got []float32
			for lo := 0; lo < len(b.Tokens); lo += 3 {
				hi := min(lo+3, len(b.Tokens))
				p := &Batch{Tokens: b.Tokens[lo:hi], Pos: b.Pos[lo:hi], Seq: b.Seq[lo:hi], Logits: b.Logits[lo:hi]}
				l, err := m.Forward(p, kv)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, l...)
			}
			if len(got) != len(want[s]) {
				t.Fatalf("%s step %d: %d logits, want %d", file, s, len(got), len(want[s]))
			}
			for i := range got {
				worst = max(worst, math.Abs(float64(got[i]-want[s][i])))
			}
		}
		if worst > 1e-4 {
			t.Errorf("%s: row-split steps differ by up to %g", file, worst)
		}
		t.Logf("%s: row-split steps within %g of the whole step (0 = bit-identical)", file, worst)
	}
}
