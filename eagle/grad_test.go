package eagle

import (
	"math"
	"testing"

	"pagoda/model"
	"pagoda/testutil"
	"pagoda/train"
)

func openStories(t *testing.T) (*model.Model, string) {
	t.Helper()
	p := testutil.Shared(t, "models/gguf/stories260K.gguf")
	m, err := model.Open(p, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, p
}

// randomData is sequences of random tokens with random features, enough
// for checks that do not need the target's real features.
func randomData(s Shape, lens []int, seed uint64) *Data {
	rng := train.NewRNG(seed)
	d := &Data{}
	for _, n := range lens {
		seq := make([]int32, n)
		for i := range seq {
			seq[i] = int32(rng.Intn(s.Vocab))
		}
		f := make([]float32, n*s.D)
		for i := range f {
			f[i] = float32(rng.Normal())
		}
		d.Seqs = append(d.Seqs, seq)
		d.Feats = append(d.Feats, f)
	}
	return d
}

// TestGradient checks the draft's backward (FC, attention with RoPE and
// GQA, RMSNorm, SwiGLU, through the frozen head) against central finite
// differences of the EAGLE loss, on two sequences in one batch.
func TestGradient(t *testing.T) {
	m, _ := openStories(t)
	d, err := newDraft(ShapeOf(&m.Config, 24), m, "")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	d.init(3)
	rng := train.NewRNG(5)
	for i := range d.Params {
		d.Params[i] += float32(0.05 * rng.Normal())
	}
	if err := d.ensureHead(); err != nil {
		t.Fatal(err)
	}
	o := DefaultTrainOptions()
	o.Noise, o.WCls = 0, 0.5 // a larger class weight exercises the head's path
	tr := newTrainer(d, o)
	data := randomData(d.Shape, []int{6, 4}, 9)
	batch := []int{0, 1}
	if _, _, err := tr.grad(data, batch, true); err != nil {
		t.Fatal(err)
	}
	grads := append([]float32(nil), tr.grads...)
	checked := 0
	for _, ts := range d.Shape.tensors() {
		for k := range 6 {
			i := ts.off + (k*7919)%ts.size()
			old := d.Params[i]
			const h = 1e-2
			d.Params[i] = old + h
			lp, _, _ := tr.grad(data, batch, false)
			d.Params[i] = old - h
			lm, _, _ := tr.grad(data, batch, false)
			d.Params[i] = old
			num := (lp - lm) / (2 * h)
			an := float64(grads[i])
			if math.Abs(num-an) > 2e-3*math.Max(1e-2, math.Max(math.Abs(num), math.Abs(an)))+2e-6 {
				t.Errorf("%s[%d]: analytic %.6g, numeric %.6g", ts.name, i-ts.off, an, num)
			}
			checked++
		}
	}
	t.Logf("%d gradients checked", checked)
}
