package model

import (
	"math"
	"math/rand/v2"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"pagoda/ring"
	"pagoda/testutil"
)

// seqLinks joins P ring ranks over TCP on 127.0.0.1.
func seqLinks(t *testing.T, P int, timeout time.Duration) []*ring.Link {
	t.Helper()
	lns := make([]net.Listener, P)
	addrs := make([]string, P)
	for i := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		lns[i], addrs[i] = ln, ln.Addr().String()
	}
	links := make([]*ring.Link, P)
	errs := make([]error, P)
	session := rand.Uint64()
	var wg sync.WaitGroup
	for r := range P {
		wg.Go(func() { links[r], errs[r] = ring.Join(r, lns[r], addrs, session, timeout) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		t.Cleanup(func() { links[r].Close() })
	}
	return links
}

func maxAbsDiff(a, b []float32) float64 {
	var d float64
	for i := range a {
		d = max(d, math.Abs(float64(a[i]-b[i])))
	}
	return d
}

// chunkBatch is rows [lo, hi) of tokens at their positions, every row's
// logits wanted.
func chunkBatch(tokens []int32, lo, hi int) *Batch {
	b := &Batch{Tokens: tokens[lo:hi], Pos: make([]int32, hi-lo), Seq: make([]int32, hi-lo), Logits: make([]bool, hi-lo)}
	for i := range b.Pos {
		b.Pos[i], b.Logits[i] = int32(lo+i), true
	}
	return b
}

// TestSequenceParallelModel: the golden GQA llama (and the two-layer qwen2,
// with biases and NEOX rope) as P = 2, 3, 4 ranks over TCP, each holding
// a contiguous, uneven chunk of a 600-token (300) prompt and
// its K/V, gives the single-process model's logits at every position
// (the last token's included) within 1e-4; then two decode steps, the same
// on every rank, attend the distributed K/V and give the single process's
// next logits, bit for bit the same on every rank.
func TestSequenceParallelModel(t *testing.T) {
	dir := testutil.Shared(t, "golden/models")
	for _, tc := range []struct {
		file string
		T    int
	}{{"g-llama-gqa.F32.gguf", 600}, {"g-qwen2.F32.gguf", 300}} {
		t.Run(tc.file, func(t *testing.T) { seqParallelModel(t, filepath.Join(dir, tc.file), tc.T) })
	}
}

func seqParallelModel(t *testing.T, path string, T int) {
	opts := Options{Threads: 1, ContextLen: 1024}
	whole, err := Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	r := rand.New(rand.NewPCG(11, 12))
	tokens := make([]int32, T+2)
	tokens[0] = 1
	for i := 1; i < len(tokens); i++ {
		tokens[i] = int32(2 + r.IntN(whole.Config.VocabSize-2))
	}
	kv := whole.NewFlatCache(1, T+2)
	want, err := whole.Forward(chunkBatch(tokens, 0, T), kv)
	if err != nil {
		t.Fatal(err)
	}
	var wantDec [][]float32
	for p := T; p < T+2; p++ {
		l, err := whole.Forward(chunkBatch(tokens, p, p+1), kv)
		if err != nil {
			t.Fatal(err)
		}
		wantDec = append(wantDec, l)
	}
	V := whole.Config.VocabSize
	for P := 2; P <= 4; P++ {
		cuts := []int{0}
		for i := 1; i < P; i++ {
			cuts = append(cuts, i*T/P+(i%2)*37-11)
		}
		cuts = append(cuts, T)
		ranks := make([]*SeqRank, P)
		for i, l := range seqLinks(t, P, 20*time.Second) {
			m, err := Open(path, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if ranks[i], err = NewSeqRank(m, l); err != nil {
				t.Fatal(err)
			}
		}
		got := make([][]float32, P)
		errs := make([]error, P)
		var wg sync.WaitGroup
		for i := range P {
			wg.Go(func() { got[i], errs[i] = ranks[i].Prefill(chunkBatch(tokens, cuts[i], cuts[i+1])) })
		}
		wg.Wait()
		var worst float64
		for i := range P {
			if errs[i] != nil {
				t.Fatalf("P=%d rank %d prefill: %v", P, i, errs[i])
			}
			lo, hi := cuts[i], cuts[i+1]
			if ranks[i].Len() != hi-lo {
				t.Fatalf("P=%d rank %d holds %d positions, want %d", P, i, ranks[i].Len(), hi-lo)
			}
			closeTo(t, "prefill logits", got[i], want[lo*V:hi*V], 1e-4)
			worst = max(worst, maxAbsDiff(got[i], want[lo*V:hi*V]))
		}
		last := got[P-1][len(got[P-1])-V:]
		t.Logf("P=%d chunks %v: prefill logits max |Δ| %.3g (last token %.3g)", P, cuts, worst, maxAbsDiff(last, want[(T-1)*V:]))
		for step := range 2 {
			for i := range P {
				wg.Go(func() { got[i], errs[i] = ranks[i].Decode(chunkBatch(tokens, T+step, T+step+1)) })
			}
			wg.Wait()
			for i := range P {
				if errs[i] != nil {
					t.Fatalf("P=%d rank %d decode: %v", P, i, errs[i])
				}
				if !slices.Equal(got[i], got[0]) {
					t.Fatalf("P=%d decode %d: rank %d's logits differ from rank 0's", P, step, i)
				}
			}
			closeTo(t, "decode logits", got[0], wantDec[step], 1e-4)
			t.Logf("P=%d decode %d: max |Δ| %.3g", P, step, maxAbsDiff(got[0], wantDec[step]))
		}
		if ranks[P-1].Len() != T-cuts[P-1]+2 || ranks[0].Len() != cuts[1] {
			t.Fatalf("after decode: the last rank holds %d positions, the first %d", ranks[P-1].Len(), ranks[0].Len())
		}
	}
}

// TestSequenceParallelRefusals: a batch that does not continue the rank's
// slice is refused with the reason, and a rank whose link is cut makes the
// others' step fail rather than hang.
func TestSequenceParallelRefusals(t *testing.T) {
	path := filepath.Join(testutil.Shared(t, "golden/models"), "g-llama-gqa.F32.gguf")
	links := seqLinks(t, 2, 2*time.Second)
	ranks := make([]*SeqRank, 2)
	for i := range ranks {
		m, err := Open(path, Options{Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		if ranks[i], err = NewSeqRank(m, links[i]); err != nil {
			t.Fatal(err)
		}
		if _, err := NewSeqRank(m, links[i]); err == nil {
			t.Fatal("made a sequence-parallel rank of a model twice")
		}
	}
	tokens := []int32{1, 5, 9, 13, 17, 21, 25, 29}
	if _, err := ranks[0].Prefill(&Batch{Tokens: tokens[:2], Pos: []int32{0, 2}, Seq: []int32{0, 0}}); err == nil || !strings.Contains(err.Error(), "consecutive") {
		t.Fatalf("gapped rows: %v", err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range 2 {
		wg.Go(func() { _, errs[i] = ranks[i].Prefill(chunkBatch(tokens, 4*i, 4*i+4)) })
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	if _, err := ranks[0].Prefill(chunkBatch(tokens, 6, 7)); err == nil || !strings.Contains(err.Error(), "do not continue") {
		t.Fatalf("rows past another rank's: %v", err)
	}
	links[1].Close()
	start := time.Now()
	_, err := ranks[0].Decode(chunkBatch([]int32{1, 2, 3, 4, 5, 6, 7, 8, 9}, 8, 9))
	if err == nil || !strings.Contains(err.Error(), "sequence parallel") {
		t.Fatalf("decode over a cut link: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("decode over a cut link took %v to fail", d)
	}
	if _, err := ranks[0].Decode(chunkBatch([]int32{1, 2, 3, 4, 5, 6, 7, 8, 9}, 8, 9)); err == nil {
		t.Fatal("a broken rank ran another step")
	}
}
