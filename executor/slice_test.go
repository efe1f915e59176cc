package executor

import (
	"math"
	"testing"
	"time"

	"pagoda/kvcache"
	"pagoda/model"
)

// TestSlicedSteps: every step of the schedule, planned by a KV manager,
// cut by rows into up to three slices (a sequence's rows split across
// slices too) that run one after another on a storage that knows only the
// plans, gives the whole step's logits bit for bit once the slices'
// outputs are concatenated in row order.
func TestSlicedSteps(t *testing.T) {
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
	local, sliced := NewLocal(m, mgr), NewLocal(m, worker)
	have := map[int32]int{}
	for i, in := range steps(c.VocabSize) {
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
			t.Fatalf("step %d: %v", i, err)
		}
		var got []float32
		T := len(in.Tokens)
		k := min(3, T)
		for p := range k {
			sl, err := in.Slice(p*T/k, (p+1)*T/k)
			if err != nil {
				t.Fatalf("step %d slice %d: %v", i, p, err)
			}
			out, err := sliced.Execute(sl)
			if err != nil {
				t.Fatalf("step %d slice %d: %v", i, p, err)
			}
			got = append(got, out.Logits...)
		}
		if len(got) != len(want.Logits) {
			t.Fatalf("step %d: %d logits from %d slices, %d whole", i, len(got), k, len(want.Logits))
		}
		for j := range got {
			if math.Float32bits(got[j]) != math.Float32bits(want.Logits[j]) {
				t.Fatalf("step %d: logit %d: %v sliced, %v whole", i, j, got[j], want.Logits[j])
			}
		}
	}
	in := steps(c.VocabSize)[0]
	for _, r := range [][2]int{{-1, 2}, {3, 3}, {0, len(in.Tokens) + 1}} {
		if _, err := in.Slice(r[0], r[1]); err == nil {
			t.Errorf("slice %v of %d rows: no error", r, len(in.Tokens))
		}
	}
}

// TestBusyRoundTrip: an output's measured compute time crosses the wire
// with it, and an output without one still decodes.
func TestBusyRoundTrip(t *testing.T) {
	for _, out := range []StepOutput{{Logits: []float32{1, 2}, Busy: 1234567 * time.Nanosecond}, {Busy: time.Second}, {Logits: []float32{3}},
		{Logits: []float32{3}, Hidden: []float32{0.5, -1, 2}}, {Logits: []float32{3}, Hidden: []float32{7}, Busy: time.Millisecond}} {
		var back StepOutput
		if err := DecodeOutput(AppendOutput(nil, &out), &back); err != nil {
			t.Fatal(err)
		}
		if back.Busy != out.Busy || len(back.Logits) != len(out.Logits) || len(back.Hidden) != len(out.Hidden) {
			t.Errorf("%+v came back as %+v", out, back)
		}
		for i := range out.Hidden {
			if back.Hidden[i] != out.Hidden[i] {
				t.Errorf("hidden %d: %v, want %v", i, back.Hidden[i], out.Hidden[i])
			}
		}
	}
}
