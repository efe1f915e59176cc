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
	for P := 2; P <= 4; P++ {
		contiguous := make([][][2]int, P)
		zigzag := make([][][2]int, P)
		cut := func(i int) int { // uneven
			if i == 0 || i == P {
				return i * T / P
			}
			return i*T/P + (i%2)*37 - 11
		}
		for i := range P {
			contiguous[i] = [][2]int{{cut(i), cut(i + 1)}}
			z := ring.Zigzag(T, P, i)
			zigzag[i] = z[:]
		}
		seqLayout(t, path, opts, tokens, want, wantDec, "contiguous", contiguous)
		seqLayout(t, path, opts, tokens, want, wantDec, "zigzag", zigzag)
	}
}

// runsBatch is the rows of runs (half-open position ranges), every row's
// logits wanted.
func runsBatch(tokens []int32, runs [][2]int) *Batch {
	b := &Batch{}
	for _, r := range runs {
		c := chunkBatch(tokens, r[0], r[1])
		b.Tokens, b.Pos = append(b.Tokens, c.Tokens...), append(b.Pos, c.Pos...)
		b.Seq, b.Logits = append(b.Seq, c.Seq...), append(b.Logits, c.Logits...)
	}
	return b
}

// seqLayout runs the prompt over len(layout) ranks, rank i holding the
// runs layout[i], then two decode steps, against the single process's
// logits (want: every prompt row; wantDec: each decode step).
func seqLayout(t *testing.T, path string, opts Options, tokens []int32, want []float32, wantDec [][]float32, name string, layout [][][2]int) {
	P, T := len(layout), len(tokens)-2
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
	V := len(wantDec[0])
	got := make([][]float32, P)
	errs := make([]error, P)
	var wg sync.WaitGroup
	for i := range P {
		wg.Go(func() { got[i], errs[i] = ranks[i].Prefill(runsBatch(tokens, layout[i])) })
	}
	wg.Wait()
	var worst, last float64
	tail, held := -1, make([]int, P)
	for i := range P {
		if errs[i] != nil {
			t.Fatalf("%s P=%d rank %d prefill: %v", name, P, i, errs[i])
		}
		off := 0
		for _, r := range layout[i] {
			n := (r[1] - r[0]) * V
			closeTo(t, name+" prefill logits", got[i][off:off+n], want[r[0]*V:r[1]*V], 1e-4)
			worst = max(worst, maxAbsDiff(got[i][off:off+n], want[r[0]*V:r[1]*V]))
			if r[1] == T {
				tail, last = i, maxAbsDiff(got[i][off+n-V:off+n], want[(T-1)*V:])
			}
			off, held[i] = off+n, held[i]+r[1]-r[0]
		}
		if ranks[i].Len() != held[i] {
			t.Fatalf("%s P=%d rank %d holds %d positions, want %d", name, P, i, ranks[i].Len(), held[i])
		}
	}
	t.Logf("%s P=%d %v: prefill logits max |Δ| %.3g (last token, on rank %d: %.3g)", name, P, layout, worst, tail, last)
	for step := range 2 {
		for i := range P {
			wg.Go(func() { got[i], errs[i] = ranks[i].Decode(chunkBatch(tokens, T+step, T+step+1)) })
		}
		wg.Wait()
		for i := range P {
			if errs[i] != nil {
				t.Fatalf("%s P=%d rank %d decode: %v", name, P, i, errs[i])
			}
			if !slices.Equal(got[i], got[0]) {
				t.Fatalf("%s P=%d decode %d: rank %d's logits differ from rank 0's", name, P, step, i)
			}
		}
		closeTo(t, name+" decode logits", got[0], wantDec[step], 1e-4)
		t.Logf("%s P=%d decode %d: max |Δ| %.3g", name, P, step, maxAbsDiff(got[0], wantDec[step]))
	}
	for i := range P {
		if w := held[i] + 2*b2i(i == tail); ranks[i].Len() != w {
			t.Fatalf("%s P=%d after decode: rank %d holds %d positions, want %d (the tail is on rank %d)", name, P, i, ranks[i].Len(), w, tail)
		}
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestSequenceParallelRefusals: rows out of order, before the rank's own,
// a decode before the prompt or not right after it are refused with the
// reason, and a rank whose link is cut makes the
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
	if _, err := ranks[0].Prefill(&Batch{Tokens: tokens[:2], Pos: []int32{2, 1}, Seq: []int32{0, 0}}); err == nil || !strings.Contains(err.Error(), "increasing") {
		t.Fatalf("rows out of order: %v", err)
	}
	if _, err := ranks[0].Decode(chunkBatch(tokens, 0, 1)); err == nil || !strings.Contains(err.Error(), "before any prefill") {
		t.Fatalf("decode before prefill: %v", err)
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
	if _, err := ranks[0].Prefill(chunkBatch(tokens, 2, 3)); err == nil || !strings.Contains(err.Error(), "do not follow") {
		t.Fatalf("rows before the rank's last: %v", err)
	}
	if _, err := ranks[0].Decode(chunkBatch(tokens, 7, 8)); err == nil || !strings.Contains(err.Error(), "right after the sequence") {
		t.Fatalf("decode inside the sequence: %v", err)
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

// TestSequenceParallelReset: two ranks run one sequence (a 200-token
// prompt, zigzag, and a decode step), reset, and run another whose
// one-token prompt leaves rank 1 without rows (it passes its empty runs
// around the ring in every layer); the second sequence's logits are the
// single process's for it alone, within 1e-4 — nothing of the first
// leaks into it — and rank 1 holds nothing.
func TestSequenceParallelReset(t *testing.T) {
	path := filepath.Join(testutil.Shared(t, "golden/models"), "g-llama-gqa.F32.gguf")
	opts := Options{Threads: 1, ContextLen: 512}
	whole, err := Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	first := make([]int32, 201)
	for i := range first {
		first[i] = int32(1 + (i*37)%500)
	}
	second := []int32{1, 77, 300}
	kv := whole.NewFlatCache(1, 8)
	var want [][]float32
	for p := range second {
		l, err := whole.Forward(chunkBatch(second, p, p+1), kv)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, l)
	}
	ranks := make([]*SeqRank, 2)
	for i, l := range seqLinks(t, 2, 20*time.Second) {
		m, err := Open(path, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		if ranks[i], err = NewSeqRank(m, l); err != nil {
			t.Fatal(err)
		}
	}
	step := func(f func(i int) ([]float32, error)) [][]float32 {
		got, errs := make([][]float32, 2), make([]error, 2)
		var wg sync.WaitGroup
		for i := range 2 {
			wg.Go(func() { got[i], errs[i] = f(i) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("rank %d: %v", i, err)
			}
		}
		return got
	}
	step(func(i int) ([]float32, error) {
		z := ring.Zigzag(200, 2, i)
		return ranks[i].Prefill(runsBatch(first, z[:]))
	})
	step(func(i int) ([]float32, error) { return ranks[i].Decode(chunkBatch(first, 200, 201)) })
	for _, r := range ranks {
		r.Reset()
	}
	got := step(func(i int) ([]float32, error) {
		if i == 1 {
			return ranks[i].Prefill(&Batch{})
		}
		return ranks[i].Prefill(chunkBatch(second, 0, 1))
	})
	if len(got[1]) != 0 || ranks[1].Len() != 0 || ranks[0].Len() != 1 {
		t.Fatalf("after a one-token prompt: rank 1 returned %d logits and holds %d, rank 0 holds %d", len(got[1]), ranks[1].Len(), ranks[0].Len())
	}
	closeTo(t, "prompt logits after a reset", got[0], want[0], 1e-4)
	for p := 1; p < len(second); p++ {
		got := step(func(i int) ([]float32, error) { return ranks[i].Decode(chunkBatch(second, p, p+1)) })
		closeTo(t, "decode logits after a reset", got[0], want[p], 1e-4)
		if !slices.Equal(got[0], got[1]) {
			t.Fatalf("decode %d: the ranks' logits differ", p)
		}
	}
}
