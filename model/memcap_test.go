package model

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"pagoda/quant"
	"pagoda/synth"
	"pagoda/testutil"
)

// TestMaxMemory: a cap below the whole model's weight matrices refuses it
// with a *MemoryError naming the bytes, before anything is repacked; the
// same cap takes a tensor-parallel rank's shard and a pipeline stage,
// which bind less; Reserve's bytes count against the cap too.
func TestMaxMemory(t *testing.T) {
	path := filepath.Join(testutil.Shared(t, "golden/models"), "g-llama-mqa.F16.gguf")
	whole, err := Open(path, Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	all := whole.WeightBytes()
	whole.Close()
	var sum int64
	for _, mat := range whole.W.Matrices() {
		sum += int64(len(mat.Data))
	}
	if all != sum || all == 0 {
		t.Fatalf("WeightBytes %d, matrices hold %d", all, sum)
	}
	limit := all * 3 / 4
	_, err = Open(path, Options{Threads: 1, MaxMemory: limit})
	var me *MemoryError
	if !errors.As(err, &me) || me.Weights != all || me.Cap != limit || me.Reserve != 0 {
		t.Fatalf("whole model under a cap of %d: %v", limit, err)
	}
	if !strings.Contains(err.Error(), fmt.Sprintf("needs %d bytes", all)) || !strings.Contains(err.Error(), fmt.Sprintf("cap of %d bytes", limit)) {
		t.Errorf("error does not name the bytes: %v", err)
	}
	if m, err := Open(path, Options{Threads: 1, MaxMemory: all}); err != nil {
		t.Errorf("a cap of exactly the weights: %v", err)
	} else {
		m.Close()
	}

	// A rank's shard and a stage fit the cap the whole model does not;
	// Reserve sees the local configuration.
	var seen []string
	reserve := func(c *Config, st Stage) (int64, error) {
		seen = append(seen, fmt.Sprintf("kv heads %d %v", c.NKVHead, st))
		return 1000, nil
	}
	for _, o := range []Options{
		{Rank: 1, Ranks: 2, Group: NewLocalGroup(2)},
		{Stage: Stage{Lo: 0, Hi: 1}},
	} {
		o.Threads, o.MaxMemory, o.Reserve = 1, limit, reserve
		m, err := Open(path, o)
		if err != nil {
			t.Fatalf("rank %d/%d stage %v under %d: %v", o.Rank, o.Ranks, o.Stage, o.MaxMemory, err)
		}
		if b := m.WeightBytes(); b >= all || b+1000 > o.MaxMemory {
			t.Errorf("rank %d/%d stage %v binds %d of %d", o.Rank, o.Ranks, o.Stage, b, all)
		}
		part := m.WeightBytes()
		m.Close()
		// The reserve tips it over: refused with both parts named.
		o.MaxMemory = part + 999
		_, err = Open(path, o)
		if !errors.As(err, &me) || me.Weights != part || me.Reserve != 1000 || me.Need() != part+1000 {
			t.Errorf("rank %d/%d stage %v with a reserve over the cap: %v", o.Rank, o.Ranks, o.Stage, err)
		}
	}
	// MQA: the one KV head is replicated on both ranks.
	if want := fmt.Sprintf("kv heads 1 layers [0, %d)", whole.Config.NLayer); seen[0] != want {
		t.Errorf("Reserve saw %q, want %q", seen[0], want)
	}
	if want := fmt.Sprintf("kv heads %d layers [0, 1)", whole.Config.NKVHead); seen[2] != want {
		t.Errorf("Reserve saw %q, want %q", seen[2], want)
	}
	// A Reserve that fails fails the open.
	if _, err := Open(path, Options{Threads: 1, MaxMemory: all * 2, Reserve: func(*Config, Stage) (int64, error) {
		return 0, errors.New("bad KV spec")
	}}); err == nil || !strings.Contains(err.Error(), "bad KV spec") {
		t.Errorf("failing Reserve: %v", err)
	}
}

// TestMaxMemoryShardBytes: the bytes a tensor-parallel rank is checked
// for, counted before its shards are cut (and copied), are the bytes its
// shards hold after: a cap of exactly them loads, one byte less is
// refused naming them. Q8_0 (row splits cut whole blocks) and F32, GQA
// and MQA (a KV head replicated on both ranks), two and four ranks.
func TestMaxMemoryShardBytes(t *testing.T) {
	dir := testutil.Shared(t, "golden/models")
	for _, c := range []struct {
		file  string
		ranks int
	}{{"g-llama-gqa.Q8_0.gguf", 2}, {"g-llama-gqa.F32.gguf", 4}, {"g-llama-mqa.Q8_0.gguf", 2}} {
		path := filepath.Join(dir, c.file)
		for r := 0; r < c.ranks; r++ {
			o := Options{Threads: 1, Rank: r, Ranks: c.ranks, Group: NewLocalGroup(c.ranks)}
			m, err := Open(path, o)
			if err != nil {
				t.Fatalf("%s rank %d/%d: %v", c.file, r, c.ranks, err)
			}
			held := m.WeightBytes()
			m.Close()
			o.MaxMemory = held - 1
			_, err = Open(path, o)
			var me *MemoryError
			if !errors.As(err, &me) || me.Weights != held {
				t.Errorf("%s rank %d/%d holds %d bytes; under a cap of %d: %v", c.file, r, c.ranks, held, held-1, err)
			}
			o.MaxMemory = held
			if m, err := Open(path, o); err != nil {
				t.Errorf("%s rank %d/%d under a cap of its %d bytes: %v", c.file, r, c.ranks, held, err)
			} else {
				m.Close()
			}
		}
	}
}

// TestMaxMemoryCombinedMLA: an older deepseek2 file's combined attn_kv_b,
// rebuilt as per-head F32 matrices at load, is counted at their size
// before they are built.
func TestMaxMemoryCombinedMLA(t *testing.T) {
	sh := synth.Shape{Arch: "deepseek2", Layers: 2, Dim: 64, Heads: 4, KVHeads: 2, FFN: 96, Vocab: 300, Context: 64,
		Experts: 4, ExpertsUsed: 2, ExpertFFN: 32, DenseLead: 1, KVLoRA: 32, QKNope: 16, QKRope: 8, VHead: 16, MLACombined: true}
	path := filepath.Join(t.TempDir(), "mla.gguf")
	if err := synth.Write(path, synth.Options{Shape: sh, Type: quant.Q8_0, Std: 0.1}); err != nil {
		t.Fatal(err)
	}
	m, err := Open(path, Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	held := m.WeightBytes()
	if len(m.W.Layers[0].KB) == 0 {
		t.Fatal("the file's attn_kv_b was not split at load")
	}
	m.Close()
	_, err = Open(path, Options{Threads: 1, MaxMemory: held - 1})
	var me *MemoryError
	if !errors.As(err, &me) || me.Weights != held {
		t.Errorf("holds %d bytes; under a cap of %d: %v", held, held-1, err)
	}
	if m, err := Open(path, Options{Threads: 1, MaxMemory: held}); err != nil {
		t.Errorf("under a cap of its %d bytes: %v", held, err)
	} else {
		m.Close()
	}
}
