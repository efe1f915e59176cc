package llama2c

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"pagoda/gguf"
	"pagoda/quant"
	"pagoda/testutil"
)

func floats(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

var storiesCfg = Config{Dim: 64, HiddenDim: 172, NLayers: 5, NHeads: 8, NKVHeads: 4, VocabSize: 512, SeqLen: 512, SharedClassifier: true}

// The official GGUF conversion of the same checkpoint holds the same floats
// under the same names and shapes.
func TestStoriesV0MatchesGGUF(t *testing.T) {
	c, err := Open(testutil.Shared(t, "models/llama2.c/stories260K.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Config != storiesCfg || c.Config.HeadDim() != 8 || c.Config.KVDim() != 32 {
		t.Fatalf("config %+v", c.Config)
	}
	if len(c.Tensors) != 47 || c.Tensor("output.weight") != nil {
		t.Fatalf("%d tensors", len(c.Tensors))
	}
	g, err := gguf.Open(testutil.Shared(t, "models/gguf/stories260K.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for _, x := range c.Tensors {
		y := g.Tensor(x.Name)
		if y == nil {
			t.Errorf("%s not in the GGUF", x.Name)
			continue
		}
		if x.Type != quant.F32 || !reflect.DeepEqual(x.Dims, y.Dims) || !bytes.Equal(x.Data, y.Data) {
			t.Errorf("%s: dims %v vs %v, equal data %v", x.Name, x.Dims, y.Dims, bytes.Equal(x.Data, y.Data))
		}
	}
	if k := c.Tensor("blk.2.attn_k.weight"); !reflect.DeepEqual(k.Dims, []uint64{64, 32}) {
		t.Errorf("attn_k dims %v", k.Dims)
	}
}

// The Q8 checkpoint dequantizes to the f32 weights within half a
// quantization step of each group (scale = max|w|/127).
func TestStoriesQ8(t *testing.T) {
	q, err := Open(testutil.Shared(t, "models/llama2.c/stories260K_q8.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	want := storiesCfg
	want.Version, want.GroupSize = 2, 4
	if q.Config != want {
		t.Fatalf("config %+v", q.Config)
	}
	f, err := Open(testutil.Shared(t, "models/llama2.c/stories260K.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if len(q.Tensors) != len(f.Tensors) {
		t.Fatalf("%d vs %d tensors", len(q.Tensors), len(f.Tensors))
	}
	var maxErr float64
	for _, ft := range f.Tensors {
		qt := q.Tensor(ft.Name)
		if qt == nil || qt.Type != quant.F32 || !reflect.DeepEqual(qt.Dims, ft.Dims) {
			t.Fatalf("%s: %+v", ft.Name, qt)
		}
		a, b := floats(ft.Data), floats(qt.Data)
		if len(ft.Dims) == 1 {
			if !reflect.DeepEqual(a, b) {
				t.Errorf("%s: norm weights differ", ft.Name)
			}
			continue
		}
		for g := 0; g < len(a); g += 4 {
			var amax float64
			for _, x := range a[g : g+4] {
				amax = math.Max(amax, math.Abs(float64(x)))
			}
			bound := amax/127/2*1.0001 + 1e-9
			for i := g; i < g+4; i++ {
				d := math.Abs(float64(a[i]) - float64(b[i]))
				maxErr = math.Max(maxErr, d)
				if d > bound {
					t.Fatalf("%s[%d]: f32 %v, q8 %v, error %g > %g", ft.Name, i, a[i], b[i], d, bound)
				}
			}
		}
	}
	if maxErr == 0 || maxErr > 0.05 {
		t.Errorf("max abs error %g: implausible", maxErr)
	}
}

func TestTruncated(t *testing.T) {
	for _, rel := range []string{"models/llama2.c/stories260K.bin", "models/llama2.c/stories260K_q8.bin"} {
		orig, err := os.ReadFile(testutil.Shared(t, rel))
		if err != nil {
			t.Fatal(err)
		}
		for n := 0; n < len(orig); n += 1 + n/16 {
			if _, err := Parse(orig[:n:n]); err == nil {
				t.Fatalf("%s truncated at %d: no error", rel, n)
			}
		}
		// Trailing garbage means the header does not describe the file.
		if _, err := Parse(append(append([]byte(nil), orig...), 0, 0, 0, 0)); err == nil || !strings.Contains(err.Error(), "left over") {
			t.Errorf("%s with 4 extra bytes: %v", rel, err)
		}
		p := filepath.Join(t.TempDir(), "cut.bin")
		os.WriteFile(p, orig[:len(orig)-3], 0o644)
		if _, err := Open(p); err == nil || !strings.HasPrefix(err.Error(), "llama2c: "+p+": ") {
			t.Errorf("truncated file: %v", err)
		}
	}
}

func TestBadHeaders(t *testing.T) {
	le := binary.LittleEndian
	hdr := func(v ...int32) []byte {
		var b []byte
		for _, x := range v {
			b = le.AppendUint32(b, uint32(x))
		}
		return append(b, make([]byte, 300)...)
	}
	for _, c := range []struct {
		b    []byte
		want string
	}{
		{hdr(0, 172, 5, 8, 4, 512, 512), "dim = 0"},
		{hdr(64, 172, 5, 8, 4, 512, -1), "seq_len = -1"},
		{hdr(64, 172, 5, 7, 7, 512, 512), "not a multiple of n_heads"},
		{hdr(64, 172, 5, 8, 3, 512, 512), "n_kv_heads"},
		{hdr(1<<30, 172, 5, 8, 4, 512, 512), "out of range"},
		{hdr(64, 172, 5, 8, 4, 512, 512), "truncated"},
		{hdr(magic, 3), "version 3"},
		{hdr(magic, 2, 64, 172, 5, 8, 4, 512, 512, 0x00000107), "shared_classifier"},
		{hdr(magic, 2, 64, 172, 5, 8, 4, 512, 512, 0x00000501), "group size"},
		{[]byte{1, 2}, "too short"},
	} {
		if _, err := Parse(c.b); err == nil || !strings.HasPrefix(err.Error(), "llama2c: ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want %q", c.b[:12], err, c.want)
		}
	}
	if _, err := Open(filepath.Join(t.TempDir(), "none.bin")); err == nil {
		t.Error("missing file opened")
	}
}

// synth describes a small checkpoint whose tensor i is filled with
// value(i, j) so that the reader's ordering is checked against the
// format description, not against itself.
type synthCkpt struct {
	cfg   Config
	names []string   // in file order
	dims  [][]uint64 // per name
}

func newSynth(cfg Config, order string) synthCkpt {
	d, h, v, kv := uint64(cfg.Dim), uint64(cfg.HiddenDim), uint64(cfg.VocabSize), uint64(cfg.KVDim())
	shapes := map[string][]uint64{
		"token_embd": {d, v}, "attn_norm": {d}, "attn_q": {d, d}, "attn_k": {d, kv}, "attn_v": {d, kv},
		"attn_output": {d, d}, "ffn_norm": {d}, "ffn_gate": {d, h}, "ffn_down": {h, d}, "ffn_up": {d, h},
		"output_norm": {d}, "output": {d, v},
	}
	var s synthCkpt
	s.cfg = cfg
	for _, part := range strings.Fields(order) {
		name := part
		layered := strings.HasPrefix(part, "L:")
		if layered {
			name = part[2:]
		}
		if name == "output" && cfg.SharedClassifier {
			continue
		}
		if !layered {
			s.names = append(s.names, name+".weight")
			s.dims = append(s.dims, shapes[name])
			continue
		}
		for l := 0; l < cfg.NLayers; l++ {
			s.names = append(s.names, fmt.Sprintf("blk.%d.%s.weight", l, name))
			s.dims = append(s.dims, shapes[name])
		}
	}
	return s
}

func elems(d []uint64) int {
	n := 1
	for _, x := range d {
		n *= int(x)
	}
	return n
}

func value(i, j int) float32 { return float32(i) + float32(j%7)/8 }

func TestSyntheticV0Unshared(t *testing.T) {
	cfg := Config{Dim: 8, HiddenDim: 12, NLayers: 2, NHeads: 2, NKVHeads: 1, VocabSize: 10, SeqLen: 3}
	s := newSynth(cfg, "token_embd L:attn_norm L:attn_q L:attn_k L:attn_v L:attn_output L:ffn_norm L:ffn_gate L:ffn_down L:ffn_up output_norm output")
	le := binary.LittleEndian
	var b []byte
	for _, x := range []int{8, 12, 2, 2, 1, -10, 3} {
		b = le.AppendUint32(b, uint32(int32(x)))
	}
	for i, d := range s.dims {
		if s.names[i] == "output.weight" {
			// freq_cis_real and _imag come before the classifier.
			b = append(b, make([]byte, 2*4*3*2)...)
		}
		for j := 0; j < elems(d); j++ {
			b = le.AppendUint32(b, math.Float32bits(value(i, j)))
		}
	}
	checkSynth(t, b, s, quant.F32)
}

func TestSyntheticV1(t *testing.T) {
	cfg := Config{Dim: 8, HiddenDim: 12, NLayers: 2, NHeads: 2, NKVHeads: 2, VocabSize: 10, SeqLen: 3, Version: 1}
	s := newSynth(cfg, "L:attn_norm L:ffn_norm output_norm token_embd L:attn_q L:attn_k L:attn_v L:attn_output L:ffn_gate L:ffn_down L:ffn_up output")
	b := v12Header(cfg, 0)
	for i, d := range s.dims {
		for j := 0; j < elems(d); j++ {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(value(i, j)))
		}
	}
	checkSynth(t, b, s, quant.F32)
}

func v12Header(cfg Config, gs int) []byte {
	le := binary.LittleEndian
	b := le.AppendUint32(nil, magic)
	b = le.AppendUint32(b, uint32(cfg.Version))
	for _, x := range []int{cfg.Dim, cfg.HiddenDim, cfg.NLayers, cfg.NHeads, cfg.NKVHeads, cfg.VocabSize, cfg.SeqLen} {
		b = le.AppendUint32(b, uint32(x))
	}
	if cfg.SharedClassifier {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	if cfg.Version == 2 {
		b = le.AppendUint32(b, uint32(gs))
	}
	return append(b, make([]byte, 256-len(b))...)
}

// A version 2 file with group size 64 and power-of-two scales converts to
// Q8_0 exactly; one inexact scale forces F32 for that tensor.
func TestSyntheticV2Q8_0(t *testing.T) {
	cfg := Config{Dim: 64, HiddenDim: 128, NLayers: 1, NHeads: 4, NKVHeads: 4, VocabSize: 3, SeqLen: 8, Version: 2, GroupSize: 64, SharedClassifier: true}
	s := newSynth(cfg, "L:attn_norm L:ffn_norm output_norm token_embd L:attn_q L:attn_k L:attn_v L:attn_output L:ffn_gate L:ffn_down L:ffn_up")
	le := binary.LittleEndian
	b := v12Header(cfg, 64)
	nNorms := 3
	for i := 0; i < nNorms; i++ {
		for j := 0; j < elems(s.dims[i]); j++ {
			b = le.AppendUint32(b, math.Float32bits(value(i, j)))
		}
	}
	scaleOf := func(i, g int) float32 {
		if s.names[i] == "blk.0.ffn_up.weight" && g == 1 {
			return 0.1 // not exact in f16
		}
		return float32(math.Ldexp(1, -(i+g)%20)) // exact
	}
	for i := nNorms; i < len(s.names); i++ {
		n := elems(s.dims[i])
		for j := 0; j < n; j++ {
			b = append(b, byte(int8(j%255-127)))
		}
		for g := 0; g < n/64; g++ {
			b = le.AppendUint32(b, math.Float32bits(scaleOf(i, g)))
		}
	}
	c, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	for i, name := range s.names {
		tt := c.Tensor(name)
		if tt == nil || !reflect.DeepEqual(tt.Dims, s.dims[i]) {
			t.Fatalf("%s: %+v", name, tt)
		}
		var got []float32
		switch {
		case i < nNorms:
			got = floats(tt.Data)
			for j, x := range got {
				if x != value(i, j) {
					t.Fatalf("%s[%d] = %v", name, j, x)
				}
			}
			continue
		case name == "blk.0.ffn_up.weight":
			if tt.Type != quant.F32 {
				t.Fatalf("%s: type %s, want F32", name, tt.Type)
			}
			got = floats(tt.Data)
		default:
			if tt.Type != quant.Q8_0 {
				t.Fatalf("%s: type %s, want Q8_0", name, tt.Type)
			}
			got = decodeQ8_0(tt.Data)
		}
		for j, x := range got {
			want := float32(int8(j%255-127)) * scaleOf(i, j/64)
			if x != want {
				t.Fatalf("%s[%d] = %v, want %v", name, j, x, want)
			}
		}
	}
}

// decodeQ8_0 is an independent Q8_0 decoder: per 32 values an f16 scale and
// 32 int8.
func decodeQ8_0(b []byte) []float32 {
	var out []float32
	for blk := 0; blk+34 <= len(b); blk += 34 {
		h := binary.LittleEndian.Uint16(b[blk:])
		var d float32
		if e := int(h >> 10 & 0x1f); e == 0 {
			d = float32(math.Ldexp(float64(h&0x3ff), -24)) // subnormal
		} else {
			d = float32(math.Ldexp(1+float64(h&0x3ff)/1024, e-15))
		}
		if h&0x8000 != 0 {
			d = -d
		}
		for i := 0; i < 32; i++ {
			out = append(out, float32(int8(b[blk+2+i]))*d)
		}
	}
	return out
}

func checkSynth(t *testing.T, b []byte, s synthCkpt, typ quant.Type) {
	t.Helper()
	c, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if c.Config.SharedClassifier != s.cfg.SharedClassifier || c.Config.Version != s.cfg.Version || c.Config.VocabSize != s.cfg.VocabSize {
		t.Errorf("config %+v", c.Config)
	}
	if len(c.Tensors) != len(s.names) {
		t.Fatalf("%d tensors, want %d", len(c.Tensors), len(s.names))
	}
	for i, name := range s.names {
		tt := c.Tensor(name)
		if tt == nil || tt.Type != typ || !reflect.DeepEqual(tt.Dims, s.dims[i]) {
			t.Fatalf("%s: %+v", name, tt)
		}
		for j, x := range floats(tt.Data) {
			if x != value(i, j) {
				t.Fatalf("%s[%d] = %v, want %v", name, j, x, value(i, j))
			}
		}
	}
}

func TestExactF16(t *testing.T) {
	for _, c := range []struct {
		f  float32
		h  uint16
		ok bool
	}{
		{0, 0, true}, {float32(math.Copysign(0, -1)), 0x8000, true}, {1, 0x3c00, true}, {-2, 0xc000, true},
		{65504, 0x7bff, true}, {65536, 0, false}, {0.1, 0, false}, {1.0 / (1 << 24), 1, true},
		{3.0 / (1 << 24), 3, true}, {1.0 / (1 << 25), 0, false}, {float32(math.Ldexp(1023, -24)), 0x3ff, true},
		{float32(math.Ldexp(1, -14)), 0x0400, true}, {float32(math.Inf(1)), 0, false},
	} {
		h, ok := exactF16(c.f)
		if ok != c.ok || (ok && h != c.h) {
			t.Errorf("exactF16(%g) = %#x %v, want %#x %v", c.f, h, ok, c.h, c.ok)
		}
	}
}

// tok512.bin is the vocabulary of stories260K; in SentencePiece spelling it
// equals the GGUF conversion's tokens, scores and types.
func TestVocab(t *testing.T) {
	v, err := ReadVocab(testutil.Shared(t, "models/llama2.c/tok512.bin"))
	if err != nil {
		t.Fatal(err)
	}
	g, err := gguf.Open(testutil.Shared(t, "models/gguf/stories260K.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	toks, _ := g.Strings("tokenizer.ggml.tokens")
	scores, _ := g.Float32s("tokenizer.ggml.scores")
	types, _ := g.Int32s("tokenizer.ggml.token_type")
	if len(v.Tokens) != 512 || v.MaxTokenLength != 7 {
		t.Fatalf("%d tokens, max len %d", len(v.Tokens), v.MaxTokenLength)
	}
	if !reflect.DeepEqual(v.Pieces(), toks) || !reflect.DeepEqual(v.Scores, scores) || !reflect.DeepEqual(v.Types(), types) {
		t.Error("tok512.bin differs from the GGUF vocabulary")
	}
	big, err := ReadVocab(testutil.Shared(t, "models/llama2.c/tokenizer.bin"))
	if err != nil || len(big.Tokens) != 32000 || big.Pieces()[1] != "<s>" || big.Types()[259] != TypeNormal || big.Types()[3] != TypeByte {
		t.Fatalf("tokenizer.bin: %v", err)
	}
	raw, _ := os.ReadFile(testutil.Shared(t, "models/llama2.c/tok512.bin"))
	for n := 5; n < len(raw); n += 1 + n/32 {
		if v, err := ParseVocab(raw[:n]); err == nil && len(v.Tokens) == 512 {
			t.Fatalf("truncated at %d gave the whole vocabulary", n)
		}
	}
	if _, err := ParseVocab([]byte{7, 0, 0, 0, 0, 0, 0, 0, 255, 255, 255, 127}); err == nil {
		t.Error("huge token length accepted")
	}
}
