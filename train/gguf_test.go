package train

import (
	"math"
	"path/filepath"
	"strings"
	"testing"

	"pagoda/model"
	"pagoda/tokenizer"
)

const sampleText = `In the beginning God created the heaven and the earth.
And the earth was without form, and void; and darkness was upon the face of the deep.
And the Spirit of God moved upon the face of the waters.
And God said, Let there be light: and there was light.
And God saw the light, that it was good: and God divided the light from the darkness.
And God called the light Day, and the darkness he called Night. And the evening and the morning were the first day. 1:5 — “quoted” 42 times.
`

func tinyVocab(t *testing.T, size int) *Vocab {
	t.Helper()
	v, err := TrainBPE(strings.Repeat(sampleText, 3), size)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestCheckpointMatchesModelPackage writes a random tiny model as GGUF,
// loads it with package model and compares that forward pass's logits
// with the trainer's, at every position; then reads the file back into
// the trainer bit for bit.
func TestCheckpointMatchesModelPackage(t *testing.T) {
	for _, tied := range []bool{false, true} {
		v := tinyVocab(t, 300)
		c := Config{Dim: 32, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 8, FFN: 40, Vocab: len(v.Tokens), Context: 32,
			RopeTheta: 10000, RMSEps: 1e-5, Tied: tied}
		m := newTiny(t, c)
		path := filepath.Join(t.TempDir(), "m.gguf")
		if err := m.WriteGGUF(path, "tiny", v, false); err != nil {
			t.Fatal(err)
		}
		T := 20
		tokens, _ := tinyBatch(c, 1, T, 5)
		if _, err := m.Forward(tokens, nil, 1, T); err != nil {
			t.Fatal(err)
		}
		pm, err := model.Open(path, model.Options{Threads: 2})
		if err != nil {
			t.Fatal(err)
		}
		defer pm.Close()
		cache := model.NewFlatCache(&pm.Config, 1, T)
		b := &model.Batch{Tokens: tokens, Pos: make([]int32, T), Seq: make([]int32, T), Logits: make([]bool, T)}
		for i := range b.Pos {
			b.Pos[i], b.Logits[i] = int32(i), true
		}
		logits, err := pm.Forward(b, cache)
		if err != nil {
			t.Fatal(err)
		}
		var worst, scale float64
		for i, want := range m.Logits()[:T*c.Vocab] {
			worst = math.Max(worst, math.Abs(float64(logits[i]-want)))
			scale = math.Max(scale, math.Abs(float64(want)))
		}
		t.Logf("tied=%v: max |Δlogit| model vs trainer %.3g (logits up to %.3g)", tied, worst, scale)
		if worst > 1e-4*math.Max(1, scale) {
			t.Errorf("tied=%v: model package logits differ from the trainer's by %g", tied, worst)
		}
		back, bv, err := ReadGGUF(path, 1)
		if err != nil {
			t.Fatal(err)
		}
		back.Close()
		if back.Config != c || bv == nil || len(bv.Merges) != len(v.Merges) {
			t.Fatalf("read back config %+v (want %+v), vocab %v", back.Config, c, bv != nil)
		}
		for i := range m.Params {
			if back.Params[i] != m.Params[i] {
				t.Fatalf("parameter %d read back as %v, wrote %v", i, back.Params[i], m.Params[i])
			}
		}
	}
}

// TestBPERoundTrip: the trained vocabulary, written to GGUF and loaded by
// Pagoda's tokenizer package, encodes text into fewer tokens than bytes
// and decodes it back exactly, including text it was not trained on.
func TestBPERoundTrip(t *testing.T) {
	v := tinyVocab(t, 320)
	if len(v.Tokens) != 320 || v.Tokens[v.EOT] != eotText {
		t.Fatalf("vocabulary of %d tokens, end-of-text %q", len(v.Tokens), v.Tokens[v.EOT])
	}
	c := Config{Dim: 8, Layers: 1, Heads: 1, KVHeads: 1, HeadDim: 8, FFN: 8, Vocab: len(v.Tokens), Context: 8, RopeTheta: 10000, RMSEps: 1e-5, Tied: true}
	m, err := NewModel(c, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	path := filepath.Join(t.TempDir(), "v.gguf")
	if err := m.WriteGGUF(path, "vocab", v, false); err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	own, err := v.Tokenizer()
	if err != nil {
		t.Fatal(err)
	}
	for _, text := range []string{sampleText, "Unseen words: zephyr, quixotic — ünïcödé 12345!\n\n  spaced   out\t"} {
		ids := tok.Encode(text, tokenizer.Options{})
		if got := tok.Decode(ids); got != text {
			t.Errorf("round trip:\n got %q\nwant %q", got, text)
		}
		if o := own.Encode(text, tokenizer.Options{}); len(o) != len(ids) {
			t.Errorf("in-memory tokenizer gives %d tokens, the loaded one %d", len(o), len(ids))
		}
		t.Logf("%d bytes → %d tokens", len(text), len(ids))
	}
	if ids := tok.Encode(sampleText, tokenizer.Options{}); len(ids)*2 > len(sampleText) {
		t.Errorf("trained text takes %d tokens for %d bytes; merges are not applied", len(ids), len(sampleText))
	}
	if ids := tok.Encode(" the", tokenizer.Options{}); len(ids) != 1 {
		t.Errorf("\" the\" (the most frequent word) is %d tokens, want 1", len(ids))
	}
}
