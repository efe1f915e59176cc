package train

import (
	"encoding/xml"
	"math"
	"path/filepath"
	"slices"
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

// TestBOSWindows: with BOS set every training window starts with the BOS
// token followed by seq-1 consecutive data tokens, each position's target
// the next data token; the held-out loss is over windows of the same
// shape, tiling the held-out data with stride seq-1.
func TestBOSWindows(t *testing.T) {
	c := tinyConfig(true)
	bos := int32(c.Vocab - 1)
	// Data never holds the BOS token, so any BOS in a window was put there.
	data, held := toyData(400, c.Vocab-1, 1), toyData(100, c.Vocab-1, 2)
	o := Options{Batch: 3, Seq: 8, Steps: 6, LR: 3e-3, MinLR: 3e-4, Warmup: 2, Clip: 1, Seed: 5, BOS: true, BOSToken: bos}
	r, err := NewRun(c, o, nil, data, held, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Model.Close()
	offsets := map[int]bool{}
	for !r.Done() {
		if _, _, err := r.TrainStep(); err != nil {
			t.Fatal(err)
		}
		for b := 0; b < o.Batch; b++ {
			in, tgt := r.in[b*o.Seq:(b+1)*o.Seq], r.tgt[b*o.Seq:(b+1)*o.Seq]
			if in[0] != bos {
				t.Fatalf("step %d window %d starts with %d, want BOS %d", r.Step, b, in[0], bos)
			}
			at := findRun(data, tgt)
			if at < 0 {
				t.Fatalf("step %d window %d: targets %v are not consecutive training tokens", r.Step, b, tgt)
			}
			for i := 1; i < o.Seq; i++ {
				if in[i] != data[at+i-1] {
					t.Fatalf("step %d window %d position %d: input %d, want data[%d] = %d", r.Step, b, i, in[i], at+i-1, data[at+i-1])
				}
			}
			offsets[at] = true
		}
	}
	if len(offsets) < 10 {
		t.Errorf("%d distinct window offsets in 18 windows: not random", len(offsets))
	}

	// The held-out loss, recomputed from windows built here.
	got, n, err := r.EvalHeldOut(0)
	if err != nil {
		t.Fatal(err)
	}
	if want := (len(held) - 1) / (o.Seq - 1); n != want {
		t.Fatalf("%d held-out windows, want %d", n, want)
	}
	var sum float64
	for w := 0; w < n; w++ {
		in := append([]int32{bos}, held[w*(o.Seq-1):w*(o.Seq-1)+o.Seq-1]...)
		tgt := held[w*(o.Seq-1) : w*(o.Seq-1)+o.Seq]
		l, err := r.Model.Forward(in, tgt, 1, o.Seq)
		if err != nil {
			t.Fatal(err)
		}
		sum += l
	}
	if want := sum / float64(n); math.Abs(got-want) > 1e-5*math.Abs(want) {
		t.Errorf("BOS held-out loss %v, windows built in the test give %v", got, want)
	}
	plain, _, err := EvalLoss(r.Model, held, o.Seq, o.Batch, 0)
	if err != nil {
		t.Fatal(err)
	}
	if plain == got {
		t.Errorf("BOS-anchored and plain held-out losses are the same (%v): the BOS did not reach the windows", got)
	}
}

// findRun is where tgt occurs in data as a consecutive run, or -1.
func findRun(data, tgt []int32) int {
	for at := 0; at+len(tgt) <= len(data); at++ {
		if slices.Equal(data[at:at+len(tgt)], tgt) {
			return at
		}
	}
	return -1
}

// TestFineTune: a run trained without BOS, saved, continues under BOS
// windows with its weights and moments kept and the schedule restarted:
// warm-up from the start, Steps counted from the fine-tuning point. Plain
// resuming refuses to change the windows.
func TestFineTune(t *testing.T) {
	c := tinyConfig(true)
	data, held := toyData(400, c.Vocab-1, 1), toyData(100, c.Vocab-1, 2)
	o := Options{Batch: 2, Seq: 8, Steps: 5, LR: 3e-3, MinLR: 3e-4, Warmup: 2, Clip: 1, Seed: 9}
	r, err := NewRun(c, o, nil, data, held, 1)
	if err != nil {
		t.Fatal(err)
	}
	for !r.Done() {
		if _, _, err := r.TrainStep(); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "state")
	if err := r.Save(path); err != nil {
		t.Fatal(err)
	}
	saved := slices.Clone(r.Model.Params)
	r.Model.Close()
	bos := int32(c.Vocab - 1)
	if _, err := Resume(path, data, held, 1, func(o *Options) { o.BOS, o.BOSToken = true, bos }); err == nil {
		t.Error("plain resuming changed the windows to BOS-anchored ones")
	}
	st, err := LoadState(path)
	if err != nil {
		t.Fatal(err)
	}
	fo := Options{Batch: 2, Seq: 8, Steps: 4, LR: 1e-3, MinLR: 1e-4, Warmup: 4, Clip: 1, Seed: 9, BOS: true, BOSToken: bos}
	ft, err := FineTune(st, fo, data, held, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer ft.Model.Close()
	if !slices.Equal(ft.Model.Params, saved) {
		t.Fatal("fine-tuning did not start from the saved weights")
	}
	if ft.Done() {
		t.Fatal("the fine-tune is done before its first step: its steps count from the start")
	}
	if lr := ft.LR(); math.Abs(lr-fo.LR/4) > 1e-12 {
		t.Errorf("first fine-tuning step's learning rate %g, want the warm-up's %g", lr, fo.LR/4)
	}
	for !ft.Done() {
		if _, _, err := ft.TrainStep(); err != nil {
			t.Fatal(err)
		}
		if ft.in[0] != bos || ft.in[fo.Seq] != bos {
			t.Fatalf("fine-tuning window starts with %d and %d, want BOS %d", ft.in[0], ft.in[fo.Seq], bos)
		}
	}
	if ft.Step != 9 || len(ft.History) != 9 || ft.Tokens != 9*16 {
		t.Errorf("after the fine-tune: step %d, %d history points, %d tokens; want 9, 9, 144", ft.Step, len(ft.History), ft.Tokens)
	}
	if err := ft.Save(path); err != nil {
		t.Fatal(err)
	}
	again, err := Resume(path, data, held, 1, func(o *Options) { o.Steps = 6 })
	if err != nil {
		t.Fatal(err)
	}
	defer again.Model.Close()
	if !again.Options.BOS || again.SchedStep != 5 || again.Done() {
		t.Errorf("resumed fine-tune: BOS %v, schedule from step %d, done %v; want true, 5, false", again.Options.BOS, again.SchedStep, again.Done())
	}
}
