package executor

import (
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"pagoda/model"
)

// refTopK sorts every index of row by TopK's order and keeps k.
func refTopK(row []float32, k int) ([]int32, []float32) {
	idx := make([]int32, len(row))
	for i := range idx {
		idx[i] = int32(i)
	}
	slices.SortStableFunc(idx, func(a, b int32) int {
		if before(row[a], a, row[b], b) {
			return -1
		}
		if before(row[b], b, row[a], a) {
			return 1
		}
		return 0
	})
	idx = idx[:min(k, len(row))]
	vals := make([]float32, len(idx))
	for i, j := range idx {
		vals[i] = row[j]
	}
	return idx, vals
}

// TestTopK: rows with ties, NaNs and infinities reduce to what sorting
// the whole row gives, for k from 1 to past the width; and cutting a row
// into slices, reducing each and reducing the union gives the same (what
// a vocabulary split across ranks relies on).
func TestTopK(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 200 {
		width := 1 + rng.IntN(300)
		row := make([]float32, width)
		for i := range row {
			row[i] = float32(rng.IntN(20)) - 10 // many ties
			switch rng.IntN(50) {
			case 0:
				row[i] = float32(math.NaN())
			case 1:
				row[i] = float32(math.Inf(-1))
			case 2:
				row[i] = float32(math.Inf(1))
			}
		}
		for _, k := range []int{1, 2, 5, width, width + 3} {
			ids, vals, err := TopK(row, 1, k, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			wids, wvals := refTopK(row, k)
			if !slices.Equal(ids, wids) || !bitsEqual(vals, wvals) {
				t.Fatalf("trial %d, width %d, k %d: %v %v, want %v %v", trial, width, k, ids, vals, wids, wvals)
			}
			// Split in three, reduce each slice with its offset, then
			// the union.
			var uids []int32
			var uvals []float32
			cuts := []int{0, width / 3, 2 * width / 3, width}
			for s := range 3 {
				part := row[cuts[s]:cuts[s+1]]
				kk := min(k, len(part))
				pi, pv := make([]int32, kk), make([]float32, kk)
				TopKRow(part, int32(cuts[s]), pi, pv)
				uids, uvals = append(uids, pi...), append(uvals, pv...)
			}
			full := make([]float32, width)
			for i := range full {
				full[i] = float32(math.Inf(-1))
			}
			// The union's top k, by the same order, on the union's ids.
			mi, mv := make([]int32, min(k, len(uids))), make([]float32, min(k, len(uids)))
			mergeTop(uids, uvals, mi, mv)
			if !slices.Equal(mi, wids) || !bitsEqual(mv, wvals) {
				t.Fatalf("trial %d, width %d, k %d: merged slices %v, want %v", trial, width, k, mi, wids)
			}
		}
	}
	if _, _, err := TopK(make([]float32, 10), 3, 1, nil, nil); err == nil {
		t.Error("10 logits as 3 rows: no error")
	}
}

// mergeTop is the reduction of candidates (ids, vals) to the first
// len(outIDs) by TopK's order (a test-side twin of the merge a group
// does).
func mergeTop(ids []int32, vals []float32, outIDs []int32, outVals []float32) {
	idx := make([]int, len(ids))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int {
		if before(vals[a], ids[a], vals[b], ids[b]) {
			return -1
		}
		return 1
	})
	for i := range outIDs {
		outIDs[i], outVals[i] = ids[idx[i]], vals[idx[i]]
	}
}

func bitsEqual(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// TestTopKSteps: a step asking for top-k rows, in process and over a
// pipe, returns each logits row's k largest as the whole rows of the
// same step give them, and the wire carries k and the ids; a bad k is
// refused.
func TestTopKSteps(t *testing.T) {
	m := loadModel(t)
	c := &m.Config
	whole := NewLocal(m, model.NewFlatCache(c, 8, c.ContextLen))
	top := NewLocal(m, model.NewFlatCache(c, 8, c.ContextLen))
	toWorker, fromSched := io.Pipe()
	toSched, fromWorker := io.Pipe()
	go func() {
		Serve(toWorker, fromWorker, NewLocal(m, model.NewFlatCache(c, 8, c.ContextLen)))
		fromWorker.Close()
	}()
	defer fromSched.Close()
	remote := NewRemote(toSched, fromSched)
	for i, in := range steps(c.VocabSize) {
		want, err := whole.Execute(&in)
		if err != nil {
			t.Fatal(err)
		}
		k := 1 + i%4
		wids, wvals, _ := TopK(append([]float32(nil), want.Logits...), in.Rows(), k, nil, nil)
		in.TopK = k
		for name, ex := range map[string]Executor{"local": top, "remote": remote} {
			got, err := ex.Execute(&in)
			if err != nil {
				t.Fatalf("step %d %s: %v", i, name, err)
			}
			if len(got.TopIDs) != in.Rows()*k || !slices.Equal(got.TopIDs, wids) || !bitsEqual(got.Logits, wvals) {
				t.Fatalf("step %d %s: top-%d %v %v, want %v %v", i, name, k, got.TopIDs, got.Logits, wids, wvals)
			}
		}
	}
	p, err := AppendStep(nil, &StepInput{Tokens: []int32{1}, Pos: []int32{0}, Seq: []int32{0}, TopK: 3})
	if err != nil {
		t.Fatal(err)
	}
	var back StepInput
	if err := DecodeStep(p, &back); err != nil || back.TopK != 3 {
		t.Fatalf("top-k 3 decoded as %d (%v)", back.TopK, err)
	}
	if _, err := AppendStep(nil, &StepInput{Tokens: []int32{1}, Pos: []int32{0}, Seq: []int32{0}, TopK: -1}); err == nil || !strings.Contains(err.Error(), "top-k -1") {
		t.Errorf("top-k -1: %v", err)
	}
	var out StepOutput
	if err := DecodeOutput(AppendOutput(nil, &StepOutput{Logits: []float32{1, 2}, TopIDs: []int32{5}}), &out); err == nil || !strings.Contains(err.Error(), "1 top-k ids for 2 logits") {
		t.Errorf("mismatched top-k output: %v", err)
	}
	if err := DecodeOutput(AppendOutput(nil, &StepOutput{Logits: []float32{1, 2}}), &out); err != nil || out.TopIDs != nil {
		t.Errorf("a whole-row output after a top-k one: %v, ids %v", err, out.TopIDs)
	}
}
