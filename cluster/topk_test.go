package cluster

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"pagoda/executor"
	"pagoda/kvcache"
	"pagoda/model"
	"pagoda/quant"
	"pagoda/synth"
	"pagoda/testutil"
)

// TestTopKGroup: a step asking for top-k rows, run by a tensor-parallel
// group whose output head splits the vocabulary (each rank ships its
// slice's top k, rank 0 merges) and by a pipeline (the last stage
// reduces) and by both (the last stage's ranks ship their slices' top k
// to its rank 0), returns exactly the top k of the whole rows the same group
// returns for the same step — ids and logit bits — and moves far fewer
// bytes: stories260K (vocabulary 512) and a synthetic llama with a
// 32000-token vocabulary.
func TestTopKGroup(t *testing.T) {
	big := filepath.Join(t.TempDir(), "v32k.gguf")
	sh := synth.Shape{Arch: "llama", Layers: 2, Dim: 64, Heads: 4, KVHeads: 2, HeadDim: 16, FFN: 172, Vocab: 32000, Context: 256, RopeTheta: 10000, RMSEps: 1e-5}
	if err := synth.Write(big, synth.Options{Shape: sh, Type: quant.F32, Seed: 3}); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{filepath.Join(testutil.Shared(t, "models/gguf"), "stories260K.gguf"), big} {
		for _, mode := range []string{"tp", "pp", "tpxpp"} {
			t.Run(fmt.Sprintf("%s/%s", filepath.Base(path), mode), func(t *testing.T) { topKRun(t, path, mode) })
		}
	}
}

func topKRun(t *testing.T, path, mode string) {
	shape := OpenStageShape
	workers := 2
	switch mode {
	case "tp":
		shape = func(p string, o model.Options) (*model.Model, error) { return OpenShape(p, 2, o) }
	case "tpxpp":
		shape = func(p string, o model.Options) (*model.Model, error) { return OpenGridShape(p, 2, o) }
		workers = 4
	}
	coord, err := shape(path, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer coord.Close()
	c := &coord.Config
	kc := kvcache.Config{NLayer: c.NLayer, NKVHead: c.NKVHead, HeadDim: c.HeadDim, BlockSize: 16, NumBlocks: 4, DType: kvcache.F32}
	addrs, ws := startWorkersW(t, path, workers, "")
	var ex interface {
		executor.Executor
		Close() error
	}
	if mode == "tp" {
		ex, err = Connect(addrs, GroupOptions{Model: c, KV: kc, Threads: 1, Timeout: time.Minute})
	} else {
		ex, err = ConnectPipeline(addrs, PipelineOptions{Model: c, KV: kc, Threads: 1, Timeout: time.Minute, MicroBatches: 2, Tensor: workers / 2})
	}
	if err != nil {
		t.Fatal(err)
	}
	defer ex.Close()
	mgr, err := kvcache.New(kc)
	if err != nil {
		t.Fatal(err)
	}
	defer mgr.Close()
	sent := func() (n int64) {
		for _, w := range ws {
			n += w.Sent()
		}
		return n
	}
	toks := []int32{1, 20, 31, 47, 5, 6}
	pos := 0
	for step, rows := range []int{6, 1, 1, 1} {
		in := &executor.StepInput{Tokens: toks[:rows], Logits: make([]bool, rows)}
		for i := range rows {
			in.Pos = append(in.Pos, int32(pos+i))
			in.Seq = append(in.Seq, 0)
			in.Logits[i] = true
		}
		if !mgr.Allocate(0, nil, pos, pos+rows) {
			t.Fatal("no room")
		}
		in.KV = new(model.KVPlan)
		if err := mgr.Plan(in.Pos, in.Seq, nil, in.KV); err != nil {
			t.Fatal(err)
		}
		// The same step twice writes the same K/V to the same slots:
		// once whole, once as top k.
		b0 := sent()
		whole, err := ex.Execute(in)
		if err != nil {
			t.Fatal(err)
		}
		wholeRows := append([]float32(nil), whole.Logits...)
		b1 := sent()
		for _, k := range []int{1, 5} {
			in.TopK = k
			b2 := sent()
			got, err := ex.Execute(in)
			if err != nil {
				t.Fatal(err)
			}
			b3 := sent()
			wids, wvals, _ := executor.TopK(wholeRows, rows, k, nil, nil)
			if !slices.Equal(got.TopIDs, wids) || !bitsEqual(got.Logits, wvals) {
				t.Fatalf("step %d top-%d: %v %v, want %v %v", step, k, got.TopIDs, got.Logits, wids, wvals)
			}
			outWhole := len(executor.AppendOutput(nil, &executor.StepOutput{Logits: wholeRows}))
			outTop := len(executor.AppendOutput(nil, &got))
			t.Logf("step %d (%d rows) top-%d: exact; workers sent %d bytes (whole rows %d), the result frame %d bytes (whole rows %d); per row %.0f bytes saved",
				step, rows, k, b3-b2, b1-b0, outTop, outWhole, float64((b1-b0)-(b3-b2)+int64(outWhole-outTop))/float64(rows))
			if mode != "pp" && b3-b2 >= b1-b0 {
				t.Errorf("step %d top-%d: the workers sent %d bytes, not fewer than whole rows' %d", step, k, b3-b2, b1-b0)
			}
			if outTop >= outWhole {
				t.Errorf("step %d top-%d: a result frame of %d bytes against %d", step, k, outTop, outWhole)
			}
		}
		in.TopK = 0
		pos += rows
		toks = toks[rows:]
		if len(toks) == 0 {
			toks = []int32{7, 8, 9}
		}
	}
}

func bitsEqual(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] && !(a[i] != a[i] && b[i] != b[i]) {
			return false
		}
	}
	return true
}
