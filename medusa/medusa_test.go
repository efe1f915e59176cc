package medusa

import (
	"context"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"pagoda/gguf"
	"pagoda/model"
	"pagoda/safetensors"
	"pagoda/spec"
	"pagoda/testutil"
	"pagoda/train"
)

func randHeads(t *testing.T, k, d, v int, shared bool, seed uint64) *Heads {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	out := make([]float32, v*d)
	for i := range out {
		out[i] = float32(rng.NormFloat64())
	}
	h, err := New(k, d, v, out, shared)
	if err != nil {
		t.Fatal(err)
	}
	for i := range h.Params {
		h.Params[i] += float32(rng.NormFloat64() * 0.5)
	}
	return h
}

// TestGradients checks the hand-written backward pass of every head
// against central finite differences of the loss, for heads with their
// own output matrix and heads sharing the target's.
func TestGradients(t *testing.T) {
	for _, shared := range []bool{false, true} {
		h := randHeads(t, 2, 6, 9, shared, 7)
		rng := rand.New(rand.NewPCG(3, 4))
		x := make([]float32, h.D)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		s := h.newScratch()
		h.refreshT()
		for k := range h.K {
			y := int32(rng.IntN(h.V))
			grad := make([]float32, len(h.Params))
			h.lossGrad(k, x, y, 1, grad, s)
			loss := func() float64 {
				g := make([]float32, len(h.Params))
				return h.lossGrad(k, x, y, 1, g, s)
			}
			checked := 0
			for i := range h.Params {
				const eps = 1e-2
				p := h.Params[i]
				h.Params[i] = p + eps
				up := loss()
				h.Params[i] = p - eps
				down := loss()
				h.Params[i] = p
				num := (up - down) / (2 * eps)
				if math.Abs(num-float64(grad[i])) > 2e-3+2e-2*math.Abs(num) {
					t.Fatalf("shared %v head %d param %d: analytic %g, numeric %g", shared, k, i, grad[i], num)
				}
				if num != 0 {
					checked++
				}
			}
			if checked < len(h.Params)/(h.K+1) {
				t.Fatalf("only %d of %d gradients are nonzero for head %d", checked, len(h.Params), k)
			}
		}
	}
}

func TestBuildTree(t *testing.T) {
	acc := []float64{0.6, 0.2, 0.1, 0.3, 0.1, 0.05}
	tr, err := BuildTree(acc, 2, 3, 5)
	if err != nil {
		t.Fatal(err)
	}
	// Expected-acceptance order: rank 0 of head 0 (0.6), then its child
	// rank 0 of head 1 (0.18), rank 1 of head 0 (0.2) first, …
	wantP := []int32{-1, -1, 0, -1, 0}
	wantR := []int32{0, 1, 0, 2, 1}
	if len(tr.Parent) != 5 {
		t.Fatalf("tree %v", tr)
	}
	for i := range wantP {
		if tr.Parent[i] != wantP[i] || tr.Rank[i] != wantR[i] {
			t.Fatalf("tree parents %v ranks %v, want %v %v", tr.Parent, tr.Rank, wantP, wantR)
		}
	}
	if err := spec.CheckTree(tr.Parent, len(tr.Parent)); err != nil {
		t.Fatal(err)
	}
	if _, err := BuildTree(acc, 2, 3, 0); err == nil {
		t.Error("a tree of 0 nodes was built")
	}
	if _, err := BuildTree(acc, 2, 3, 1e6); err == nil {
		t.Error("a tree of 10^6 nodes was built")
	}
	big, err := BuildTree(acc, 2, 3, 100)
	if err != nil || big.Len() != 3+9 {
		t.Errorf("a budget above every possible node: %d nodes, %v (want 12)", big.Len(), err)
	}
}

func openTarget(t testing.TB, path string) *model.Model {
	t.Helper()
	m, err := model.Open(path, model.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func storiesPath(t testing.TB) string { return testutil.Shared(t, "models/gguf/stories260K.gguf") }

// sampleData draws n sequences from the target and its features.
func sampleData(t testing.TB, m *model.Model, n, length int, seed uint64) *Data {
	t.Helper()
	bos := m.Tokenizer().Vocab().BOS
	prompts := make([][]int32, n)
	for i := range prompts {
		prompts[i] = []int32{bos}
	}
	seqs, err := train.SampleTarget(context.Background(), m, prompts, length, 1, seed)
	if err != nil {
		t.Fatal(err)
	}
	d, err := Features(context.Background(), m, seqs, nil)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestTrainBeatsUnigram trains stories260K's heads briefly on its own
// samples and requires head 1 to beat always guessing the most frequent
// token on held-out samples, and the held-out loss to fall.
func TestTrainBeatsUnigram(t *testing.T) {
	path := storiesPath(t)
	m := openTarget(t, path)
	tr := sampleData(t, m, 40, 96, 1)
	held := sampleData(t, m, 8, 96, 1000)
	out, err := TargetOutput(m)
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(3, m.Config.NEmbd, m.Config.VocabSize, out, false)
	if err != nil {
		t.Fatal(err)
	}
	tn, err := NewTrainer(h, tr, held, Options{Steps: 250, Batch: 32, LR: 1e-2, MinLR: 1e-3, Warmup: 10, Clip: 1, Threads: 2, Seed: 1, TopK: 5, TreeNodes: 16})
	if err != nil {
		t.Fatal(err)
	}
	before := tn.HeldOut()
	for !tn.Done() {
		tn.TrainStep()
	}
	after := tn.HeldOut()
	e, err := tn.Finish()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("held-out loss %.3f → %.3f; head top-1 %.3f %.3f %.3f, unigram %.3f", before, after, e.Top1(0), e.Top1(1), e.Top1(2), h.Info.UnigramTop1)
	if after > before-1 {
		t.Errorf("held-out loss went %.3f → %.3f", before, after)
	}
	if e.Top1(0) <= h.Info.UnigramTop1+0.05 {
		t.Errorf("head 1 top-1 %.3f does not beat the unigram baseline %.3f", e.Top1(0), h.Info.UnigramTop1)
	}
	if err := spec.CheckTree(h.Tree.Parent, h.Tree.Len()); err != nil || h.Tree.Len() != 16 {
		t.Errorf("tree of %d nodes: %v", h.Tree.Len(), err)
	}
}

// TestSideFile round-trips heads through the GGUF side file and checks
// that the wrong target, a corrupt file and mismatched shapes are refused
// with errors naming what differs.
func TestSideFile(t *testing.T) {
	path := storiesPath(t)
	m := openTarget(t, path)
	out, err := TargetOutput(m)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, shared := range []bool{false, true} {
		h, err := New(2, m.Config.NEmbd, m.Config.VocabSize, out, shared)
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(1, 2))
		for i := range h.Params {
			h.Params[i] += float32(rng.NormFloat64() * 0.01)
		}
		h.TopK, h.RankAcc = 3, []float64{0.5, 0.2, 0.1, 0.3, 0.1, 0.05}
		if h.Tree, err = BuildTree(h.RankAcc, 2, 3, 6); err != nil {
			t.Fatal(err)
		}
		if h.Checksum, err = model.FileChecksum(path); err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(dir, "h.gguf")
		if err := h.Save(f); err != nil {
			t.Fatal(err)
		}
		g, err := Load(f, m, path)
		if err != nil {
			t.Fatal(err)
		}
		if g.K != 2 || g.Shared != shared || g.Tree.Len() != 6 || g.Checksum != h.Checksum {
			t.Fatalf("loaded %d heads, shared %v, %d nodes", g.K, g.Shared, g.Tree.Len())
		}
		for k := range h.K {
			for i, x := range h.out(k) {
				if g.out(k)[i] != x {
					t.Fatalf("head %d output %d: %v, saved %v", k, i, g.out(k)[i], x)
				}
			}
		}
		for i, x := range h.Params {
			if g.Params[i] != x {
				t.Fatalf("parameter %d: %v, saved %v", i, g.Params[i], x)
			}
		}
		// The same bytes but another file: another target.
		other := filepath.Join(dir, "other.gguf")
		b, _ := os.ReadFile(path)
		os.WriteFile(other, append(b, 0), 0o644)
		sum, _ := model.FileChecksum(other)
		if _, err := Load(f, m, other); err == nil || !strings.Contains(err.Error(), sum) || !strings.Contains(err.Error(), h.Checksum) {
			t.Errorf("heads for another target: %v", err)
		}
		// Corrupt: truncated.
		raw, _ := os.ReadFile(f)
		bad := filepath.Join(dir, "bad.gguf")
		os.WriteFile(bad, raw[:len(raw)/2], 0o644)
		if _, err := Load(bad, m, path); err == nil {
			t.Error("a truncated head file loaded")
		}
	}
	// Same checksum claim, a target of other shapes.
	kjvPath := "../models/kjv3m.q8_0.gguf"
	kjv := openTarget(t, kjvPath)
	h, _ := New(1, m.Config.NEmbd, m.Config.VocabSize, out, true)
	h.TopK, h.RankAcc = 1, []float64{0.5}
	h.Tree, _ = BuildTree(h.RankAcc, 1, 1, 1)
	h.Checksum, _ = model.FileChecksum(kjvPath)
	f := filepath.Join(dir, "shape.gguf")
	if err := h.Save(f); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(f, kjv, kjvPath); err == nil || !strings.Contains(err.Error(), "embedding 256") {
		t.Errorf("heads of another shape: %v", err)
	}
}

// TestSafetensorsLayout loads Medusa's published medusa_lm_head layout
// and checks its heads compute what the file's weights say, and that a
// file of other shapes is refused naming the tensor.
func TestSafetensorsLayout(t *testing.T) {
	m := openTarget(t, storiesPath(t))
	d, v := m.Config.NEmbd, m.Config.VocabSize
	rng := rand.New(rand.NewPCG(5, 6))
	vals := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64() * 0.1)
		}
		return x
	}
	mk := func(name string, shape []int64, x []float32) *safetensors.Tensor {
		return &safetensors.Tensor{Name: name, DType: "F32", Shape: shape, Data: f32Bytes(x)}
	}
	w0, b0, o0 := vals(d*d), vals(d), vals(v*d)
	var ts []*safetensors.Tensor
	for k := range 3 {
		w, b, o := vals(d*d), vals(d), vals(v*d)
		if k == 0 {
			w, b, o = w0, b0, o0
		}
		ts = append(ts, mk(itoa(k)+".0.linear.weight", []int64{int64(d), int64(d)}, w),
			mk(itoa(k)+".0.linear.bias", []int64{int64(d)}, b), mk(itoa(k)+".1.weight", []int64{int64(v), int64(d)}, o))
	}
	dir := t.TempDir()
	if err := safetensors.Write(filepath.Join(dir, "medusa_lm_head.safetensors"), ts); err != nil {
		t.Fatal(err)
	}
	h, err := Load(dir, m, "unused: no checksum to compare")
	if err != nil {
		t.Fatal(err)
	}
	if h.K != 3 || h.Tree.Len() != DefaultTreeNodes {
		t.Fatalf("%d heads, tree of %d", h.K, h.Tree.Len())
	}
	x := vals(d)
	got := make([]float32, v)
	s := h.newScratch()
	h.resid(0, x, s.z, s.r)
	h.logits(0, s.r, got)
	for j := 0; j < v; j += 37 {
		var want float64
		for i := range d {
			var z float64
			for c := range d {
				z += float64(w0[i*d+c]) * float64(x[c])
			}
			z += float64(b0[i])
			r := float64(x[i]) + z/(1+math.Exp(-z))
			want += float64(o0[j*d+i]) * r
		}
		if math.Abs(want-float64(got[j])) > 1e-4 {
			t.Fatalf("logit %d: %v, want %v", j, got[j], want)
		}
	}
	ts[4].Shape = []int64{int64(d / 2)}
	ts[4].Data = ts[4].Data[:len(ts[4].Data)/2]
	bad := filepath.Join(dir, "bad.safetensors")
	if err := safetensors.Write(bad, ts); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(bad, m, ""); err == nil || !strings.Contains(err.Error(), "1.0.linear.bias") || !strings.Contains(err.Error(), "embedding 64") {
		t.Errorf("a head of the wrong width: %v", err)
	}
	if _, err := Load(filepath.Join(dir, "missing.safetensors"), m, ""); err == nil {
		t.Error("a missing file loaded")
	}
}

func itoa(k int) string { return string(rune('0' + k)) }

// FuzzFromGGUF feeds the side-file decoder arbitrary bytes: it must
// return heads or an error, never panic.
func FuzzFromGGUF(f *testing.F) {
	out := make([]float32, 5*3)
	h, _ := New(2, 3, 5, out, false)
	h.TopK, h.RankAcc = 2, []float64{0.5, 0.2, 0.3, 0.1}
	h.Tree, _ = BuildTree(h.RankAcc, 2, 2, 4)
	p := filepath.Join(f.TempDir(), "h.gguf")
	if err := h.Save(p); err != nil {
		f.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := gguf.Parse(b)
		if err != nil {
			return
		}
		if h, err := FromGGUF(g); err == nil {
			if err := spec.CheckTree(h.Tree.Parent, h.Tree.Len()); err != nil {
				t.Fatal(err)
			}
		}
	})
}
