package model

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"pagoda/quant"
	"pagoda/testutil"
)

// tpSteps is a prefill of two sequences in one batch, then a decode step
// of each: enough to cross the KV storage and every layer.
func tpSteps() []*Batch {
	return []*Batch{
		{Tokens: []int32{1, 17, 300, 42, 9, 5, 77}, Pos: []int32{0, 1, 2, 3, 0, 1, 2}, Seq: []int32{0, 0, 0, 0, 1, 1, 1},
			Logits: []bool{false, true, false, true, false, false, true}},
		{Tokens: []int32{250, 11}, Pos: []int32{4, 3}, Seq: []int32{0, 1}, Logits: []bool{true, true}},
	}
}

func runSteps(t *testing.T, m *Model) [][]float32 {
	kv := m.NewFlatCache(2, 16)
	var out [][]float32
	for _, b := range tpSteps() {
		l, err := m.Forward(b, kv)
		if err != nil {
			t.Error(err)
			return nil
		}
		out = append(out, l)
	}
	return out
}

// TestTensorParallelModel: the golden llama (GQA 8:2, separate output
// head) loaded as two ranks, each binding only its heads, its slice of the
// feed-forward width and of the vocabulary, run concurrently with the
// partial sums all-reduced in process, gives the whole model's logits.
func TestTensorParallelModel(t *testing.T) {
	dir := testutil.Shared(t, "golden/models")
	// g-qwen3 has a tied output head: the embedding and the head are one
	// vocabulary shard per rank.
	for _, file := range []string{"g-llama-gqa.F32.gguf", "g-llama-gqa.Q8_0.gguf", "g-qwen3.F32.gguf"} {
		path := filepath.Join(dir, file)
		whole, err := Open(path, Options{Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		want := runSteps(t, whole)

		const ranks = 2
		g := NewLocalGroup(ranks)
		ms := make([]*Model, ranks)
		for r := range ms {
			ms[r], err = Open(path, Options{Threads: 1, Rank: r, Ranks: ranks, Group: g})
			if err != nil {
				t.Fatal(err)
			}
			defer ms[r].Close()
		}
		checkShardBinding(t, whole, ms)
		got := make([][][]float32, ranks)
		var wg sync.WaitGroup
		for r := range ms {
			wg.Add(1)
			go func(r int) {
				defer wg.Done()
				got[r] = runSteps(t, ms[r])
			}(r)
		}
		wg.Wait()
		whole.Close()
		if t.Failed() {
			return
		}
		for r := range got {
			for s := range want {
				closeTo(t, file+" rank logits", got[r][s], want[s], 1e-4)
			}
		}
	}
}

// checkShardBinding: each rank holds half the heads and the feed-forward
// width, and its column-parallel weights are exactly the whole's rows in
// its range (views of the file's bytes, not copies).
func checkShardBinding(t *testing.T, whole *Model, ms []*Model) {
	t.Helper()
	wc := whole.Config
	for r, m := range ms {
		c := m.Config
		if c.NHead != wc.NHead/2 || c.NKVHead != wc.NKVHead/2 || c.FFN != wc.FFN/2 || c.NEmbd != wc.NEmbd || c.VocabSize != wc.VocabSize {
			t.Fatalf("rank %d config: heads %d/%d ffn %d", r, c.NHead, c.NKVHead, c.FFN)
		}
		wl, l := whole.W.Layers[0], m.W.Layers[0]
		qrb := wl.Q.RowBytes * wl.Q.Rows / 2
		if !bytes.Equal(l.Q.Data, wl.Q.Data[r*qrb:(r+1)*qrb]) || l.Q.Rows != wl.Q.Rows/2 {
			t.Fatalf("rank %d: q is not rows %d..%d of the whole", r, r*wl.Q.Rows/2, (r+1)*wl.Q.Rows/2)
		}
		rb, _ := quant.RowSize(wl.Down.Type, wl.Down.Cols/2)
		if l.Down.Cols != wl.Down.Cols/2 || l.Down.Rows != wl.Down.Rows || len(l.Down.Data) != rb*l.Down.Rows {
			t.Fatalf("rank %d: down %d×%d, %d bytes", r, l.Down.Rows, l.Down.Cols, len(l.Down.Data))
		}
		if m.W.Output.Rows != wc.VocabSize/2 || m.W.Embd.Rows != wc.VocabSize/2 {
			t.Fatalf("rank %d: output head has %d rows, embedding %d", r, m.W.Output.Rows, m.W.Embd.Rows)
		}
		if e := m.W.embd; e.Lo != r*wc.VocabSize/2 || !bytes.Equal(m.W.Embd.Data, whole.W.Embd.Data[e.Lo*m.W.Embd.RowBytes:e.Hi*m.W.Embd.RowBytes]) {
			t.Fatalf("rank %d: embedding rows are not tokens %d..%d of the whole", r, e.Lo, e.Hi)
		}
	}
}

// TestTensorParallelRefusals: shapes the split cannot serve fail at load
// with the reason.
func TestTensorParallelRefusals(t *testing.T) {
	dir := testutil.Shared(t, "golden/models")
	for _, tc := range []struct {
		file  string
		ranks int
		want  string
	}{
		{"g-llama-gqa.Q4_K.gguf", 2, `"blk.0.attn_output.weight": Q4_K blocks hold 256`}, // 256 columns over 2 ranks
		{"g-llama-gqa.F32.gguf", 3, "query heads"},                                       // 8 heads over 3
		{"g-deepseek2.Q8_0.gguf", 2, "do not split yet"},                                 // MoE and MLA
		{"g-llama-gqa.F32.gguf", 2, "needs a Group"},                                     // no collective
	} {
		o := Options{Threads: 1, Rank: 1, Ranks: tc.ranks, Group: NewLocalGroup(tc.ranks)}
		if tc.want == "needs a Group" {
			o.Group = nil
		}
		m, err := Open(filepath.Join(dir, tc.file), o)
		if err == nil {
			m.Close()
			t.Errorf("%s over %d ranks loaded", tc.file, tc.ranks)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s over %d ranks: %v, want it to mention %q", tc.file, tc.ranks, err, tc.want)
		}
	}
}

// TestTensorParallelReplicatedKV: with fewer KV heads than ranks, each
// rank holds the one KV head its query heads read (replicated across the
// ranks that share it): MQA (4 query heads, 1 KV head) over 2 ranks and
// GQA 8:2 over 4 give the whole model's logits.
func TestTensorParallelReplicatedKV(t *testing.T) {
	dir := testutil.Shared(t, "golden/models")
	for _, tc := range []struct {
		file  string
		ranks int
	}{{"g-llama-mqa.F16.gguf", 2}, {"g-llama-mqa.Q8_0.gguf", 2}, {"g-llama-gqa.F32.gguf", 4}} {
		path := filepath.Join(dir, tc.file)
		whole, err := Open(path, Options{Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		want := runSteps(t, whole)
		wc := whole.Config
		g := NewLocalGroup(tc.ranks)
		ms := make([]*Model, tc.ranks)
		for r := range ms {
			if ms[r], err = Open(path, Options{Threads: 1, Rank: r, Ranks: tc.ranks, Group: g}); err != nil {
				t.Fatal(err)
			}
			c := ms[r].Config
			if c.NKVHead != 1 || c.NHead != wc.NHead/tc.ranks {
				t.Fatalf("%s rank %d: %d heads, %d KV heads", tc.file, r, c.NHead, c.NKVHead)
			}
			// The rank's K rows are its KV head's rows of the whole.
			kvh := r / (tc.ranks / wc.NKVHead)
			wk, k := whole.W.Layers[0].K, ms[r].W.Layers[0].K
			hb := wk.RowBytes * wc.HeadDim
			if !bytes.Equal(k.Data, wk.Data[kvh*hb:(kvh+1)*hb]) {
				t.Fatalf("%s rank %d: K is not KV head %d of the whole", tc.file, r, kvh)
			}
		}
		got := make([][][]float32, tc.ranks)
		var wg sync.WaitGroup
		for r := range ms {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got[r] = runSteps(t, ms[r])
			}()
		}
		wg.Wait()
		for _, m := range ms {
			m.Close()
		}
		whole.Close()
		for r := range got {
			for s := range want {
				closeTo(t, fmt.Sprintf("%s rank %d step %d", tc.file, r, s), got[r][s], want[s], 1e-4)
			}
		}
	}
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{NHead: 12, NKVHead: 3, FFN: 64}, "cannot be replicated evenly"}, // 3 KV heads, 4 ranks
		{Config{NHead: 12, NKVHead: 6, FFN: 64}, "do not split whole"},          // 6 KV heads, 4 ranks
	} {
		if err := checkTP(&c.cfg, tpRank{rank: 0, ranks: 4}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v over 4 ranks: %v, want %q", c.cfg, err, c.want)
		}
	}
}
