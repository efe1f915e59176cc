// Package synth writes synthetic GGUF models (random weights, a real-looking
// vocabulary) for tests and benchmarks of real model shapes on machines that
// have no model files.
//
// Weights are drawn from an approximate normal distribution: the sum of four
// 16-bit uniforms (Irwin–Hall), scaled to the requested standard deviation,
// from a xorshift64* generator. That is ~10× cheaper than Box–Muller and
// indistinguishable for this purpose; the tails stop at ±3.46σ. Every chunk
// of rows has its own stream seeded from (Seed, tensor name, chunk index),
// so the file does not depend on the number of threads, and the same seed
// gives the same float weights whatever the storage type (a Q4_0 file is
// the quantization of the F32 file with the same seed).
package synth

import (
	"fmt"
	"hash/fnv"
	"io"
	"runtime"
	"sort"
	"strings"
	"sync"

	"pagoda/arch"
	"pagoda/gguf"
	"pagoda/quant"
)

// Shape is a model architecture and its hyper-parameters.
type Shape struct {
	// Arch is a registered GGUF architecture (package arch): "llama",
	// "qwen2" (adds q/k/v biases), "qwen3" (adds per-head q/k RMSNorm
	// weights)…
	Arch                                                      string
	Layers, Dim, Heads, KVHeads, HeadDim, FFN, Vocab, Context int
	RopeTheta                                                 float64
	RMSEps                                                    float64
	// Tied: no output.weight; the token embedding doubles as the output.
	Tied bool

	// Mixture of experts (Experts 0: dense): ExpertsUsed of Experts
	// experts of width ExpertFFN per token, shared experts of total width
	// SharedFFN (a multiple of ExpertFFN for deepseek2), and DenseLead
	// leading layers with the dense FFN of width FFN (deepseek2).
	Experts, ExpertsUsed, ExpertFFN, SharedFFN, DenseLead int
	// ExpertWeightsNorm and ExpertWeightsScale are deepseek2's routing
	// metadata (written only for deepseek2).
	ExpertWeightsNorm  bool
	ExpertWeightsScale float64
	// Multi-head latent attention (deepseek2): QLoRA 0 means a plain
	// attn_q; HeadDim is ignored (QKNope+QKRope per query head).
	QLoRA, KVLoRA, QKNope, QKRope, VHead int
	// MLACombined writes MLA as conversions before llama.cpp split
	// attn_kv_b did: one attn_kv_b per layer, key_length qk_nope+qk_rope
	// and value_length v_head, no *_mla keys (what older llama.cpp builds
	// read, for side-by-side runs).
	MLACombined bool
}

var presets = map[string]Shape{
	"tiny": {Arch: "llama", Layers: 2, Dim: 64, Heads: 4, KVHeads: 2, HeadDim: 16, FFN: 172, Vocab: 512,
		Context: 2048, RopeTheta: 10000, RMSEps: 1e-5},
	"tinyllama-1.1b": {Arch: "llama", Layers: 22, Dim: 2048, Heads: 32, KVHeads: 4, HeadDim: 64, FFN: 5632,
		Vocab: 32000, Context: 2048, RopeTheta: 10000, RMSEps: 1e-5},
	// Context is capped at 8192 (the real model allows 131072) so that
	// engines sizing a KV cache from context_length stay within memory.
	"llama3.2-1b": {Arch: "llama", Layers: 16, Dim: 2048, Heads: 32, KVHeads: 8, HeadDim: 64, FFN: 8192,
		Vocab: 128256, Context: 8192, RopeTheta: 500000, RMSEps: 1e-5, Tied: true},
	"qwen2.5-0.5b": {Arch: "llama", Layers: 24, Dim: 896, Heads: 14, KVHeads: 2, HeadDim: 64, FFN: 4864,
		Vocab: 32000, Context: 32768, RopeTheta: 1e6, RMSEps: 1e-6, Tied: true},
	// Mixture of experts and MLA, with the real models' shapes (contexts
	// capped at 8192 like above). OLMoE-1B-7B: 64 experts, 8 per token.
	"olmoe-1b-7b": {Arch: "olmoe", Layers: 16, Dim: 2048, Heads: 16, KVHeads: 16, HeadDim: 128, FFN: 1024,
		Vocab: 50304, Context: 4096, RopeTheta: 10000, RMSEps: 1e-5, Experts: 64, ExpertsUsed: 8, ExpertFFN: 1024},
	// Qwen1.5-MoE-A2.7B: 60 experts, 4 per token, a gated shared expert.
	"qwen1.5-moe-a2.7b": {Arch: "qwen2moe", Layers: 24, Dim: 2048, Heads: 16, KVHeads: 16, HeadDim: 128, FFN: 5632,
		Vocab: 151936, Context: 8192, RopeTheta: 1e6, RMSEps: 1e-6, Experts: 60, ExpertsUsed: 4, ExpertFFN: 1408, SharedFFN: 5632},
	// DeepSeek-V2-Lite: MLA without q_lora (kv_lora 512, qk 128+64, v
	// 128), one dense layer, 64 experts, 6 per token, 2 shared. The real
	// model's YaRN rope scaling (factor 40 past 4096) is left out.
	"deepseek-v2-lite": {Arch: "deepseek2", Layers: 27, Dim: 2048, Heads: 16, KVHeads: 1, FFN: 10944,
		Vocab: 102400, Context: 4096, RopeTheta: 10000, RMSEps: 1e-6, Experts: 64, ExpertsUsed: 6, ExpertFFN: 1408,
		SharedFFN: 2 * 1408, DenseLead: 1, KVLoRA: 512, QKNope: 128, QKRope: 64, VHead: 128, ExpertWeightsScale: 1},
}

// Presets lists the preset names, sorted.
func Presets() []string {
	out := make([]string, 0, len(presets))
	for n := range presets {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Preset returns a named shape; "" means "tiny".
func Preset(name string) (Shape, error) {
	if name == "" {
		name = "tiny"
	}
	s, ok := presets[strings.ToLower(name)]
	if !ok {
		return Shape{}, fmt.Errorf("synth: unknown preset %q (have %s)", name, strings.Join(Presets(), ", "))
	}
	return s, nil
}

// Options configure Write.
type Options struct {
	Shape Shape
	// Type of every 2-D weight (token_embd included); 0 is F32.
	Type quant.Type
	// OutputType of output.weight (token_embd when tied); 0 = Type.
	OutputType quant.Type
	Seed       int64
	// Std of the weights; 0 means 0.02.
	Std float32
	// VocabFrom names a GGUF (its tokenizer.* metadata is copied) or a
	// llama2.c tokenizer.bin; the model's vocabulary size then follows it.
	VocabFrom string
}

// Params counts the parameters of the shape (after defaults).
func (s Shape) Params() int64 {
	s = s.withDefaults()
	a := arch.Lookup(s.Arch)
	if a == nil {
		return 0
	}
	return a.Params(s.dims(), s.Layers)
}

func (s Shape) dims() arch.Dims {
	return arch.Dims{Embd: s.Dim, Heads: s.Heads, KVHeads: s.KVHeads, HeadDim: s.HeadDim, FFN: s.FFN, Vocab: s.Vocab, Tied: s.Tied,
		Experts: s.Experts, ExpertFFN: s.ExpertFFN, SharedFFN: s.SharedFFN, DenseLead: s.DenseLead,
		QLoRA: s.QLoRA, KVLoRA: s.KVLoRA, QKNope: s.QKNope, QKRope: s.QKRope, VHead: s.VHead, KVBCombined: s.MLACombined && s.mla()}
}

// mla says whether the shape's attention is multi-head latent attention.
func (s Shape) mla() bool {
	a := arch.Lookup(s.Arch)
	if a == nil {
		return false
	}
	_, ok := a.Attn.(arch.MLA)
	return ok
}

func (s Shape) withDefaults() Shape {
	if s.Arch == "" {
		s.Arch = "llama"
	}
	if s.KVHeads == 0 {
		s.KVHeads = s.Heads
	}
	if s.HeadDim == 0 && s.Heads > 0 {
		s.HeadDim = s.Dim / s.Heads
	}
	if s.mla() {
		// The cache row: what llama.cpp's converter writes as key_length.
		s.KVHeads, s.HeadDim = 1, s.KVLoRA+s.QKRope
	}
	if s.Context == 0 {
		s.Context = 2048
	}
	if s.RopeTheta == 0 {
		s.RopeTheta = 10000
	}
	if s.RMSEps == 0 {
		s.RMSEps = 1e-5
	}
	return s
}

func (s Shape) validate() error {
	if arch.Lookup(s.Arch) == nil {
		return fmt.Errorf("architecture %q not supported (%s)", s.Arch, strings.Join(arch.Names(), ", "))
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"layers", s.Layers}, {"dim", s.Dim}, {"heads", s.Heads}, {"kv heads", s.KVHeads},
		{"head dim", s.HeadDim}, {"ffn", s.FFN}, {"vocab", s.Vocab}, {"context", s.Context}} {
		if f.v <= 0 || f.v > 1<<24 {
			return fmt.Errorf("%s = %d out of range", f.name, f.v)
		}
	}
	a := arch.Lookup(s.Arch)
	if s.Experts > 0 {
		if a.MoE == nil {
			return fmt.Errorf("architecture %s has no mixture-of-experts form", s.Arch)
		}
		if s.ExpertsUsed <= 0 || s.ExpertsUsed > s.Experts || s.ExpertFFN <= 0 || s.SharedFFN < 0 || s.DenseLead < 0 || s.DenseLead > s.Layers {
			return fmt.Errorf("experts %d, used %d, width %d, shared %d, dense lead %d out of range",
				s.Experts, s.ExpertsUsed, s.ExpertFFN, s.SharedFFN, s.DenseLead)
		}
		if s.Arch == "deepseek2" && s.SharedFFN%s.ExpertFFN != 0 {
			return fmt.Errorf("deepseek2 shared width %d is not a multiple of the expert width %d", s.SharedFFN, s.ExpertFFN)
		}
	} else if a.FFN == nil {
		return fmt.Errorf("architecture %s needs experts", s.Arch)
	}
	if s.mla() && (s.KVLoRA <= 0 || s.QKNope <= 0 || s.QKRope <= 0 || s.QKRope%2 != 0 || s.VHead <= 0 || s.QLoRA < 0) {
		return fmt.Errorf("MLA ranks and head dims out of range: q_lora %d, kv_lora %d, qk %d+%d, v %d", s.QLoRA, s.KVLoRA, s.QKNope, s.QKRope, s.VHead)
	}
	if s.Heads%s.KVHeads != 0 {
		return fmt.Errorf("heads %d is not a multiple of kv heads %d", s.Heads, s.KVHeads)
	}
	if s.HeadDim%2 != 0 {
		return fmt.Errorf("head dim %d is odd", s.HeadDim)
	}
	if !(s.RopeTheta > 0) || !(s.RMSEps > 0) {
		return fmt.Errorf("rope theta %g and rms eps %g must be positive", s.RopeTheta, s.RMSEps)
	}
	return nil
}

// fileTypes maps a weight type to llama.cpp's general.file_type (llama_ftype;
// K-quants as their _M variants, which is what llama-quantize records).
var fileTypes = map[quant.Type]uint32{
	quant.F32: 0, quant.F16: 1, quant.Q4_0: 2, quant.Q4_1: 3, quant.Q8_0: 7, quant.Q5_0: 8,
	quant.Q5_1: 9, quant.Q2_K: 10, quant.Q3_K: 12, quant.Q4_K: 15, quant.Q5_K: 17, quant.Q6_K: 18,
	quant.BF16: 32,
}

// fallback is the type llama-quantize substitutes when a row length is not
// a multiple of a K-quant's 256-element block.
func fallback(t quant.Type) quant.Type {
	switch t {
	case quant.Q2_K, quant.Q3_K:
		return quant.Q4_0
	case quant.Q4_K:
		return quant.Q5_0
	case quant.Q5_K:
		return quant.Q5_1
	case quant.Q6_K:
		return quant.Q8_0
	}
	return quant.F16
}

// storageType picks the type a weight of row length n is stored in.
func storageType(t quant.Type, n int) quant.Type {
	for n%t.BlockSize() != 0 {
		t = fallback(t)
	}
	return t
}

// tensor is one tensor to generate.
type tensor struct {
	name string
	typ  quant.Type
	dims []uint64
	fill fillKind
}

type fillKind int

const (
	fillRandom fillKind = iota
	fillOnes
)

// Write generates the model described by o and writes it to path as GGUF.
func Write(path string, o Options) error {
	w, err := newWriter(o)
	if err != nil {
		return err
	}
	return w.WriteFile(path)
}

// WriteTo generates the model and writes it to out.
func WriteTo(out io.Writer, o Options) (int64, error) {
	w, err := newWriter(o)
	if err != nil {
		return 0, err
	}
	return w.WriteTo(out)
}

func newWriter(o Options) (*gguf.Writer, error) {
	s := o.Shape.withDefaults()
	if o.Std == 0 {
		o.Std = 0.02
	}
	if !(o.Std > 0) {
		return nil, fmt.Errorf("synth: std %v must be positive", o.Std)
	}
	if o.OutputType == 0 {
		o.OutputType = o.Type
	}
	for _, t := range []quant.Type{o.Type, o.OutputType} {
		if _, ok := fileTypes[t]; !ok {
			return nil, fmt.Errorf("synth: weight type %s not supported (want one of F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K…Q6_K)", t)
		}
	}
	var vocab *vocabulary
	var err error
	if o.VocabFrom != "" {
		if vocab, err = loadVocab(o.VocabFrom); err != nil {
			return nil, fmt.Errorf("synth: vocabulary: %w", err)
		}
		s.Vocab = vocab.size
	} else {
		if s.Vocab < minVocab {
			return nil, fmt.Errorf("synth: vocab %d is smaller than the %d special and byte tokens", s.Vocab, minVocab)
		}
	}
	if err := s.validate(); err != nil {
		return nil, fmt.Errorf("synth: %w", err)
	}
	if vocab == nil {
		vocab = builtinVocab(s.Vocab)
	}

	w := gguf.NewWriter()
	a := s.Arch
	set := func(k string, v any) {
		if err == nil {
			err = w.Set(k, v)
		}
	}
	set("general.architecture", a)
	set("general.name", "synth-"+a)
	set("general.file_type", fileTypes[o.Type])
	if o.Type.BlockSize() > 1 || o.OutputType.BlockSize() > 1 {
		set("general.quantization_version", uint32(2))
	}
	set(a+".vocab_size", uint32(s.Vocab))
	set(a+".context_length", uint32(s.Context))
	set(a+".embedding_length", uint32(s.Dim))
	set(a+".block_count", uint32(s.Layers))
	set(a+".feed_forward_length", uint32(s.FFN))
	set(a+".attention.head_count", uint32(s.Heads))
	set(a+".attention.head_count_kv", uint32(s.KVHeads))
	switch {
	case s.mla() && s.MLACombined:
		// The older conversion: per-head key and value widths, every
		// head its own KV head.
		set(a+".attention.head_count_kv", uint32(s.Heads))
		set(a+".attention.key_length", uint32(s.QKNope+s.QKRope))
		set(a+".attention.value_length", uint32(s.VHead))
		set(a+".attention.q_lora_rank", uint32(s.QLoRA))
		set(a+".attention.kv_lora_rank", uint32(s.KVLoRA))
		set(a+".rope.dimension_count", uint32(s.QKRope))
		// Those builds read it unconditionally; without rope scaling it
		// scales nothing (log of a frequency scale of 1).
		set(a+".rope.scaling.yarn_log_multiplier", float32(0))
	case s.mla():
		set(a+".attention.key_length", uint32(s.HeadDim))
		// As llama.cpp's converter writes MLA: key_length is the cache row
		// (kv_lora + rope), value_length the latent, the heads in *_mla.
		set(a+".attention.value_length", uint32(s.KVLoRA))
		set(a+".attention.q_lora_rank", uint32(s.QLoRA))
		set(a+".attention.kv_lora_rank", uint32(s.KVLoRA))
		set(a+".attention.key_length_mla", uint32(s.QKNope+s.QKRope))
		set(a+".attention.value_length_mla", uint32(s.VHead))
		set(a+".rope.dimension_count", uint32(s.QKRope))
	default:
		set(a+".attention.key_length", uint32(s.HeadDim))
		set(a+".attention.value_length", uint32(s.HeadDim))
		set(a+".rope.dimension_count", uint32(s.HeadDim))
	}
	if s.Experts > 0 {
		set(a+".expert_count", uint32(s.Experts))
		set(a+".expert_used_count", uint32(s.ExpertsUsed))
		set(a+".expert_feed_forward_length", uint32(s.ExpertFFN))
		switch {
		case s.Arch == "deepseek2":
			set(a+".leading_dense_block_count", uint32(s.DenseLead))
			set(a+".expert_shared_count", uint32(s.SharedFFN/s.ExpertFFN))
			set(a+".expert_weights_norm", s.ExpertWeightsNorm)
			if s.ExpertWeightsScale != 0 {
				set(a+".expert_weights_scale", float32(s.ExpertWeightsScale))
			}
		case s.SharedFFN > 0:
			set(a+".expert_shared_feed_forward_length", uint32(s.SharedFFN))
		}
	}
	set(a+".rope.freq_base", float32(s.RopeTheta))
	set(a+".attention.layer_norm_rms_epsilon", float32(s.RMSEps))
	for _, kv := range vocab.kv {
		set(kv.Key, kv.Value)
	}
	if err != nil {
		return nil, fmt.Errorf("synth: %w", err)
	}

	for _, t := range tensors(s, o) {
		size, err := tensorBytes(t)
		if err != nil {
			return nil, fmt.Errorf("synth: tensor %q: %w", t.name, err)
		}
		t := t
		seed, std := o.Seed, o.Std
		if err := w.AddTensorFunc(t.name, t.typ, t.dims, size, func(out io.Writer) error {
			return generate(out, t, seed, std)
		}); err != nil {
			return nil, fmt.Errorf("synth: %w", err)
		}
	}
	return w, nil
}

// tensors lists every tensor the architecture declares, in its order:
// norms are ones, everything else noise.
func tensors(s Shape, o Options) []tensor {
	d := s.dims()
	var out []tensor
	for _, t := range arch.Lookup(s.Arch).Tensors(d, s.Layers) {
		if t.Optional {
			continue // e.g. DeepSeek-V3's exp_probs_b
		}
		shape := t.Shape(d)
		dims := make([]uint64, len(shape))
		for i, x := range shape {
			dims[i] = uint64(x)
		}
		st := tensor{name: t.Name, typ: quant.F32, dims: dims}
		switch {
		case t.Role.IsNorm():
			st.fill = fillOnes
		case t.Role == arch.FFNRouter:
			// llama-quantize never quantizes the router.
		case len(dims) >= 2:
			typ := o.Type
			if t.Role == arch.Output || (t.Role == arch.TokenEmbd && s.Tied) {
				typ = o.OutputType
			}
			st.typ = storageType(typ, shape[0])
		}
		out = append(out, st)
	}
	return out
}

func tensorBytes(t tensor) (int, error) {
	row, err := quant.RowSize(t.typ, int(t.dims[0]))
	if err != nil {
		return 0, err
	}
	n := row
	for _, d := range t.dims[1:] {
		n *= int(d)
	}
	return n, nil
}

// chunkElems sets how many elements one generator stream covers; it is part
// of the output's definition (seeds are per chunk), so changing it changes
// every synthetic file.
const chunkElems = 1 << 18

// generate writes the tensor's bytes, computing chunks of rows in parallel
// and writing them in order, so memory stays at a few chunks per thread.
func generate(out io.Writer, t tensor, seed int64, std float32) error {
	rowLen := int(t.dims[0])
	rows := 1
	for _, d := range t.dims[1:] {
		rows *= int(d)
	}
	rowBytes, err := quant.RowSize(t.typ, rowLen)
	if err != nil {
		return err
	}
	chunkRows := max(1, chunkElems/rowLen)
	nChunks := (rows + chunkRows - 1) / chunkRows
	workers := min(runtime.GOMAXPROCS(0), nChunks)
	if workers < 1 {
		return nil
	}
	h := fnv.New64a()
	h.Write([]byte(t.name))
	base := splitmix(uint64(seed) ^ h.Sum64())

	type slot struct {
		f   []float32
		q   []byte
		err error
	}
	slots := make([]slot, workers)
	for i := range slots {
		slots[i].f = make([]float32, chunkRows*rowLen)
		slots[i].q = make([]byte, chunkRows*rowBytes)
	}
	for first := 0; first < nChunks; first += workers {
		n := min(workers, nChunks-first)
		var wg sync.WaitGroup
		for k := 0; k < n; k++ {
			wg.Add(1)
			go func(k int) {
				defer wg.Done()
				c := first + k
				r := min(chunkRows, rows-c*chunkRows)
				sl := &slots[k]
				f := sl.f[:r*rowLen]
				switch t.fill {
				case fillOnes:
					for i := range f {
						f[i] = 1
					}
				default:
					fillNormal(f, splitmix(base+uint64(c)), std)
				}
				sl.err = quant.QuantizeInto(t.typ, f, sl.q[:r*rowBytes])
			}(k)
		}
		wg.Wait()
		for k := 0; k < n; k++ {
			if slots[k].err != nil {
				return slots[k].err
			}
			r := min(chunkRows, rows-(first+k)*chunkRows)
			if _, err := out.Write(slots[k].q[:r*rowBytes]); err != nil {
				return err
			}
		}
	}
	return nil
}

// splitmix is SplitMix64's finaliser: it turns nearby seeds into unrelated
// generator states.
func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// irwinHallStd is the standard deviation of the sum of four uniform 16-bit
// integers: sqrt(4·(65536²−1)/12).
const irwinHallStd = 37837.22

// fillNormal fills f with approximately N(0, std²) values from a xorshift64*
// stream (see the package comment).
func fillNormal(f []float32, state uint64, std float32) {
	if state == 0 {
		state = 0x9e3779b97f4a7c15
	}
	scale := std / irwinHallStd
	for i := range f {
		state ^= state >> 12
		state ^= state << 25
		state ^= state >> 27
		r := state * 2685821657736338717
		sum := int64(r&0xffff) + int64(r>>16&0xffff) + int64(r>>32&0xffff) + int64(r>>48)
		f[i] = float32(sum-131070) * scale
	}
}
