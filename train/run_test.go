package train

import (
	"encoding/xml"
	"path/filepath"
	"strings"
	"testing"
)

func toyData(n int, vocab int, seed uint64) []int32 {
	// A repeating pattern with noise: learnable, not trivial.
	r := NewRNG(seed)
	out := make([]int32, n)
	for i := range out {
		out[i] = int32((i*7 + i/5) % vocab)
		if r.Intn(10) == 0 {
			out[i] = int32(r.Intn(vocab))
		}
	}
	return out
}

// TestResumeIsExact: a run saved halfway and resumed ends with exactly the
// weights of the same run done in one go (same batches, same moments).
func TestResumeIsExact(t *testing.T) {
	c := tinyConfig(true)
	o := Options{Batch: 2, Seq: 8, Steps: 10, LR: 3e-3, MinLR: 3e-4, Warmup: 3, WeightDecay: 0.1, Clip: 1, Seed: 9}
	data, held := toyData(500, c.Vocab, 1), toyData(100, c.Vocab, 2)
	whole, err := NewRun(c, o, nil, data, held, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Model.Close()
	for !whole.Done() {
		if _, _, err := whole.TrainStep(); err != nil {
			t.Fatal(err)
		}
	}
	half, err := NewRun(c, o, nil, data, held, 1)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		if _, _, err := half.TrainStep(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := half.HeldOutLoss(4); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "state")
	if err := half.Save(path); err != nil {
		t.Fatal(err)
	}
	half.Model.Close()
	res, err := Resume(path, data, held, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Model.Close()
	if res.Step != 5 || len(res.History) != 5 || !res.History[4].HasHeldOut {
		t.Fatalf("resumed at step %d with %d history points", res.Step, len(res.History))
	}
	for !res.Done() {
		if _, _, err := res.TrainStep(); err != nil {
			t.Fatal(err)
		}
	}
	for i, p := range whole.Model.Params {
		if res.Model.Params[i] != p {
			t.Fatalf("parameter %d: resumed run %v, one-go run %v", i, res.Model.Params[i], p)
		}
	}
	if _, err := Resume(path, data, held, 1, func(o *Options) { o.Seq = 4 }); err == nil {
		t.Error("resuming with another sequence length was accepted")
	}
}

func TestWriteSVG(t *testing.T) {
	hist := []Point{{Step: 1, Tokens: 100, Loss: 5}, {Step: 2, Tokens: 200, Loss: 4, HeldOut: 4.2, HasHeldOut: true}, {Step: 3, Tokens: 300, Loss: 3.5}}
	var b strings.Builder
	if err := WriteSVG(&b, hist, "a <test>", 2); err != nil {
		t.Fatal(err)
	}
	s := b.String()
	for _, want := range []string{"<svg", "a &lt;test&gt;", "<polyline", "<circle", "</svg>"} {
		if !strings.Contains(s, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
	if err := xml.Unmarshal([]byte(s), new(struct{})); err != nil {
		t.Errorf("SVG is not well-formed XML: %v", err)
	}
	if WriteSVG(&b, nil, "", 1) == nil {
		t.Error("an empty history drew a curve")
	}
}
