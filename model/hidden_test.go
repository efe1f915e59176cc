package model_test

import (
	"testing"

	"pagoda/model"
	"pagoda/testutil"
)

// TestHiddenStates checks Batch.Hidden: asking for the hidden states
// leaves the logits bit-identical, every row of a prefill gets the hidden
// state a one-token-at-a-time decode computes at that position, and Rope
// equal to Pos is the same pass as no Rope.
func TestHiddenStates(t *testing.T) {
	m, err := model.Open(testutil.Shared(t, "models/gguf/stories260K.gguf"), model.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	c := m.Config
	d := c.NEmbd
	toks := []int32{1, 403, 407, 261, 378, 426, 259, 302}
	T := len(toks)
	pos, seq, marks := make([]int32, T), make([]int32, T), make([]bool, T)
	for i := range pos {
		pos[i], marks[i] = int32(i), true
	}
	kv := model.NewFlatCache(&c, 1, 64)
	want, err := m.Forward(&model.Batch{Tokens: toks, Pos: pos, Seq: seq, Logits: marks}, kv)
	if err != nil {
		t.Fatal(err)
	}
	kv = model.NewFlatCache(&c, 1, 64)
	hid := make([]float32, T*d)
	got, err := m.Forward(&model.Batch{Tokens: toks, Pos: pos, Seq: seq, Logits: marks, Hidden: hid, Rope: pos}, kv)
	if err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("logit %d: %v with hidden states, %v without", i, got[i], want[i])
		}
	}
	kv = model.NewFlatCache(&c, 1, 64)
	one := make([]float32, d)
	for i := range T {
		if _, err := m.Forward(&model.Batch{Tokens: toks[i : i+1], Pos: pos[i : i+1], Seq: seq[:1], Hidden: one}, kv); err != nil {
			t.Fatal(err)
		}
		var maxd float32
		for j := range d {
			maxd = max(maxd, abs32(one[j]-hid[i*d+j]))
		}
		if maxd > 1e-4 {
			t.Errorf("position %d: decode's hidden state differs from the prefill's by %g", i, maxd)
		}
	}
	if _, err := m.Forward(&model.Batch{Tokens: toks, Pos: pos, Seq: seq, Hidden: one}, model.NewFlatCache(&c, 1, 64)); err == nil {
		t.Error("a hidden-state buffer of the wrong size was accepted")
	}
	bad := append([]int32(nil), pos...)
	bad[3] = 5 // a rotary position past the row's KV position
	if _, err := m.Forward(&model.Batch{Tokens: toks, Pos: pos, Seq: seq, Rope: bad}, model.NewFlatCache(&c, 1, 64)); err == nil {
		t.Error("a rotary position past the KV position was accepted")
	}
}

func abs32(x float32) float32 {
	if x < 0 {
		return -x
	}
	return x
}

func TestFileChecksum(t *testing.T) {
	p := testutil.Shared(t, "models/gguf/stories260K.gguf")
	a, err := model.FileChecksum(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != 64 {
		t.Fatalf("checksum %q is not hex SHA-256", a)
	}
	dir := testutil.Shared(t, "models/derived/stories260K-hf")
	b, err := model.FileChecksum(dir)
	if err != nil || b == a || len(b) != 64 {
		t.Fatalf("directory checksum %q, %v (file %q)", b, err, a)
	}
	if _, err := model.FileChecksum(p + ".missing"); err == nil {
		t.Error("a missing file has a checksum")
	}
}
