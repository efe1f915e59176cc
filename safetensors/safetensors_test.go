package safetensors

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"pagoda/gguf"
	"pagoda/testutil"
)

func TestStoriesHF(t *testing.T) {
	dir := testutil.Shared(t, "models/derived/stories260K-hf")
	s, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	names := s.Names()
	if len(names) != 47 || s.Metadata["format"] != "pt" {
		t.Fatalf("%d tensors, metadata %v", len(names), s.Metadata)
	}
	emb, ok := s.Tensor("model.embed_tokens.weight")
	if !ok || emb.DType != "F32" || !reflect.DeepEqual(emb.Shape, []int64{512, 64}) || len(emb.Data) != 512*64*4 {
		t.Fatalf("embed: %+v", emb)
	}
	if _, ok := s.Tensor("lm_head.weight"); ok {
		t.Error("tied model has lm_head")
	}
	// The same trained weights as the GGUF conversion: tensors that need no
	// permutation are byte-identical.
	g, err := gguf.Open(testutil.Shared(t, "models/gguf/stories260K.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for hf, gg := range map[string]string{
		"model.embed_tokens.weight":                      "token_embd.weight",
		"model.norm.weight":                              "output_norm.weight",
		"model.layers.3.self_attn.v_proj.weight":         "blk.3.attn_v.weight",
		"model.layers.4.mlp.down_proj.weight":            "blk.4.ffn_down.weight",
		"model.layers.0.post_attention_layernorm.weight": "blk.0.ffn_norm.weight",
	} {
		a, ok := s.Tensor(hf)
		b := g.Tensor(gg)
		if !ok || b == nil || !bytes.Equal(a.Data, b.Data) {
			t.Errorf("%s differs from %s", hf, gg)
		}
	}
	v, err := emb.Float32()
	if err != nil || len(v) != 512*64 {
		t.Fatal(err)
	}
	if v[0] != math.Float32frombits(binary.LittleEndian.Uint32(emb.Data)) {
		t.Error("Float32 of F32")
	}
	// The file itself, and OpenDir on the file path.
	s2, err := OpenDir(filepath.Join(dir, SingleName))
	if err != nil || len(s2.Names()) != 47 {
		t.Fatalf("OpenDir(file): %v", err)
	}
	s2.Close()
	f, err := Open(filepath.Join(dir, SingleName))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if n := f.Names(); n[0] != "model.embed_tokens.weight" || n[len(n)-1] != "model.norm.weight" {
		t.Errorf("data order: %s … %s", n[0], n[len(n)-1])
	}
}

func f32bytes(v ...float32) []byte {
	b := make([]byte, 0, 4*len(v))
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

func TestWriteReadAndConvert(t *testing.T) {
	tensors := []*Tensor{
		{Name: "a", DType: "F32", Shape: []int64{2, 2}, Data: f32bytes(1, -2, 3.5, 0)},
		// F16: 1.0, -2.0, 65504 (max), 2^-24 (smallest subnormal), +Inf, 0x7e00 NaN
		{Name: "h", DType: "F16", Shape: []int64{6}, Data: []byte{0, 0x3c, 0, 0xc0, 0xff, 0x7b, 1, 0, 0, 0x7c, 0, 0x7e}},
		{Name: "b", DType: "BF16", Shape: []int64{2}, Data: []byte{0x80, 0x3f, 0x49, 0x40}}, // 1.0, 3.140625
		{Name: "d", DType: "F64", Shape: []int64{1}, Data: binary.LittleEndian.AppendUint64(nil, math.Float64bits(0.25))},
		{Name: "i", DType: "I32", Shape: []int64{1}, Data: []byte{1, 0, 0, 0}},
		{Name: "f4", DType: "F4", Shape: []int64{2, 3}, Data: []byte{1, 2, 3}},
		{Name: "scalar", DType: "U8", Shape: []int64{}, Data: []byte{7}},
		{Name: "zero", DType: "BF16", Shape: []int64{0, 5}, Data: nil},
	}
	p := filepath.Join(t.TempDir(), "x.safetensors")
	if err := WriteWithMetadata(p, tensors, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(p)
	if n := binary.LittleEndian.Uint64(raw); n%8 != 0 {
		t.Errorf("header length %d not padded to 8", n)
	}
	f, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if !reflect.DeepEqual(f.Names(), []string{"a", "h", "b", "d", "i", "f4", "scalar", "zero"}) || f.Metadata["format"] != "pt" {
		t.Errorf("names %v meta %v", f.Names(), f.Metadata)
	}
	for _, want := range tensors {
		got, ok := f.Tensor(want.Name)
		if !ok || got.DType != want.DType || !reflect.DeepEqual(got.Shape, want.Shape) || !bytes.Equal(got.Data, want.Data) {
			t.Errorf("%s: %+v", want.Name, got)
		}
	}
	conv := map[string][]float32{
		"a": {1, -2, 3.5, 0},
		"h": {1, -2, 65504, 1.0 / (1 << 24), float32(math.Inf(1))},
		"b": {1, 3.140625},
		"d": {0.25},
	}
	for name, want := range conv {
		tt, _ := f.Tensor(name)
		got, err := tt.Float32()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for i, w := range want {
			if got[i] != w {
				t.Errorf("%s[%d] = %v, want %v", name, i, got[i], w)
			}
		}
		if name == "h" && !math.IsNaN(float64(got[5])) {
			t.Errorf("f16 NaN gave %v", got[5])
		}
	}
	it, _ := f.Tensor("i")
	if _, err := it.Float32(); err == nil || !strings.Contains(err.Error(), `"i"`) {
		t.Errorf("I32 Float32: %v", err)
	}
	if err := Write(p, []*Tensor{{Name: "x", DType: "F32", Shape: []int64{3}, Data: make([]byte, 8)}}); err == nil {
		t.Error("size mismatch written")
	}
	if err := Write(p, []*Tensor{{Name: "x", DType: "Q4", Shape: []int64{1}, Data: make([]byte, 1)}}); err == nil {
		t.Error("unknown dtype written")
	}
}

func TestShards(t *testing.T) {
	dir := t.TempDir()
	w := func(name string, ts ...*Tensor) {
		if err := Write(filepath.Join(dir, name), ts); err != nil {
			t.Fatal(err)
		}
	}
	w("model-00001-of-00002.safetensors",
		&Tensor{Name: "x.weight", DType: "F32", Shape: []int64{2}, Data: f32bytes(1, 2)},
		&Tensor{Name: "y.weight", DType: "F32", Shape: []int64{1}, Data: f32bytes(3)})
	w("model-00002-of-00002.safetensors",
		&Tensor{Name: "z.weight", DType: "BF16", Shape: []int64{1}, Data: []byte{0x80, 0x3f}})
	index := func(s string) {
		os.WriteFile(filepath.Join(dir, IndexName), []byte(s), 0o644)
	}
	index(`{"metadata": {"total_size": 14}, "weight_map": {
		"x.weight": "model-00001-of-00002.safetensors",
		"y.weight": "model-00001-of-00002.safetensors",
		"z.weight": "model-00002-of-00002.safetensors"}}`)
	s, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(s.Names(), []string{"x.weight", "y.weight", "z.weight"}) || len(s.Files) != 2 {
		t.Errorf("names %v files %d", s.Names(), len(s.Files))
	}
	z, ok := s.Tensor("z.weight")
	if v, _ := z.Float32(); !ok || v[0] != 1 {
		t.Errorf("z = %v", v)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ index, want string }{
		{`{"weight_map": {"x.weight": "model-00001-of-00002.safetensors", "q": "model-00001-of-00002.safetensors"}}`, `tensor "q" is not in`},
		{`{"weight_map": {"x.weight": "model-00002-of-00002.safetensors", "y.weight": "model-00001-of-00002.safetensors"}}`, "is listed in"},
		{`{"weight_map": {"x.weight": "../model-00001-of-00002.safetensors"}}`, "not a plain file name"},
		{`{"weight_map": {"x.weight": "missing.safetensors"}}`, "missing.safetensors"},
		{`{"weight_map": {}}`, "empty weight_map"},
		{`{"weight_map": `, "unexpected end"},
	} {
		index(c.index)
		if s, err := OpenDir(dir); err == nil || !strings.Contains(err.Error(), c.want) {
			if s != nil {
				s.Close()
			}
			t.Errorf("index %s: error %v, want %q", c.index, err, c.want)
		}
	}
	// A tensor in two shards.
	w("model-00002-of-00002.safetensors", &Tensor{Name: "x.weight", DType: "F32", Shape: []int64{2}, Data: f32bytes(1, 2)})
	index(`{"weight_map": {"x.weight": "model-00001-of-00002.safetensors", "z": "model-00002-of-00002.safetensors"}}`)
	if _, err := OpenDir(dir); err == nil || !strings.Contains(err.Error(), "another shard") {
		t.Errorf("duplicate across shards: %v", err)
	}
	if _, err := OpenDir(t.TempDir()); err == nil || !strings.Contains(err.Error(), "neither") {
		t.Errorf("empty dir: %v", err)
	}
}

func withHeader(h string, data int) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	return append(append(b, h...), make([]byte, data)...)
}

func TestCorrupt(t *testing.T) {
	for _, c := range []struct {
		b    []byte
		want string
	}{
		{[]byte{1, 2, 3}, "too short"},
		{binary.LittleEndian.AppendUint64(nil, 1<<62), "exceeds"},
		{withHeader(`{"a":`, 0), "header"},
		{withHeader(`[]`, 0), "header"},
		{withHeader(`{"a": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 1]}}`, 1), `unknown dtype "Q9"`},
		{withHeader(`{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}`, 4), "needs 8 bytes"},
		{withHeader(`{"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}`, 4), "negative"},
		{withHeader(`{"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}`, 4), "reversed"},
		{withHeader(`{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}`, 4), "want 2"},
		{withHeader(`{"a": {"dtype": "F32", "data_offsets": [0, 4]}}`, 4), "no shape"},
		{withHeader(`{"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}`, 4), "beyond"},
		{withHeader(`{"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 4]}}`, 4), "overflows"},
		{withHeader(`{"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}`, 4), "whole number"},
		{withHeader(`{"__metadata__": {"a": 1}}`, 0), "__metadata__"},
	} {
		if _, err := Parse(c.b); err == nil || !strings.HasPrefix(err.Error(), "safetensors: ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.b, err, c.want)
		}
	}
	// Every truncation of the real file fails: its last tensor ends at EOF.
	orig, err := os.ReadFile(testutil.Shared(t, "models/derived/stories260K-hf/model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	for n := 0; n < len(orig); n += 1 + n/8 {
		if _, err := Parse(orig[:n:n]); err == nil {
			t.Fatalf("truncated at %d: no error", n)
		}
	}
	p := filepath.Join(t.TempDir(), "t.safetensors")
	os.WriteFile(p, orig[:len(orig)-1], 0o644)
	if _, err := Open(p); err == nil || !strings.Contains(err.Error(), p) {
		t.Errorf("truncated file: %v", err)
	}
}
