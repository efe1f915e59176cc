package executor

import (
	"errors"
	"io"
	"math"
	"pagoda/kvcache"
	"strings"
	"testing"

	"pagoda/model"
	"pagoda/testutil"
)

func loadModel(t *testing.T) *model.Model {
	t.Helper()
	m, err := model.Open(testutil.Shared(t, "models/gguf/stories260K.gguf"), model.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// steps is a small serving-like schedule: two prompts prefilled in one
// batch (one chunked), then decode steps of both, with some rows asking
// for logits and some not.
func steps(vocab int) []StepInput {
	tok := func(i int) int32 { return int32((i*37 + 11) % vocab) }
	var out []StepInput
	// Sequence 3: positions 0..9 whole; sequence 5: positions 0..5 of 12.
	var a StepInput
	for p := range 10 {
		a.Tokens, a.Pos, a.Seq, a.Logits = append(a.Tokens, tok(p)), append(a.Pos, int32(p)), append(a.Seq, 3), append(a.Logits, p == 9)
	}
	for p := range 6 {
		a.Tokens, a.Pos, a.Seq, a.Logits = append(a.Tokens, tok(p+100)), append(a.Pos, int32(p)), append(a.Seq, 5), append(a.Logits, p >= 4)
	}
	out = append(out, a)
	var b StepInput
	b.Tokens, b.Pos, b.Seq, b.Logits = []int32{tok(10)}, []int32{10}, []int32{3}, []bool{true}
	for p := 6; p < 12; p++ {
		b.Tokens, b.Pos, b.Seq, b.Logits = append(b.Tokens, tok(p+100)), append(b.Pos, int32(p)), append(b.Seq, 5), append(b.Logits, p == 11)
	}
	out = append(out, b)
	for i := range 4 {
		out = append(out, StepInput{Tokens: []int32{tok(20 + i), tok(40 + i)}, Pos: []int32{int32(11 + i), int32(12 + i)}, Seq: []int32{3, 5}, Logits: []bool{true, true}})
	}
	// nil marks: only the last row.
	out = append(out, StepInput{Tokens: []int32{tok(1), tok(2)}, Pos: []int32{15, 16}, Seq: []int32{3, 5}})
	return out
}

// TestPipeMatchesLocal sends every step through a byte pipe to an
// executor serving on its own KV storage and compares each output with the
// in-process executor's, bit for bit.
func TestPipeMatchesLocal(t *testing.T) {
	m := loadModel(t)
	c := &m.Config
	local := NewLocal(m, model.NewFlatCache(c, 8, c.ContextLen))

	toWorker, fromSched := io.Pipe()
	toSched, fromWorker := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := Serve(toWorker, fromWorker, NewLocal(m, model.NewFlatCache(c, 8, c.ContextLen)))
		fromWorker.Close()
		done <- err
	}()
	remote := NewRemote(toSched, fromSched)

	for i, in := range steps(c.VocabSize) {
		want, err := local.Execute(&in)
		if err != nil {
			t.Fatalf("step %d: local: %v", i, err)
		}
		want.Logits = append([]float32(nil), want.Logits...)
		got, err := remote.Execute(&in)
		if err != nil {
			t.Fatalf("step %d: remote: %v", i, err)
		}
		if len(got.Logits) != in.Rows()*c.VocabSize || len(got.Logits) != len(want.Logits) {
			t.Fatalf("step %d: %d logits over the pipe, %d in process, %d rows", i, len(got.Logits), len(want.Logits), in.Rows())
		}
		for j := range want.Logits {
			if math.Float32bits(got.Logits[j]) != math.Float32bits(want.Logits[j]) {
				t.Fatalf("step %d: logit %d: %v over the pipe, %v in process", i, j, got.Logits[j], want.Logits[j])
			}
		}
	}

	// A step the worker's model refuses comes back as an error, and the
	// worker keeps serving.
	bad := StepInput{Tokens: []int32{int32(c.VocabSize)}, Pos: []int32{0}, Seq: []int32{7}}
	_, err := remote.Execute(&bad)
	var re *RemoteError
	if !errors.As(err, &re) || !strings.Contains(err.Error(), "out of range") {
		t.Fatalf("bad token: got %v, want a remote out-of-range error", err)
	}
	ok := StepInput{Tokens: []int32{1}, Pos: []int32{0}, Seq: []int32{7}}
	if _, err := remote.Execute(&ok); err != nil {
		t.Fatalf("after an error: %v", err)
	}
	fromSched.Close()
	if err := <-done; err != nil {
		t.Fatalf("serve: %v", err)
	}
}

func TestStepRoundTrip(t *testing.T) {
	for i, in := range steps(512) {
		p, err := AppendStep(nil, &in)
		if err != nil {
			t.Fatal(err)
		}
		var got StepInput
		if err := DecodeStep(p, &got); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if !equalSteps(&got, &in) {
			t.Fatalf("step %d: decoded %+v, want %+v", i, got, in)
		}
	}
	// A tree step: rotary positions by depth, slot moves, hidden states.
	tree := StepInput{Tokens: []int32{5, 6, 7}, Pos: []int32{9, 10, 11}, Seq: []int32{2, 2, 2}, Rope: []int32{9, 10, 10},
		Moves: []int32{40, 38}, Hidden: true, Logits: []bool{true, true, true}}
	for _, in := range []StepInput{tree, {Moves: []int32{1, 2}}, {Tokens: []int32{1}, Pos: []int32{0}, Seq: []int32{0}, Hidden: true}} {
		p, err := AppendStep(nil, &in)
		if err != nil {
			t.Fatal(err)
		}
		var got StepInput
		if err := DecodeStep(p, &got); err != nil || !equalSteps(&got, &in) {
			t.Fatalf("decoded %+v (%v), want %+v", got, err, in)
		}
	}
	if _, err := AppendStep(nil, &StepInput{Tokens: []int32{1}, Pos: []int32{0}, Seq: []int32{0}, Moves: []int32{3}}); err == nil {
		t.Fatal("an odd number of slot-move entries encoded")
	}
	if _, err := AppendStep(nil, &StepInput{Tokens: []int32{1, 2}, Pos: []int32{0}, Seq: []int32{0, 0}}); err == nil {
		t.Fatal("a step with fewer positions than tokens encoded")
	}
	out := StepOutput{Logits: []float32{1, float32(math.Inf(-1)), -0.0, 3.5e-39}}
	var back StepOutput
	if err := DecodeOutput(AppendOutput(nil, &out), &back); err != nil {
		t.Fatal(err)
	}
	for i := range out.Logits {
		if math.Float32bits(back.Logits[i]) != math.Float32bits(out.Logits[i]) {
			t.Fatalf("logit %d: %v, want %v", i, back.Logits[i], out.Logits[i])
		}
	}
}

func equalSteps(a, b *StepInput) bool {
	eq := func(x, y []int32) bool {
		if len(x) != len(y) {
			return false
		}
		for i := range x {
			if x[i] != y[i] {
				return false
			}
		}
		return true
	}
	if !eq(a.Tokens, b.Tokens) || !eq(a.Pos, b.Pos) || !eq(a.Seq, b.Seq) || (a.Logits == nil) != (b.Logits == nil) || len(a.Logits) != len(b.Logits) {
		return false
	}
	if (a.KV == nil) != (b.KV == nil) || (a.Rope == nil) != (b.Rope == nil) || !eq(a.Rope, b.Rope) || !eq(a.Moves, b.Moves) || a.Hidden != b.Hidden || a.TopK != b.TopK {
		return false
	}
	if a.KV != nil {
		pa, pb := planFields(a.KV), planFields(b.KV)
		for i := range pa {
			if !eq(*pa[i], *pb[i]) {
				return false
			}
		}
	}
	for i := range a.Logits {
		if a.Logits[i] != b.Logits[i] {
			return false
		}
	}
	return true
}

// FuzzDecodeStep: no input panics the decoder, and what it accepts
// encodes back to the same bytes.
func FuzzDecodeStep(f *testing.F) {
	for _, in := range steps(512) {
		p, _ := AppendStep(nil, &in)
		f.Add(p)
	}
	f.Add([]byte{kindStep, 255, 255, 255, 255})
	tree := StepInput{Tokens: []int32{5, 6}, Pos: []int32{9, 10}, Seq: []int32{2, 2}, Rope: []int32{9, 9}, Moves: []int32{4, 3}, Hidden: true}
	p, _ := AppendStep(nil, &tree)
	f.Add(p)
	noted := steps(512)[0]
	noted.KV = &model.KVPlan{Runs: []int32{0, 16}, TableOff: []int32{0, 0}, Notes: []model.KVNote{
		{Op: model.NoteBind, Seq: 3, Policy: "h2o:heavy=8,recent=8"}, {Op: model.NoteCommit, Seq: 3, N: 10, Table: []int32{4, -1, 6}},
		{Op: model.NoteCopy, Seq: 9, N: 4}, {Op: model.NoteFree, Seq: 5}}}
	p, _ = AppendStep(nil, &noted)
	f.Add(p)
	f.Fuzz(func(t *testing.T, p []byte) {
		var in StepInput
		if err := DecodeStep(p, &in); err != nil {
			return
		}
		q, err := AppendStep(nil, &in)
		if err != nil {
			t.Fatalf("decoded step does not encode: %v", err)
		}
		if string(q) != string(p) {
			t.Fatalf("re-encoded %x, want %x", q, p)
		}
	})
}

// TestPipePagedPlan: the scheduler's side keeps the block tables in a KV
// manager and plans each step; the worker's paged storage on the far side
// of a byte pipe has never heard of the sequences and stores and attends
// by the step's plan alone (block tables, slot mapping, spans). Its output
// equals the in-process run bit for bit.
func TestPipePagedPlan(t *testing.T) {
	m := loadModel(t)
	c := &m.Config
	kc := kvcache.Config{NLayer: c.NLayer, NKVHead: c.NKVHead, HeadDim: c.HeadDim, BlockSize: 4, NumBlocks: 64, DType: kvcache.F32, Ops: m.Ops()}
	mgr, err := kvcache.New(kc)
	if err != nil {
		t.Fatal(err)
	}
	worker, err := kvcache.NewStorage(kc)
	if err != nil {
		t.Fatal(err)
	}
	local := NewLocal(m, mgr)
	toWorker, fromSched := io.Pipe()
	toSched, fromWorker := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := Serve(toWorker, fromWorker, NewLocal(m, worker))
		fromWorker.Close()
		done <- err
	}()
	remote := NewRemote(toSched, fromSched)
	// Sequence 3 forks nothing, 5 starts after a freed sequence took and
	// returned blocks, so the pages are not simply 0, 1, 2, ….
	if !mgr.Allocate(9, nil, 0, 10) {
		t.Fatal("no room")
	}
	have := map[int32]int{}
	for i, in := range steps(c.VocabSize) {
		if i == 1 {
			mgr.Free(9)
		}
		for j, s := range in.Seq {
			if p := int(in.Pos[j]) + 1; p > have[s] {
				if !mgr.Allocate(s, nil, have[s], p) {
					t.Fatalf("step %d: no room", i)
				}
				have[s] = p
			}
		}
		in.KV = new(model.KVPlan)
		if err := mgr.Plan(in.Pos, in.Seq, nil, in.KV); err != nil {
			t.Fatal(err)
		}
		want, err := local.Execute(&in)
		if err != nil {
			t.Fatalf("step %d: local: %v", i, err)
		}
		got, err := remote.Execute(&in)
		if err != nil {
			t.Fatalf("step %d: remote: %v", i, err)
		}
		if len(got.Logits) != len(want.Logits) || len(got.Logits) == 0 {
			t.Fatalf("step %d: %d logits over the pipe, %d in process", i, len(got.Logits), len(want.Logits))
		}
		for j := range want.Logits {
			if math.Float32bits(got.Logits[j]) != math.Float32bits(want.Logits[j]) {
				t.Fatalf("step %d: logit %d: %v over the pipe, %v in process", i, j, got.Logits[j], want.Logits[j])
			}
		}
	}
	// A plan pointing outside the worker's pages is refused, not obeyed.
	bad := StepInput{Tokens: []int32{1}, Pos: []int32{0}, Seq: []int32{1},
		KV: &model.KVPlan{Runs: []int32{0, 1}, TableOff: []int32{0, 1}, Tables: []int32{1000}, Slots: []int32{4000}, SpanOff: []int32{0, 1}, Spans: []int32{0, 1}}}
	if _, err := remote.Execute(&bad); err == nil || !strings.Contains(err.Error(), "page 1000") {
		t.Fatalf("a plan outside the pool: got %v", err)
	}
	// Storage alone cannot plan: a step without a plan is refused.
	if _, err := remote.Execute(&StepInput{Tokens: []int32{1}, Pos: []int32{0}, Seq: []int32{1}}); err == nil || !strings.Contains(err.Error(), "without a KV plan") {
		t.Fatalf("a step without a plan: got %v", err)
	}
	fromSched.Close()
	if err := <-done; err != nil {
		t.Fatalf("serve: %v", err)
	}
}

// FuzzDecodeOutput: no input panics the output decoder, and what it
// accepts (logits, top-k ids, hidden states, KV reports) encodes to bytes
// that decode to the same output.
func FuzzDecodeOutput(f *testing.F) {
	outs := []StepOutput{
		{Logits: []float32{1, 2, 3}},
		{Logits: []float32{0.5}, TopIDs: []int32{7}, Busy: 3},
		{Logits: []float32{1}, Hidden: []float32{4, 5}, KV: []model.KVReport{{Seq: 2, Sealed: -1, Dead: []int32{0, 3}}, {Seq: 5, Sealed: 40}}},
	}
	for _, o := range outs {
		f.Add(AppendOutput(nil, &o))
	}
	f.Add([]byte{kindReport, 255, 255, 255, 255})
	f.Fuzz(func(t *testing.T, p []byte) {
		var a, b StepOutput
		if err := DecodeOutput(p, &a); err != nil {
			return
		}
		q := AppendOutput(nil, &a)
		if err := DecodeOutput(q, &b); err != nil {
			t.Fatalf("re-encoded output does not decode: %v", err)
		}
		if r := AppendOutput(nil, &b); string(r) != string(q) {
			t.Fatalf("re-encoded %x, then %x", q, r)
		}
	})
}
