// Package llama2c reads llama2.c checkpoints (Karpathy's run.c / runq.c
// formats) and presents their weights under GGUF tensor names and shapes,
// so one model loader binds GGUF, safetensors and llama2.c alike.
//
// Formats:
//   - version 0 (legacy run.c): 7 int32 (dim, hidden_dim, n_layers, n_heads,
//     n_kv_heads, vocab_size, seq_len; a negative vocab_size means a separate
//     classifier), then float32 arrays. Tensors are views into the mapping.
//   - version 1 (export.py): 256-byte header with magic "ak42", float32
//     weights with the norms first.
//   - version 2 (runq.c): same header plus group_size; float32 norms, then
//     every matrix as int8 values followed by one float32 scale per group.
//     Per-group int8 is not a ggml type, so these matrices are dequantized
//     to F32 at load (q·scale, exactly what runq.c computes with). When the
//     group size is a multiple of 32 and every scale is exact in float16,
//     they become Q8_0 instead, which represents them without loss.
//
// llama2.c rotates adjacent pairs (2i, 2i+1), the GGUF "llama" convention,
// so attn_q/attn_k need no permutation.
package llama2c

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"

	"pagoda/arch"
	"pagoda/mmapfile"
	"pagoda/quant"
)

// Config is the checkpoint header.
type Config struct {
	Dim, HiddenDim, NLayers, NHeads, NKVHeads, VocabSize, SeqLen int
	// SharedClassifier: the output matrix is the token embedding.
	SharedClassifier bool
	// Version is 0 (legacy float32), 1 (float32, "ak42" header) or 2 (Q8).
	Version int
	// GroupSize of the version 2 quantization, 0 otherwise.
	GroupSize int
}

// HeadDim is Dim / NHeads.
func (c Config) HeadDim() int { return c.Dim / c.NHeads }

// KVDim is the width of the k and v projections.
func (c Config) KVDim() int { return c.Dim / c.NHeads * c.NKVHeads }

// Tensor is one weight under its GGUF name.
type Tensor struct {
	Name string
	// Type is F32 (or Q8_0 for losslessly converted version 2 matrices).
	Type quant.Type
	// Dims are in ggml order: Dims[0] is the row length.
	Dims []uint64
	Data []byte
}

// Checkpoint is an opened llama2.c file.
type Checkpoint struct {
	Config  Config
	Tensors []*Tensor

	index map[string]*Tensor
	unmap func() error
}

// Tensor returns the named tensor, nil when absent.
func (c *Checkpoint) Tensor(name string) *Tensor { return c.index[name] }

// Close releases the file mapping; version 0 and 1 tensor data must not be
// used afterwards.
func (c *Checkpoint) Close() error {
	if c.unmap == nil {
		return nil
	}
	u := c.unmap
	c.unmap = nil
	return u()
}

const (
	magic        = 0x616b3432 // "ak42" as a little-endian uint32
	headerV1V2   = 256
	headerLegacy = 7 * 4
	// maxDim bounds each header number so that sizes cannot overflow and a
	// corrupt header is rejected before any arithmetic.
	maxDim = 1 << 24
)

// Open reads the checkpoint at path.
func Open(path string) (*Checkpoint, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("llama2c: %w", err)
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		return nil, fmt.Errorf("llama2c: %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("llama2c: %s: not a regular file", path)
	}
	size := st.Size()
	if size < headerLegacy {
		return nil, fmt.Errorf("llama2c: %s: file is %d bytes, too short for a header", path, size)
	}
	if int64(int(size)) != size {
		return nil, fmt.Errorf("llama2c: %s: file of %d bytes does not fit in memory", path, size)
	}
	b, unmap, err := mmapfile.Map(fd, int(size))
	if err != nil {
		return nil, fmt.Errorf("llama2c: %s: %w", path, err)
	}
	c, err := parse(b)
	if err != nil {
		unmap()
		return nil, fmt.Errorf("llama2c: %s: %w", path, err)
	}
	if c.Config.Version == 2 {
		// Every tensor was copied (dequantized or converted, norms
		// included), so the mapping is no longer needed.
		unmap()
	} else {
		c.unmap = unmap
	}
	return c, nil
}

// Parse reads a checkpoint held in memory; version 0/1 tensors alias b.
func Parse(b []byte) (*Checkpoint, error) {
	c, err := parse(b)
	if err != nil {
		return nil, fmt.Errorf("llama2c: %w", err)
	}
	return c, nil
}

func parse(b []byte) (*Checkpoint, error) {
	if len(b) < headerLegacy {
		return nil, fmt.Errorf("%d bytes, too short for a header", len(b))
	}
	le := binary.LittleEndian
	var cfg Config
	var hdr []int32
	off := 0
	if le.Uint32(b) == magic {
		if len(b) < headerV1V2 {
			return nil, fmt.Errorf("%d bytes, too short for the 256-byte header", len(b))
		}
		cfg.Version = int(int32(le.Uint32(b[4:])))
		if cfg.Version != 1 && cfg.Version != 2 {
			return nil, fmt.Errorf("unsupported checkpoint version %d", cfg.Version)
		}
		for i := 0; i < 7; i++ {
			hdr = append(hdr, int32(le.Uint32(b[8+4*i:])))
		}
		switch b[36] {
		case 0, 1:
			cfg.SharedClassifier = b[36] == 1
		default:
			return nil, fmt.Errorf("shared_classifier flag is %d, want 0 or 1", b[36])
		}
		if cfg.Version == 2 {
			cfg.GroupSize = int(int32(le.Uint32(b[37:])))
		}
		off = headerV1V2
	} else {
		for i := 0; i < 7; i++ {
			hdr = append(hdr, int32(le.Uint32(b[4*i:])))
		}
		cfg.SharedClassifier = hdr[5] > 0
		if hdr[5] < 0 {
			hdr[5] = -hdr[5]
		}
		off = headerLegacy
	}
	cfg.Dim, cfg.HiddenDim, cfg.NLayers, cfg.NHeads = int(hdr[0]), int(hdr[1]), int(hdr[2]), int(hdr[3])
	cfg.NKVHeads, cfg.VocabSize, cfg.SeqLen = int(hdr[4]), int(hdr[5]), int(hdr[6])
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	// Every version stores two float32 norms of dim per layer: reject a
	// layer count the file cannot hold before naming each layer's tensors.
	if need := uint64(cfg.NLayers) * 8 * uint64(cfg.Dim); need > uint64(len(b)) {
		return nil, fmt.Errorf("header: %d layers of dim %d need over %d bytes, file has %d: truncated or header does not match", cfg.NLayers, cfg.Dim, need, len(b))
	}
	c := &Checkpoint{Config: cfg, index: map[string]*Tensor{}}
	var err error
	switch cfg.Version {
	case 0:
		err = c.readLegacy(b, off)
	case 1:
		err = c.readV1(b, off)
	case 2:
		err = c.readV2(b, off)
	}
	if err != nil {
		return nil, err
	}
	return c, nil
}

func (c Config) validate() error {
	for _, f := range []struct {
		name string
		v    int
	}{{"dim", c.Dim}, {"hidden_dim", c.HiddenDim}, {"n_layers", c.NLayers}, {"n_heads", c.NHeads},
		{"n_kv_heads", c.NKVHeads}, {"vocab_size", c.VocabSize}, {"seq_len", c.SeqLen}} {
		if f.v <= 0 || f.v > maxDim {
			return fmt.Errorf("header: %s = %d out of range", f.name, f.v)
		}
	}
	if c.Dim%c.NHeads != 0 {
		return fmt.Errorf("header: dim %d is not a multiple of n_heads %d", c.Dim, c.NHeads)
	}
	if c.NKVHeads > c.NHeads || c.NHeads%c.NKVHeads != 0 {
		return fmt.Errorf("header: n_heads %d is not a multiple of n_kv_heads %d", c.NHeads, c.NKVHeads)
	}
	if c.HeadDim()%2 != 0 {
		return fmt.Errorf("header: head size %d is odd", c.HeadDim())
	}
	if c.Version == 2 {
		if c.GroupSize <= 0 || c.Dim%c.GroupSize != 0 || c.HiddenDim%c.GroupSize != 0 {
			return fmt.Errorf("header: group size %d does not divide dim %d and hidden_dim %d", c.GroupSize, c.Dim, c.HiddenDim)
		}
	}
	return nil
}

// shape is one logical tensor: GGUF name and ggml dims.
type shape struct {
	name string
	dims []uint64
}

func (s shape) elems() uint64 {
	n := uint64(1)
	for _, d := range s.dims {
		n *= d
	}
	return n
}

// Arch is the architecture every llama2.c checkpoint is: llama.
func Arch() *arch.Arch { return arch.Lookup("llama") }

func (c Config) dims() arch.Dims {
	return arch.Dims{Embd: c.Dim, Heads: c.NHeads, KVHeads: c.NKVHeads, HeadDim: c.HeadDim(), FFN: c.HiddenDim,
		Vocab: c.VocabSize, Tied: c.SharedClassifier}
}

// named lists the tensors of role r (one per layer for block tensors) under
// the names and shapes llama's declaration gives them; none when the
// checkpoint has no such tensor (output.weight with a shared classifier).
func (c Config) named(r arch.Role) []shape {
	a := Arch()
	t, ok := a.ByRole(r)
	d := c.dims()
	if !ok || !t.In(d) {
		return nil
	}
	var dims []uint64
	for _, x := range t.Shape(d) {
		dims = append(dims, uint64(x))
	}
	if r == arch.TokenEmbd || r == arch.OutputNorm || r == arch.Output {
		return []shape{{t.Name, dims}}
	}
	out := make([]shape, c.NLayers)
	for l := range out {
		out[l] = shape{arch.BlockName(l, t.Name), dims}
	}
	return out
}

// roles lists the tensors of each role in turn, the order a format stores
// them in.
func (c Config) roles(rs ...arch.Role) [][]shape {
	out := make([][]shape, len(rs))
	for i, r := range rs {
		out[i] = c.named(r)
	}
	return out
}

// cursor hands out consecutive slices of b, checking every size against
// what the header promised.
type cursor struct {
	b   []byte
	off int
}

func (r *cursor) take(what string, n uint64) ([]byte, error) {
	if n > uint64(len(r.b)-r.off) {
		return nil, fmt.Errorf("%s: need %d bytes at offset %d, file has %d: truncated or header does not match", what, n, r.off, len(r.b))
	}
	p := r.b[r.off : r.off+int(n) : r.off+int(n)]
	r.off += int(n)
	return p, nil
}

func (c *Checkpoint) add(name string, typ quant.Type, dims []uint64, data []byte) {
	t := &Tensor{Name: name, Type: typ, Dims: dims, Data: data}
	c.Tensors = append(c.Tensors, t)
	c.index[name] = t
}

func (c *Checkpoint) f32(r *cursor, shapes ...shape) error {
	for _, s := range shapes {
		p, err := r.take(s.name, 4*s.elems())
		if err != nil {
			return err
		}
		c.add(s.name, quant.F32, s.dims, p)
	}
	return nil
}

func (c *Checkpoint) finish(r *cursor) error {
	if r.off != len(r.b) {
		return fmt.Errorf("%d bytes left over after the last tensor: the header does not describe this file", len(r.b)-r.off)
	}
	return nil
}

func (c *Checkpoint) readLegacy(b []byte, off int) error {
	cfg := c.Config
	r := &cursor{b: b, off: off}
	order := cfg.roles(arch.TokenEmbd, arch.AttnNorm, arch.AttnQ, arch.AttnK, arch.AttnV, arch.AttnOut,
		arch.FFNNorm, arch.FFNGate, arch.FFNDown, arch.FFNUp, arch.OutputNorm)
	for _, group := range order {
		if err := c.f32(r, group...); err != nil {
			return err
		}
	}
	// The precomputed RoPE tables (freq_cis_real, freq_cis_imag) hold the
	// standard θ=10000 frequencies; the engine computes its own.
	if _, err := r.take("freq_cis", 2*4*uint64(cfg.SeqLen)*uint64(cfg.HeadDim()/2)); err != nil {
		return err
	}
	if err := c.f32(r, cfg.named(arch.Output)...); err != nil {
		return err
	}
	return c.finish(r)
}

func (c *Checkpoint) readV1(b []byte, off int) error {
	cfg := c.Config
	r := &cursor{b: b, off: off}
	groups := cfg.roles(arch.AttnNorm, arch.FFNNorm, arch.OutputNorm, arch.TokenEmbd, arch.AttnQ, arch.AttnK,
		arch.AttnV, arch.AttnOut, arch.FFNGate, arch.FFNDown, arch.FFNUp, arch.Output)
	for _, g := range groups {
		if err := c.f32(r, g...); err != nil {
			return err
		}
	}
	return c.finish(r)
}

func (c *Checkpoint) readV2(b []byte, off int) error {
	cfg := c.Config
	r := &cursor{b: b, off: off}
	norms := cfg.roles(arch.AttnNorm, arch.FFNNorm, arch.OutputNorm)
	for _, g := range norms {
		for _, s := range g {
			p, err := r.take(s.name, 4*s.elems())
			if err != nil {
				return err
			}
			// Copied: the mapping of a version 2 file is released at load.
			c.add(s.name, quant.F32, s.dims, append([]byte(nil), p...))
		}
	}
	mats := cfg.roles(arch.TokenEmbd, arch.AttnQ, arch.AttnK, arch.AttnV, arch.AttnOut, arch.FFNGate,
		arch.FFNDown, arch.FFNUp, arch.Output)
	gs := uint64(cfg.GroupSize)
	for _, g := range mats {
		for _, s := range g {
			n := s.elems()
			q, err := r.take(s.name+" (int8)", n)
			if err != nil {
				return err
			}
			sc, err := r.take(s.name+" (scales)", 4*(n/gs))
			if err != nil {
				return err
			}
			typ, data := dequantGroups(q, sc, cfg.GroupSize, s.dims[0])
			c.add(s.name, typ, s.dims, data)
		}
	}
	return c.finish(r)
}

// dequantGroups expands int8 values with one float32 scale per group of gs
// into Q8_0 when that is lossless, F32 otherwise.
func dequantGroups(q, scales []byte, gs int, rowLen uint64) (quant.Type, []byte) {
	le := binary.LittleEndian
	ngroups := len(scales) / 4
	if gs%32 == 0 && rowLen%32 == 0 {
		halves := make([]uint16, ngroups)
		exact := true
		for g := range halves {
			var ok bool
			halves[g], ok = exactF16(math.Float32frombits(le.Uint32(scales[4*g:])))
			if !ok {
				exact = false
				break
			}
		}
		if exact {
			nblk := len(q) / 32
			out := make([]byte, nblk*34)
			for blk := 0; blk < nblk; blk++ {
				o := out[blk*34:]
				le.PutUint16(o, halves[blk*32/gs])
				copy(o[2:34], q[blk*32:blk*32+32])
			}
			return quant.Q8_0, out
		}
	}
	out := make([]byte, 4*len(q))
	for g := 0; g < ngroups; g++ {
		s := math.Float32frombits(le.Uint32(scales[4*g:]))
		for i := g * gs; i < (g+1)*gs; i++ {
			le.PutUint32(out[4*i:], math.Float32bits(float32(int8(q[i]))*s))
		}
	}
	return quant.F32, out
}

// exactF16 returns the IEEE half encoding of f when f converts without
// rounding (finite values only).
func exactF16(f float32) (uint16, bool) {
	u := math.Float32bits(f)
	sign := uint16(u>>16) & 0x8000
	exp := int(u>>23&0xff) - 127
	mant := u & 0x7fffff
	switch {
	case u&0x7fffffff == 0:
		return sign, true
	case exp == 128:
		return 0, false // Inf/NaN
	case exp >= -14 && exp <= 15:
		if mant&0x1fff != 0 {
			return 0, false
		}
		return sign | uint16(exp+15)<<10 | uint16(mant>>13), true
	case exp >= -24 && exp < -14:
		// Half subnormal: value = m · 2^-24 with m < 1024.
		full := mant | 0x800000 // 24-bit significand, value = full · 2^(exp-23)
		shift := uint(-1 - exp) // to units of 2^-24: full >> (-(exp-23) - 24)
		if shift >= 32 || full&(1<<shift-1) != 0 {
			return 0, false
		}
		return sign | uint16(full>>shift), true
	}
	return 0, false
}
