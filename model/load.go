package model

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"

	archpkg "pagoda/arch"
	"pagoda/gguf"
	"pagoda/hf"
	"pagoda/kernels"
	"pagoda/llama2c"
	"pagoda/quant"
	"pagoda/safetensors"
	"pagoda/tokenizer"
)

// Options control loading.
type Options struct {
	// Tokenizer is a tokenizer file (GGUF, tokenizer.json, llama2.c
	// tokenizer.bin) that overrides or supplies the model's own.
	Tokenizer string
	// Threads for the matmul pool (0 = number of CPUs).
	Threads int
	// Pool shares an existing worker pool instead of starting one.
	Pool *kernels.Pool
	// Reference selects the plain Go kernels, kernels.Generic, for the
	// forward pass (the slow, obvious path tests hold the fast one against).
	Reference bool
	// ContextLen overrides the context length (0 = the model's).
	ContextLen int
	// Progress, when set, is called after each weight matrix is repacked
	// for the kernels, the part of loading that grows with the model.
	Progress func(done, total int)
	// Rank of Ranks (0 or 1: the whole model) makes this model one rank
	// of a tensor-parallel group: it binds and loads only its shard of
	// each weight (package arch declares how each splits) and computes its
	// heads and its slice of the feed-forward width, exchanging partial
	// results through Group.
	Rank, Ranks int
	Group       Collective
	// Stage (the zero value: every layer) makes this model one stage of a
	// pipeline: it binds and loads only layers [Lo, Hi) — with the token
	// embedding on the first stage, the final norm and output head on the
	// last — and runs them with ForwardStage; its KV cache holds only
	// those layers.
	Stage Stage
	// MaxMemory, when positive, caps what this process binds for the
	// model: its weight matrices (its shard or stage only) plus Reserve.
	// A model over it is refused with a *MemoryError once the weights are
	// bound to the file and before any is read or repacked.
	MaxMemory int64
	// Reserve, with MaxMemory, is what the caller will allocate beside the
	// weights (the KV storage), from the model's local configuration (its
	// heads under tensor parallelism) and its layers.
	Reserve func(c *Config, st Stage) (int64, error)
}

// Open loads a model from a GGUF file, a llama2.c checkpoint (.bin) or a
// Hugging Face directory (config.json + *.safetensors).
func Open(path string, o Options) (*Model, error) {
	m, err := open(path, o)
	if err != nil {
		if strings.Contains(err.Error(), path) {
			// The format reader already named the file.
			return nil, fmt.Errorf("model: %w", err)
		}
		return nil, fmt.Errorf("model: %s: %w", path, err)
	}
	return m, nil
}

// modelFormats says what -m takes, for errors about files that are none.
const modelFormats = "Pagoda reads GGUF files (.gguf), llama2.c checkpoints (.bin) and Hugging Face directories (config.json with *.safetensors)"

// notModelFile words a failed llama2.c read, the format tried last: a
// file that is no llama2.c checkpoint either is no model file at all,
// which says more than the llama2.c header field that looked wrong. Errors
// reading the file (a *fs.PathError) stay as they are.
func notModelFile(path string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return err
	}
	_, why, _ := strings.Cut(err.Error(), path+": ")
	return fmt.Errorf("%s is not a model file: %s (read as a llama2.c checkpoint: %s)", path, modelFormats, cmp.Or(why, err.Error()))
}

func open(path string, o Options) (*Model, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	var (
		cfg    *Config
		src    source
		tok    tokenizer.Tokenizer
		closer io.Closer
	)
	switch {
	case st.IsDir():
		cfg, src, closer, err = openHF(path)
	case strings.HasSuffix(strings.ToLower(path), ".gguf") && !gguf.IsGGUF(path):
		return nil, fmt.Errorf("not a GGUF file (no GGUF magic at the start)")
	case gguf.IsGGUF(path):
		var f *gguf.File
		f, err = gguf.Open(path)
		if err != nil {
			return nil, err
		}
		closer = f
		cfg, err = configFromGGUF(f)
		if err == nil {
			err = checkGGUFLayers(f, cfg.NLayer)
		}
		if err == nil {
			src = ggufSource{f}
			if o.Tokenizer == "" {
				tok, err = tokenizer.FromGGUF(f)
				if err != nil {
					err = fmt.Errorf("tokenizer: %w", err)
				}
			}
		}
	default:
		var c *llama2c.Checkpoint
		c, err = llama2c.Open(path)
		if err != nil {
			return nil, notModelFile(path, err)
		}
		closer = c
		cfg = configFromLlama2C(c.Config)
		src = llama2cSource{c}
	}
	if err != nil {
		if closer != nil {
			closer.Close()
		}
		return nil, err
	}
	if o.Tokenizer != "" {
		tok, err = tokenizer.Load(o.Tokenizer)
		if err != nil {
			closer.Close()
			return nil, fmt.Errorf("tokenizer %s: %w", o.Tokenizer, err)
		}
	}
	if o.ContextLen > 0 {
		cfg.ContextLen = o.ContextLen
	}
	m, err := newModel(cfg, src, o)
	if err != nil {
		closer.Close()
		return nil, err
	}
	m.closer = closer
	m.tok = tok
	if tok != nil && tok.Vocab().Size() > cfg.VocabSize {
		m.Close()
		return nil, fmt.Errorf("tokenizer has %d tokens but the model only %d", tok.Vocab().Size(), cfg.VocabSize)
	}
	return m, nil
}

// --- GGUF ---

// checkGGUFLayers refuses a file holding tensors of a layer at or past
// its block_count, as llama.cpp does: the layers are bound by name, so the
// surplus would be dropped without a word and a truncated model run.
func checkGGUFLayers(f *gguf.File, n int) error {
	for _, t := range f.Tensors {
		if l, _, ok := archpkg.SplitLayer(t.Name, "blk."); ok {
			if v, err := strconv.Atoi(l); err == nil && v >= n {
				return fmt.Errorf("block_count is %d but the file has a tensor of layer %d (%s)", n, v, t.Name)
			}
		}
	}
	return nil
}

type ggufSource struct{ f *gguf.File }

func (s ggufSource) tensor(name string) (*rawTensor, bool) {
	t := s.f.Tensor(name)
	if t == nil {
		return nil, false
	}
	return &rawTensor{Type: t.Type, Dims: t.Dims, Data: t.Data}, true
}

func (s ggufSource) release(b []byte) { s.f.Release(b) }

func configFromGGUF(f *gguf.File) (*Config, error) {
	arch, ok := f.String("general.architecture")
	if !ok {
		return nil, fmt.Errorf("general.architecture missing")
	}
	decl, err := lookupArch(arch)
	if err != nil {
		return nil, err
	}
	c := &Config{RopeScale: 1}
	var missing []string
	u := func(key string) int {
		v, ok := f.Uint(arch + "." + key)
		if !ok {
			missing = append(missing, arch+"."+key)
			return 0
		}
		if v > 1<<31 {
			return -1
		}
		return int(v)
	}
	c.NLayer = u("block_count")
	c.NEmbd = u("embedding_length")
	opt := func(key string) (int, bool) {
		v, ok := f.Uint(arch + "." + key)
		if v > 1<<31 {
			return -1, ok
		}
		return int(v), ok
	}
	c.NExpert, _ = opt("expert_count")
	if c.NExpert > 0 {
		// Mixture of experts: the dense width is optional (qwen2moe,
		// qwen3moe write none), the experts' width defaults to it
		// (Mixtral, OLMoE).
		c.FFN, _ = opt("feed_forward_length")
		if err := c.moeFromGGUF(f, arch, decl, opt, u); err != nil {
			return nil, err
		}
	} else {
		c.FFN = u("feed_forward_length")
		if decl.FFN == nil {
			return nil, fmt.Errorf("architecture %q needs %s.expert_count > 0 (it has no dense feed-forward form)", arch, arch)
		}
	}
	c.NHead = u("attention.head_count")
	c.ContextLen = u("context_length")
	if len(missing) > 0 {
		return nil, fmt.Errorf("metadata missing: %s", strings.Join(missing, ", "))
	}
	if err := c.optionalFromGGUF(f, arch); err != nil {
		return nil, err
	}
	if emb := f.Tensor("token_embd.weight"); emb != nil && len(emb.Dims) == 2 {
		c.VocabSize = int(min(emb.Dims[1], 1<<31))
	}
	c.TiedOutput = f.Tensor("output.weight") == nil
	// GGUF records no attention_bias: biases only where the architecture
	// always has them.
	c.setArch(decl, false)
	if c.NExpert > 0 {
		if err := c.routingFromGGUF(f, arch, decl); err != nil {
			return nil, err
		}
	}
	if c.MLA {
		if err := c.mlaFromGGUF(f, arch); err != nil {
			return nil, err
		}
	}
	if err := c.ropeFreqsFromGGUF(f); err != nil {
		return nil, err
	}
	return c, c.Validate()
}

// ropeFreqsFromGGUF reads the per-dimension RoPE frequency factors
// (Llama 3.1's long-context scaling) when the file carries them; it runs
// after setArch, which fixes RopeDim.
func (c *Config) ropeFreqsFromGGUF(f *gguf.File) error {
	rf := f.Tensor("rope_freqs.weight")
	if rf == nil {
		return nil
	}
	n := c.RopeDim / 2
	if rf.Type != quant.F32 || len(rf.Data) < 4*n {
		return fmt.Errorf("tensor \"rope_freqs.weight\": want %d F32 values", n)
	}
	c.RopeFreqs = make([]float32, n)
	return quant.Dequantize(quant.F32, rf.Data[:4*n], c.RopeFreqs)
}

// optionalFromGGUF reads the keys that have defaults: head layout, RoPE,
// norm epsilon, pooling, sliding window.
func (c *Config) optionalFromGGUF(f *gguf.File, arch string) error {
	c.NKVHead = c.NHead
	if v, ok := f.Uint(arch + ".attention.head_count_kv"); ok {
		c.NKVHead = int(min(v, 1<<20))
	}
	if c.NHead > 0 {
		c.HeadDim = c.NEmbd / c.NHead
	}
	if v, ok := f.Uint(arch + ".attention.key_length"); ok {
		c.HeadDim = int(min(v, 1<<20))
	}
	c.RopeDim = c.HeadDim
	if v, ok := f.Uint(arch + ".rope.dimension_count"); ok {
		c.RopeDim = int(min(v, 1<<20))
	}
	c.RopeTheta = 10000
	if v, ok := f.Float(arch + ".rope.freq_base"); ok {
		c.RopeTheta = v
	}
	c.RMSEps = 1e-5
	if v, ok := f.Float(arch + ".attention.layer_norm_rms_epsilon"); ok {
		c.RMSEps = float32(v)
	}
	if v, ok := f.Int(arch + ".pooling_type"); ok {
		c.Pooling = PoolingName(v)
	}
	if v, ok := f.Uint(arch + ".attention.sliding_window"); ok {
		c.SlidingWindow = int(min(v, 1<<30))
	}
	if t, ok := f.String(arch + ".rope.scaling.type"); ok && t == "linear" {
		if v, ok := f.Float(arch + ".rope.scaling.factor"); ok && v > 0 {
			c.RopeScale = v
		}
	} else if ok && t != "none" && t != "" {
		if v, ok := f.Float(arch + ".rope.scaling.factor"); ok && v != 1 && v != 0 {
			return fmt.Errorf("%s.rope.scaling.type %q (factor %g) not supported", arch, t, v)
		}
	}
	return nil
}

// moeFromGGUF reads the expert counts and widths of a mixture-of-experts
// file.
func (c *Config) moeFromGGUF(f *gguf.File, arch string, decl *archpkg.Arch, opt func(string) (int, bool), u func(string) int) error {
	if decl.MoE == nil {
		return fmt.Errorf("architecture %q has %d experts but no mixture-of-experts form", arch, c.NExpert)
	}
	if f.Tensor("blk.0.ffn_gate.0.weight") != nil && f.Tensor("blk.0.ffn_gate_exps.weight") == nil {
		return fmt.Errorf("tensor \"blk.0.ffn_gate.0.weight\": experts stored one tensor each (an old Mixtral conversion); re-convert with 3-D ffn_*_exps tensors")
	}
	c.NExpertUsed = u("expert_used_count")
	c.ExpertFFN = c.FFN
	if v, ok := opt("expert_feed_forward_length"); ok {
		c.ExpertFFN = v
	}
	c.NDenseLead, _ = opt("leading_dense_block_count")
	if v, ok := opt("expert_shared_feed_forward_length"); ok {
		c.SharedFFN = v
	} else if n, ok := opt("expert_shared_count"); ok && n > 0 {
		c.SharedFFN = n * c.ExpertFFN
	} else if t := f.Tensor(archpkg.BlockName(max(c.NDenseLead, 0), "ffn_up_shexp.weight")); t != nil && len(t.Dims) == 2 {
		c.SharedFFN = int(min(t.Dims[1], 1<<31))
	}
	return nil
}

// routingFromGGUF applies the metadata's gating, renormalisation and
// scale where the architecture takes them from the checkpoint (deepseek2);
// elsewhere llama.cpp fixes them per architecture and so does setArch.
func (c *Config) routingFromGGUF(f *gguf.File, arch string, decl *archpkg.Arch) error {
	moe, _ := decl.MoE.(archpkg.MoE)
	if !moe.Configured {
		return nil
	}
	if v, ok := f.Uint(arch + ".expert_gating_func"); ok {
		switch v {
		case 1:
			c.Gating = archpkg.GatingSoftmax
		case 2:
			c.Gating = archpkg.GatingSigmoid
		default:
			return fmt.Errorf("%s.expert_gating_func = %d: unknown gating function (softmax 1, sigmoid 2)", arch, v)
		}
	}
	if v, ok := f.Bool(arch + ".expert_weights_norm"); ok {
		c.ExpertNorm = v
	}
	if v, ok := f.Float(arch + ".expert_weights_scale"); ok {
		c.ExpertScale = float32(v)
	}
	return nil
}

// mlaFromGGUF reads the latent attention's ranks and head dims. Files
// converted since llama.cpp split attn_kv_b write key_length_mla and
// value_length_mla (query/key and value heads) and describe the cache in
// key_length (kv_lora_rank + rope); older ones give the heads in
// key_length and value_length.
func (c *Config) mlaFromGGUF(f *gguf.File, arch string) error {
	get := func(key string) (int, bool) {
		v, ok := f.Uint(arch + "." + key)
		return int(min(v, 1<<20)), ok
	}
	kvl, ok := get("attention.kv_lora_rank")
	if !ok {
		return fmt.Errorf("metadata missing: %s.attention.kv_lora_rank", arch)
	}
	c.KVLoRA = kvl
	c.QLoRA, _ = get("attention.q_lora_rank")
	c.QKRope = c.RopeDim
	qk, ok := get("attention.key_length_mla")
	if !ok {
		qk = c.HeadDim
	}
	v, ok := get("attention.value_length_mla")
	if !ok {
		if v, ok = get("attention.value_length"); !ok {
			v = qk - c.QKRope
		}
	}
	c.QKNope, c.VHeadDim = qk-c.QKRope, v
	c.NKVHead, c.HeadDim = 1, c.KVLoRA+c.QKRope
	c.KVBCombined = f.Tensor("blk.0.attn_k_b.weight") == nil && f.Tensor("blk.0.attn_kv_b.weight") != nil
	return nil
}

// --- llama2.c ---

type llama2cSource struct{ c *llama2c.Checkpoint }

func (s llama2cSource) tensor(name string) (*rawTensor, bool) {
	t := s.c.Tensor(name)
	if t == nil {
		return nil, false
	}
	return &rawTensor{Type: t.Type, Dims: t.Dims, Data: t.Data}, true
}

func configFromLlama2C(lc llama2c.Config) *Config {
	c := &Config{
		NLayer:     lc.NLayers,
		NEmbd:      lc.Dim,
		NHead:      lc.NHeads,
		NKVHead:    lc.NKVHeads,
		FFN:        lc.HiddenDim,
		VocabSize:  lc.VocabSize,
		ContextLen: lc.SeqLen,
		RopeTheta:  10000,
		RopeScale:  1,
		RMSEps:     1e-5,
		TiedOutput: lc.SharedClassifier,
	}
	if c.NHead > 0 {
		c.HeadDim = c.NEmbd / c.NHead
	}
	c.RopeDim = c.HeadDim
	c.setArch(llama2c.Arch(), false)
	return c
}

// --- Hugging Face ---

type hfSource struct {
	set  *safetensors.Set
	hc   *hf.Config
	perm map[string]*rawTensor // q/k weights with the rotate-half permutation undone; GPTQ/AWQ layers repacked
	// colPerms are the act-order column orders met so far, shared by the
	// layers that agree (q/k/v, gate/up) so one gather serves them.
	colPerms [][]int32
}

func (s *hfSource) tensor(name string) (*rawTensor, bool) {
	if t, ok := s.perm[name]; ok {
		return t, true
	}
	hn, ok := s.hc.HFName(name)
	if !ok {
		return nil, false
	}
	t, ok := s.set.Tensor(hn)
	if !ok {
		return s.quantTensor(name, hn)
	}
	typ, ok := hf.TensorType(t.DType)
	if !ok {
		// An unsupported dtype reaches the binder as an unknown type
		// with a name in the error.
		return &rawTensor{Type: quant.Type(0xFFFF), DType: t.DType}, true
	}
	dims := make([]uint64, len(t.Shape))
	for i, d := range t.Shape {
		dims[len(t.Shape)-1-i] = uint64(d)
	}
	rt := &rawTensor{Type: typ, Dims: dims, Data: t.Data}
	// HF llama checkpoints store q/k rows in the rotate-half order; ggml's
	// "normal" rope wants adjacent pairs, as llama.cpp's converter
	// arranges them. Rows that do not split into heads are left as they
	// are for the binder's shape check to reject.
	if heads, ok := s.hc.PermutedHeads(name); ok && len(dims) == 2 {
		rb, err := quant.RowSize(typ, int(dims[0]))
		if err == nil {
			if data := hf.Unpermute(t.Data, rb, int(dims[1]), heads); data != nil {
				p := &rawTensor{Type: typ, Dims: dims, Data: data}
				s.perm[name] = p
				return p, true
			}
		}
	}
	return rt, true
}

func (s *hfSource) fileName(name string) string {
	hn, _ := s.hc.HFName(name)
	if _, ok := s.set.Tensor(hn); !ok && s.hc.Quant != nil {
		if q := strings.TrimSuffix(hn, ".weight") + ".qweight"; q != hn {
			if _, ok := s.set.Tensor(q); ok {
				return q
			}
		}
	}
	return hn
}

func openHF(dir string) (*Config, source, io.Closer, error) {
	hc, err := hf.ReadConfig(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil, fmt.Errorf("%s is not a model directory (no config.json); %s", dir, modelFormats)
	}
	if err != nil {
		return nil, nil, nil, err
	}
	c := &Config{
		NLayer:        hc.NumLayers,
		NEmbd:         hc.HiddenSize,
		NHead:         hc.NumHeads,
		NKVHead:       hc.NumKVHeads,
		HeadDim:       hc.HeadDim,
		RopeDim:       hc.HeadDim,
		FFN:           hc.IntermediateSize,
		VocabSize:     hc.VocabSize,
		ContextLen:    hc.MaxPositionEmbeddings,
		RopeTheta:     hc.RopeTheta,
		RopeScale:     1,
		RMSEps:        float32(hc.RMSEps),
		SlidingWindow: hc.SlidingWindow,
		TiedOutput:    hc.TieWordEmbeddings,
	}
	c.setArch(hc.Decl, hc.AttentionBias)
	switch rs := hc.RopeScaling; rs.Kind {
	case "llama3":
		c.RopeFreqs = Llama3RopeFreqs(c.RopeDim, c.RopeTheta, rs.Factor, rs.LowFreqFactor, rs.HighFreqFactor, rs.OriginalMaxPos)
	case "linear":
		if rs.Factor > 0 {
			c.RopeScale = rs.Factor
		}
	}
	if err := c.Validate(); err != nil {
		return nil, nil, nil, fmt.Errorf("config.json: %v", err)
	}
	set, err := safetensors.OpenDir(dir)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := hf.CheckLayers(set.Names(), hc.NumLayers); err != nil {
		set.Close()
		return nil, nil, nil, err
	}
	_, head := set.Tensor("lm_head.weight")
	if _, ok := set.Tensor("lm_head.qweight"); ok && hc.Quant != nil {
		head = true // a quantized lm_head (lm_head: true)
	}
	if !head {
		c.TiedOutput = true
	}
	return c, &hfSource{set: set, hc: hc, perm: map[string]*rawTensor{}}, set, nil
}
