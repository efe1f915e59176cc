package gguf

import (
	"bytes"
	"encoding/binary"
	"io"
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"pagoda/quant"
	"pagoda/testutil"
)

// sharedGGUFs lists every GGUF under the shared folder.
func sharedGGUFs(t *testing.T) []string {
	t.Helper()
	dir := testutil.SharedDir()
	if dir == "" {
		t.Skip("shared test data not found")
	}
	var out []string
	for _, pat := range []string{"models/*/*.gguf", "golden/models/*.gguf"} {
		m, err := filepath.Glob(filepath.Join(dir, pat))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m...)
	}
	if len(out) == 0 {
		t.Skipf("no GGUF files under %s", dir)
	}
	if len(out) < 30 {
		t.Fatalf("found only %d shared GGUF files", len(out))
	}
	return out
}

func TestStories260K(t *testing.T) {
	f, err := Open(testutil.Shared(t, "models/gguf/stories260K.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Version != 3 || f.Alignment != 32 || len(f.Tensors) != 48 || len(f.KV) != 19 {
		t.Fatalf("version %d alignment %d tensors %d kv %d", f.Version, f.Alignment, len(f.Tensors), len(f.KV))
	}
	if a, _ := f.String("general.architecture"); a != "llama" {
		t.Errorf("architecture %q", a)
	}
	toks, ok := f.Strings("tokenizer.ggml.tokens")
	if !ok || len(toks) != 512 || toks[1] != "<s>" || toks[3] != "<0x00>" {
		t.Errorf("tokens: ok=%v len=%d", ok, len(toks))
	}
	scores, ok := f.Float32s("tokenizer.ggml.scores")
	if !ok || len(scores) != 512 {
		t.Errorf("scores: ok=%v len=%d", ok, len(scores))
	}
	tt, ok := f.Int32s("tokenizer.ggml.token_type")
	if !ok || len(tt) != 512 || tt[0] != 2 || tt[1] != 3 || tt[3] != 6 {
		t.Errorf("token types: ok=%v %v", ok, tt[:4])
	}
	for key, want := range map[string]uint64{
		"llama.embedding_length": 64, "llama.block_count": 5, "llama.feed_forward_length": 172,
		"llama.attention.head_count": 8, "llama.attention.head_count_kv": 4, "llama.context_length": 2048,
		"tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.seperator_token_id": math.MaxUint32,
	} {
		if got, ok := f.Uint(key); !ok || got != want {
			t.Errorf("%s = %d, %v; want %d", key, got, ok, want)
		}
	}
	if eps, ok := f.Float("llama.attention.layer_norm_rms_epsilon"); !ok || float32(eps) != 1e-5 {
		t.Errorf("rms eps %v %v", eps, ok)
	}
	if n, ok := f.Int("llama.block_count"); !ok || n != 5 {
		t.Errorf("Int(block_count) = %d %v", n, ok)
	}
	if _, ok := f.Bool("llama.block_count"); ok {
		t.Error("Bool accepted a uint32")
	}
	if _, ok := f.Get("no.such.key"); ok {
		t.Error("absent key found")
	}
	te := f.Tensor("token_embd.weight")
	if te == nil || !reflect.DeepEqual(te.Dims, []uint64{64, 512}) || te.Type != quant.F32 || te.Size != 64*512*4 || len(te.Data) != te.Size {
		t.Fatalf("token_embd.weight: %+v", te)
	}
	k := f.Tensor("blk.4.attn_k.weight")
	if k == nil || !reflect.DeepEqual(k.Dims, []uint64{64, 32}) || k.Rows() != 32 || k.Elements() != 2048 {
		t.Fatalf("blk.4.attn_k.weight: %+v", k)
	}
	if f.Tensor("nope") != nil {
		t.Error("absent tensor found")
	}
	// Norm weights of a trained model are not all zero: the view must
	// point at real data.
	var sum float64
	norm := f.Tensor("output_norm.weight")
	for i := 0; i < 64; i++ {
		sum += math.Abs(float64(math.Float32frombits(binary.LittleEndian.Uint32(norm.Data[4*i:]))))
	}
	if sum == 0 || math.IsNaN(sum) {
		t.Errorf("output_norm sum %v", sum)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
}

func TestSharedFacts(t *testing.T) {
	cases := []struct {
		rel, arch     string
		tensors, toks int
		tokModel      string
		weight        quant.Type // type of blk.0.attn_q.weight, when tensors > 0
	}{
		{"golden/models/g-llama-gqa.Q4_K.gguf", "llama", 12, 512, "llama", quant.Q4_K},
		{"golden/models/g-llama-gqa.Q8_0.gguf", "llama", 12, 512, "llama", quant.Q8_0},
		{"golden/models/g-llama-gqa.BF16.gguf", "llama", 12, 512, "llama", quant.BF16},
		{"golden/models/g-llama-gqa.Q2_K.gguf", "llama", 12, 512, "llama", quant.Q2_K},
		{"golden/models/g-qwen2.Q4_K.gguf", "qwen2", 27, 512, "llama", quant.Q4_K},
		{"golden/models/g-qwen3.F32.gguf", "qwen3", 24, 512, "llama", quant.F32},
		{"golden/models/g-llama3-ropefreqs.F32.gguf", "llama", 22, 512, "llama", quant.F32},
		{"models/ollama/llama-2-tiny-random.gguf", "llama", 12, 32000, "llama", quant.F16},
		{"models/llama.cpp-vocab/ggml-vocab-gpt-2.gguf", "gpt2", 0, 50257, "gpt2", 0},
		{"models/llama.cpp-vocab/ggml-vocab-bert-bge.gguf", "bert", 0, 30522, "bert", 0},
		{"models/llama.cpp-vocab/ggml-vocab-llama-spm.gguf", "llama", 0, 32000, "llama", 0},
		{"models/llama.cpp-vocab/ggml-vocab-baichuan.gguf", "baichuan", 0, 64000, "llama", 0},
	}
	for _, c := range cases {
		t.Run(filepath.Base(c.rel), func(t *testing.T) {
			f, err := Open(testutil.Shared(t, c.rel))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if a, _ := f.String("general.architecture"); a != c.arch {
				t.Errorf("arch %q, want %q", a, c.arch)
			}
			if len(f.Tensors) != c.tensors {
				t.Errorf("%d tensors, want %d", len(f.Tensors), c.tensors)
			}
			toks, _ := f.Strings("tokenizer.ggml.tokens")
			if len(toks) != c.toks {
				t.Errorf("%d tokens, want %d", len(toks), c.toks)
			}
			if m, _ := f.String("tokenizer.ggml.model"); m != c.tokModel {
				t.Errorf("tokenizer model %q, want %q", m, c.tokModel)
			}
			if c.tensors == 0 {
				return
			}
			q := f.Tensor("blk.0.attn_q.weight")
			if q == nil || q.Type != c.weight {
				t.Fatalf("blk.0.attn_q.weight: %+v", q)
			}
			for _, ti := range f.Tensors {
				if len(ti.Dims) == 1 && ti.Type != quant.F32 {
					t.Errorf("%s: 1-D tensor of type %s", ti.Name, ti.Type)
				}
				if len(ti.Dims) == 2 && ti.Type != c.weight {
					t.Errorf("%s: 2-D tensor of type %s, want %s", ti.Name, ti.Type, c.weight)
				}
			}
		})
	}
	// gpt2 vocabularies carry merges; the qwen2 model has q/k/v biases.
	f, err := Open(testutil.Shared(t, "models/llama.cpp-vocab/ggml-vocab-gpt-2.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if m, ok := f.Strings("tokenizer.ggml.merges"); !ok || len(m) != 50000 || m[0] != "Ġ t" {
		t.Errorf("merges: %v %d", ok, len(m))
	}
	q, err := Open(testutil.Shared(t, "golden/models/g-qwen2.F32.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if b := q.Tensor("blk.0.attn_q.bias"); b == nil || len(b.Dims) != 1 || b.Dims[0] != 256 {
		t.Errorf("qwen2 q bias: %+v", b)
	}
}

// rewrite copies every metadata entry and tensor of f into a new Writer.
func rewrite(t testing.TB, f *File) *Writer {
	t.Helper()
	w := NewWriter()
	if err := w.SetVersion(f.Version); err != nil {
		t.Fatal(err)
	}
	for _, kv := range f.KV {
		if err := w.Set(kv.Key, kv.Value); err != nil {
			t.Fatal(err)
		}
	}
	for _, ti := range f.Tensors {
		if err := w.AddTensor(ti.Name, ti.Type, ti.Dims, ti.Data); err != nil {
			t.Fatal(err)
		}
	}
	return w
}

func sameFile(t *testing.T, a, b *File) {
	t.Helper()
	if a.Version != b.Version || a.Alignment != b.Alignment || a.DataOffset != b.DataOffset {
		t.Errorf("header: %d/%d/%d vs %d/%d/%d", a.Version, a.Alignment, a.DataOffset, b.Version, b.Alignment, b.DataOffset)
	}
	if !reflect.DeepEqual(a.KV, b.KV) {
		t.Errorf("metadata differs")
	}
	if len(a.Tensors) != len(b.Tensors) {
		t.Fatalf("%d vs %d tensors", len(a.Tensors), len(b.Tensors))
	}
	for i, x := range a.Tensors {
		y := b.Tensors[i]
		if x.Name != y.Name || x.Type != y.Type || !reflect.DeepEqual(x.Dims, y.Dims) || x.Offset != y.Offset || !bytes.Equal(x.Data, y.Data) {
			t.Errorf("tensor %d (%s) differs", i, x.Name)
		}
	}
}

// Every shared file was written by gguf-py or llama.cpp with the same
// layout rules as ours, so the rewrite must be byte-identical.
func TestRoundTripShared(t *testing.T) {
	for _, p := range sharedGGUFs(t) {
		t.Run(filepath.Base(p), func(t *testing.T) {
			f, err := Open(p)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			var buf bytes.Buffer
			n, err := rewrite(t, f).WriteTo(&buf)
			if err != nil {
				t.Fatal(err)
			}
			if n != int64(buf.Len()) {
				t.Errorf("WriteTo returned %d, wrote %d", n, buf.Len())
			}
			g, err := Parse(buf.Bytes())
			if err != nil {
				t.Fatal(err)
			}
			sameFile(t, f, g)
			orig, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(orig, buf.Bytes()) {
				t.Errorf("rewrite is not byte-identical (%d vs %d bytes)", len(orig), buf.Len())
			}
		})
	}
}

// allTypesWriter builds a small file exercising every value type, nested
// arrays, a non-default alignment and tensors of several types.
func allTypesWriter(t testing.TB) *Writer {
	w := NewWriter()
	vals := map[string]any{}
	keys := []string{}
	add := func(k string, v any) {
		keys = append(keys, k)
		vals[k] = v
	}
	add("u8", uint8(200))
	add("i8", int8(-100))
	add("u16", uint16(60000))
	add("i16", int16(-30000))
	add("u32", uint32(4000000000))
	add("i32", int32(-2000000000))
	add("f32", float32(1.5e-5))
	add("bool", true)
	add("str", "héllo ▁wörld")
	add("u64", uint64(1)<<63+5)
	add("i64", int64(-1)<<62)
	add("f64", 1e300)
	add("int", 42)
	add("uint", uint(7))
	add("a.u8", []uint8{1, 2, 255})
	add("a.i8", []int8{-1, 2})
	add("a.u16", []uint16{1, 65535})
	add("a.i16", []int16{-32768, 1})
	add("a.u32", []uint32{0xFFFFFFFF, 0})
	add("a.i32", []int32{-1, 7})
	add("a.f32", []float32{0.5, -2})
	add("a.bool", []bool{true, false, true})
	add("a.str", []string{"", "a", "▁b"})
	add("a.u64", []uint64{1 << 40})
	add("a.i64", []int64{-1 << 40})
	add("a.f64", []float64{math.Pi})
	add("a.int", []int{1, -2, 3})
	add("a.empty", []string{})
	add("a.nested", []Value{
		{Type: Array, Elem: Int32, V: []int32{1, 2}},
		{Type: Array, Elem: Array, V: []Value{{Type: Array, Elem: String, V: []string{"deep"}}}},
	})
	for _, k := range keys {
		if err := w.Set(k, vals[k]); err != nil {
			t.Fatalf("Set(%s): %v", k, err)
		}
	}
	w.SetAlignment(64)
	f32 := make([]byte, 4*3*2)
	for i := range f32 {
		f32[i] = byte(i)
	}
	q8 := make([]byte, 34*2)
	for i := range q8 {
		q8[i] = byte(3 * i)
	}
	iq := make([]byte, 74) // IQ2_XS: known but unsupported, still loads
	if err := w.AddTensor("a", quant.F32, []uint64{3, 2}, f32); err != nil {
		t.Fatal(err)
	}
	if err := w.AddTensor("b", quant.Q8_0, []uint64{32, 2, 1}, q8); err != nil {
		t.Fatal(err)
	}
	if err := w.AddTensorFunc("c", quant.IQ2_XS, []uint64{256}, 74, func(out io.Writer) error {
		_, err := out.Write(iq)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := w.AddTensor("empty", quant.F16, []uint64{0, 4}, nil); err != nil {
		t.Fatal(err)
	}
	return w
}

func TestWriterAllTypes(t *testing.T) {
	w := allTypesWriter(t)
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	f, err := Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if f.Alignment != 64 || f.DataOffset%64 != 0 {
		t.Errorf("alignment %d data offset %d", f.Alignment, f.DataOffset)
	}
	if v, _ := f.Uint(KeyAlignment); v != 64 {
		t.Errorf("general.alignment %d", v)
	}
	checks := map[string]any{
		"u8": uint8(200), "i8": int8(-100), "u16": uint16(60000), "i16": int16(-30000),
		"u32": uint32(4000000000), "i32": int32(-2000000000), "f32": float32(1.5e-5), "bool": true,
		"str": "héllo ▁wörld", "u64": uint64(1)<<63 + 5, "i64": int64(-1) << 62, "f64": 1e300,
		"int": int32(42), "uint": uint32(7),
		"a.u8": []uint8{1, 2, 255}, "a.i8": []int8{-1, 2}, "a.u16": []uint16{1, 65535},
		"a.i16": []int16{-32768, 1}, "a.u32": []uint32{0xFFFFFFFF, 0}, "a.i32": []int32{-1, 7},
		"a.f32": []float32{0.5, -2}, "a.bool": []bool{true, false, true}, "a.str": []string{"", "a", "▁b"},
		"a.u64": []uint64{1 << 40}, "a.i64": []int64{-1 << 40}, "a.f64": []float64{math.Pi},
		"a.int": []int32{1, -2, 3}, "a.empty": []string{},
	}
	for k, want := range checks {
		v, ok := f.Get(k)
		if !ok || !reflect.DeepEqual(v.V, want) {
			t.Errorf("%s = %#v, want %#v", k, v.V, want)
		}
	}
	nested, _ := f.Get("a.nested")
	if nested.Elem != Array || nested.Len() != 2 {
		t.Fatalf("nested: %+v", nested)
	}
	inner := nested.V.([]Value)[1].V.([]Value)[0]
	if !reflect.DeepEqual(inner.V, []string{"deep"}) {
		t.Errorf("nested inner %+v", inner)
	}
	if got := nested.String(); got != `[2]array{[2]int32{1, 2}, [1]array{[1]string{"deep"}}}` {
		t.Errorf("nested String %s", got)
	}
	// Accessor conversions.
	if x, ok := f.Uint("i8"); ok {
		t.Errorf("Uint(-100) = %d", x)
	}
	if _, ok := f.Int("u64"); ok {
		t.Error("Int accepted 2^63+5")
	}
	if x, ok := f.Float("u16"); !ok || x != 60000 {
		t.Errorf("Float(u16) %v", x)
	}
	if a, ok := f.Int32s("a.u16"); !ok || !reflect.DeepEqual(a, []int32{1, 65535}) {
		t.Errorf("Int32s(a.u16) %v", a)
	}
	if _, ok := f.Int32s("a.u32"); ok {
		t.Error("Int32s accepted 0xFFFFFFFF")
	}
	if a, ok := f.Float32s("a.f64"); !ok || a[0] != float32(math.Pi) {
		t.Errorf("Float32s(a.f64) %v", a)
	}
	for i, want := range []struct {
		name string
		off  uint64
		typ  quant.Type
		size int
	}{{"a", 0, quant.F32, 24}, {"b", 64, quant.Q8_0, 68}, {"c", 192, quant.IQ2_XS, 74}, {"empty", 320, quant.F16, 0}} {
		ti := f.Tensors[i]
		if ti.Name != want.name || ti.Offset != want.off || ti.Type != want.typ || ti.Size != want.size || len(ti.Data) != want.size {
			t.Errorf("tensor %d: %s off %d type %s size %d", i, ti.Name, ti.Offset, ti.Type, ti.Size)
		}
	}
	if f.Tensor("b").Data[5] != 15 {
		t.Error("tensor b data")
	}
	// Writing through a file gives the same bytes, and Open reads them.
	p := filepath.Join(t.TempDir(), "x.gguf")
	if err := allTypesWriter(t).WriteFile(p); err != nil {
		t.Fatal(err)
	}
	disk, _ := os.ReadFile(p)
	if !bytes.Equal(disk, buf.Bytes()) {
		t.Error("WriteFile differs from WriteTo")
	}
	g, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	sameFile(t, f, g)
}

func TestWriterVersion2(t *testing.T) {
	w := NewWriter()
	if err := w.SetVersion(2); err != nil {
		t.Fatal(err)
	}
	if err := w.SetVersion(1); err == nil {
		t.Error("version 1 accepted")
	}
	w.Set("general.architecture", "llama")
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	f, err := Parse(buf.Bytes())
	if err != nil || f.Version != 2 {
		t.Fatalf("%v %+v", err, f)
	}
}

func TestWriterErrors(t *testing.T) {
	w := NewWriter()
	for _, c := range []struct {
		v    any
		want string
	}{
		{1 << 40, "does not fit int32"},
		{[]int{1 << 40}, "does not fit int32"},
		{struct{}{}, "cannot store"},
		{Value{Type: Uint32, V: int32(1)}, "does not match"},
		{Value{Type: Array, Elem: String, V: []int32{1}}, "does not match"},
		{[]Value{{Type: Uint8, V: uint8(1)}}, "array of arrays"},
	} {
		if err := w.Set("k", c.v); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Set(%#v) error %v, want %q", c.v, err, c.want)
		}
	}
	if err := w.Set(KeyAlignment, uint32(48)); err == nil {
		t.Error("alignment 48 accepted")
	}
	if err := w.Set(KeyAlignment, 64); err == nil {
		t.Error("int32 alignment accepted")
	}
	if err := w.AddTensor("x", quant.F32, []uint64{4}, make([]byte, 15)); err == nil || !strings.Contains(err.Error(), `"x"`) {
		t.Errorf("short data: %v", err)
	}
	if err := w.AddTensor("x", quant.Q4_0, []uint64{31}, make([]byte, 18)); err == nil {
		t.Error("partial block accepted")
	}
	if err := w.AddTensor("x", quant.Type(99), []uint64{4}, make([]byte, 16)); err == nil {
		t.Error("unknown type accepted")
	}
	if err := w.AddTensor("x", quant.F32, []uint64{1, 1, 1, 1, 1}, make([]byte, 4)); err == nil {
		t.Error("5 dims accepted")
	}
	if err := w.AddTensor(strings.Repeat("n", 64), quant.F32, []uint64{1}, make([]byte, 4)); err == nil {
		t.Error("64-byte name accepted")
	}
	if err := w.AddTensor("x", quant.F32, []uint64{1}, make([]byte, 4)); err != nil {
		t.Fatal(err)
	}
	if err := w.AddTensor("x", quant.F32, []uint64{1}, make([]byte, 4)); err == nil {
		t.Error("duplicate tensor accepted")
	}
	if err := w.AddTensorFunc("y", quant.F32, []uint64{2}, 7, func(io.Writer) error { return nil }); err == nil {
		t.Error("wrong AddTensorFunc size accepted")
	}
	if err := w.AddTensorFunc("y", quant.F32, []uint64{2}, 8, func(o io.Writer) error {
		_, err := o.Write(make([]byte, 4))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteTo(io.Discard); err == nil || !strings.Contains(err.Error(), `"y"`) {
		t.Errorf("short tensor function: %v", err)
	}
	w2 := NewWriter()
	w2.SetAlignment(3)
	if _, err := w2.WriteTo(io.Discard); err == nil {
		t.Error("alignment 3 accepted")
	}
	// A failed WriteFile leaves nothing behind.
	dir := t.TempDir()
	if err := w.WriteFile(filepath.Join(dir, "bad.gguf")); err == nil {
		t.Error("WriteFile succeeded")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("left %d files behind", len(ents))
	}
}

func TestValueString(t *testing.T) {
	long := strings.Repeat("x", 200)
	for _, c := range []struct {
		v    Value
		want string
	}{
		{Value{Type: Uint32, V: uint32(7)}, "7"},
		{Value{Type: Float32, V: float32(1e-5)}, "1e-05"},
		{Value{Type: Bool, V: true}, "true"},
		{Value{Type: String, V: "a\"b"}, `"a\"b"`},
		{Value{Type: String, V: long}, `"` + long[:120] + `"…`},
		{Value{Type: Array, Elem: Int32, V: []int32{1, 2, 3, 4, 5, 6, 7, 8, 9}}, "[9]int32{1, 2, 3, 4, 5, 6, 7, 8, …}"},
		{Value{Type: Array, Elem: Uint8, V: []uint8{1, 2}}, "[2]uint8{1, 2}"},
		{Value{Type: Array, Elem: String, V: []string{}}, "[0]string{}"},
	} {
		if got := c.v.String(); got != c.want {
			t.Errorf("String() = %s, want %s", got, c.want)
		}
	}
	if ValueType(99).String() != "valuetype(99)" || Float64.String() != "float64" {
		t.Error("ValueType.String")
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.gguf")
	if _, err := Open(missing); err == nil || !strings.HasPrefix(err.Error(), "gguf: ") || !strings.Contains(err.Error(), missing) {
		t.Errorf("missing file: %v", err)
	}
	short := filepath.Join(dir, "short.gguf")
	os.WriteFile(short, []byte("GG"), 0o644)
	if _, err := Open(short); err == nil || !strings.HasPrefix(err.Error(), "gguf: "+short+": ") {
		t.Errorf("short file: %v", err)
	}
	if _, err := Open(dir); err == nil {
		t.Error("directory opened")
	}
	bad := filepath.Join(dir, "bad.gguf")
	os.WriteFile(bad, []byte("GGML\x03\x00\x00\x00"), 0o644)
	if _, err := Open(bad); err == nil || !strings.Contains(err.Error(), "bad magic") {
		t.Errorf("bad magic: %v", err)
	}
}

// header builds the start of a GGUF file by hand, for corruptions the
// Writer refuses to produce.
func header(version uint32, nTensors, nKV uint64) []byte {
	b := []byte(Magic)
	b = binary.LittleEndian.AppendUint32(b, version)
	b = binary.LittleEndian.AppendUint64(b, nTensors)
	return binary.LittleEndian.AppendUint64(b, nKV)
}

func appendStr(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint64(b, uint64(len(s)))
	return append(b, s...)
}

func appendTensorInfo(b []byte, name string, dims []uint64, typ uint32, off uint64) []byte {
	b = appendStr(b, name)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(dims)))
	for _, d := range dims {
		b = binary.LittleEndian.AppendUint64(b, d)
	}
	b = binary.LittleEndian.AppendUint32(b, typ)
	return binary.LittleEndian.AppendUint64(b, off)
}

func TestCorruptHeaders(t *testing.T) {
	le := binary.LittleEndian
	kvArray := func(elem uint32, n uint64) []byte {
		b := appendStr(header(3, 0, 1), "k")
		b = le.AppendUint32(b, uint32(Array))
		b = le.AppendUint32(b, elem)
		return le.AppendUint64(b, n)
	}
	oneTensor := func(dims []uint64, typ uint32, off uint64, data int) []byte {
		b := appendTensorInfo(header(3, 1, 0), "blk.3.attn_q.weight", dims, typ, off)
		for len(b)%32 != 0 {
			b = append(b, 0)
		}
		return append(b, make([]byte, data)...)
	}
	dup := appendStr(header(3, 0, 2), "k")
	dup = append(le.AppendUint32(dup, uint32(Uint8)), 1)
	dup = appendStr(dup, "k")
	dup = append(le.AppendUint32(dup, uint32(Uint8)), 2)
	cases := []struct {
		name string
		b    []byte
		want string
	}{
		{"v1", header(1, 0, 0), "version 1"},
		{"big-endian", header(3<<24, 0, 0), "big-endian"},
		{"v4", header(4, 0, 0), "version 4"},
		{"huge tensor count", header(3, math.MaxUint64, 0), "tensor count"},
		{"huge kv count", header(3, 0, 1<<40), "metadata count"},
		{"huge key", append(le.AppendUint64(header(3, 0, 1), 1<<62), make([]byte, 16)...), "string of"},
		{"bad value type", le.AppendUint32(appendStr(header(3, 0, 1), "k"), 13), "unknown value type 13"},
		{"huge u32 array", kvArray(uint32(Uint32), 1<<61), "cannot fit"},
		{"huge string array", kvArray(uint32(String), 1<<40), "cannot fit"},
		{"huge nested array", kvArray(uint32(Array), 1<<40), "cannot fit"},
		{"bad elem type", kvArray(77, 1), "unknown value type 77"},
		{"dup key", dup, "appears twice"},
		{"alignment type", append(le.AppendUint32(appendStr(header(3, 0, 1), KeyAlignment), uint32(Uint8)), 32), "want uint32"},
		{"alignment zero", le.AppendUint32(le.AppendUint32(appendStr(header(3, 0, 1), KeyAlignment), uint32(Uint32)), 0), "power of two"},
		{"unknown tensor type", oneTensor([]uint64{4}, 77, 0, 16), `tensor "blk.3.attn_q.weight": unknown tensor type id 77`},
		{"zero dims", oneTensor(nil, 0, 0, 16), "0 dimensions"},
		{"five dims", oneTensor([]uint64{1, 1, 1, 1, 1}, 0, 0, 16), "5 dimensions"},
		{"dims overflow", oneTensor([]uint64{1 << 32, 1 << 32}, 0, 0, 16), "overflow"},
		{"size overflow", oneTensor([]uint64{1 << 62}, 0, 0, 16), "overflow"},
		{"partial block", oneTensor([]uint64{33}, uint32(quant.Q4_0), 0, 64), "block size"},
		{"misaligned offset", oneTensor([]uint64{4}, 0, 4, 32), "alignment"},
		{"data past end", oneTensor([]uint64{8}, 0, 0, 31), "beyond the end"},
		{"offset past end", oneTensor([]uint64{1}, 0, 1<<63, 31), "beyond the end"},
		{"offset wraps", oneTensor([]uint64{8}, 0, math.MaxUint64-31, 64), "beyond the end"},
	}
	for _, c := range cases {
		f, err := Parse(c.b)
		if err == nil {
			t.Errorf("%s: parsed: %+v", c.name, f)
			continue
		}
		if !strings.HasPrefix(err.Error(), "gguf: ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %q, want it to contain %q", c.name, err, c.want)
		}
	}
	// A known but unsupported type (IQ2_XS) parses; the model loader
	// rejects it by name.
	ok := oneTensor([]uint64{256}, uint32(quant.IQ2_XS), 0, 74)
	f, err := Parse(ok)
	if err != nil || f.Tensors[0].Type != quant.IQ2_XS {
		t.Errorf("IQ2_XS: %v", err)
	}
}

// Every truncation of a real model must fail (its last tensor ends at the
// end of the file), and random byte flips must never panic.
func TestTruncateAndFlip(t *testing.T) {
	orig, err := os.ReadFile(testutil.Shared(t, "models/gguf/stories260K.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := Parse(orig)
	if err != nil {
		t.Fatal(err)
	}
	step := 1
	if testing.Short() {
		step = 7
	}
	hdr := int(f.DataOffset)
	for n := 0; n < len(orig); n += step {
		if n > hdr {
			n += 997 // data region: sample it
		}
		if n >= len(orig) {
			break
		}
		if _, err := Parse(orig[:n:n]); err == nil {
			t.Fatalf("truncated at %d of %d: no error", n, len(orig))
		}
	}
	rng := rand.New(rand.NewSource(1))
	b := make([]byte, len(orig))
	flips := 3000
	if testing.Short() {
		flips = 500
	}
	for i := 0; i < flips; i++ {
		copy(b, orig)
		for k := 0; k < 1+rng.Intn(4); k++ {
			b[rng.Intn(hdr)] ^= byte(1 + rng.Intn(255))
		}
		g, err := Parse(b)
		if err == nil {
			checkParsed(t, g, len(b))
		}
	}
}

// checkParsed asserts the invariants every successfully parsed file holds.
func checkParsed(t testing.TB, f *File, n int) {
	t.Helper()
	for _, ti := range f.Tensors {
		if len(ti.Data) != ti.Size {
			t.Fatalf("tensor %q: %d data bytes, size %d", ti.Name, len(ti.Data), ti.Size)
		}
		if ti.Size > 0 && f.DataOffset+int64(ti.Offset)+int64(ti.Size) > int64(n) {
			t.Fatalf("tensor %q past the end", ti.Name)
		}
		if f.Tensor(ti.Name) != ti {
			t.Fatalf("tensor %q not indexed", ti.Name)
		}
	}
	for i, kv := range f.KV {
		if v, ok := f.Get(kv.Key); !ok || !reflect.DeepEqual(v, f.KV[i].Value) && !hasNaN(v) {
			t.Fatalf("key %q not indexed", kv.Key)
		}
	}
}

func hasNaN(v Value) bool {
	switch x := v.V.(type) {
	case float32:
		return x != x
	case float64:
		return x != x
	case []float32, []float64, []Value:
		return true // not worth walking
	}
	return false
}
