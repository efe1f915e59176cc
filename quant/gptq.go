package quant

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// GPTQ and AWQ checkpoints (Hugging Face safetensors with a
// quantization_config) store each linear layer as integer codes q, per-group
// scales s and zero points z, with w = (q − z)·s. Pagoda repacks them at
// load into two block types of its own, 32 input columns a block, each block
// lying within one quantization group and carrying that group's scale and
// zero for its output row:
//
//	GQ4: d f16 (the checkpoint's scale, bit for bit), z u8 (0..16), one
//	     unused byte, 16 bytes of nibbles in Q4_0's order (byte j holds
//	     column j in its low nibble and column j+16 in its high one).
//	GQ8: d f16, z u16 little-endian (0..256), 32 bytes q.
//
// Dequantization is float32(q − z)·d, GPTQ's (q − z)·s computed in float32:
// exact, since |q − z| < 2^9 and d has an 11-bit significand. The types are
// Pagoda's alone: they are never read from or written to GGUF files (Known
// is false and ParseType does not name them).
const (
	GQ4 Type = 0x10004
	GQ8 Type = 0x10008
)

func init() {
	types[GQ4] = typeInfo{"GQ4", 32, 20, true}
	types[GQ8] = typeInfo{"GQ8", 32, 36, true}
}

func dequantGQ4(b []byte, y []float32) {
	d := f16At(b, 0)
	z := int32(b[2])
	qs := b[4:20]
	y = y[:32]
	for j := 0; j < 16; j++ {
		y[j] = float32(int32(qs[j]&0xf)-z) * d
		y[j+16] = float32(int32(qs[j]>>4)-z) * d
	}
}

func dequantGQ8(b []byte, y []float32) {
	d := f16At(b, 0)
	z := int32(binary.LittleEndian.Uint16(b[2:]))
	qs := b[4:36]
	y = y[:32]
	for j := range y {
		y[j] = float32(int32(qs[j])-z) * d
	}
}

// GQBlock reads one GQ4 or GQ8 block: its f16 scale bits, zero point and
// the 32 integer codes in column order (into q).
func GQBlock(t Type, b []byte, q *[32]uint8) (scale uint16, zero int) {
	scale = binary.LittleEndian.Uint16(b)
	switch t {
	case GQ4:
		for j := 0; j < 16; j++ {
			q[j], q[j+16] = b[4+j]&0xf, b[4+j]>>4
		}
		return scale, int(b[2])
	case GQ8:
		copy(q[:], b[4:36])
		return scale, int(binary.LittleEndian.Uint16(b[2:]))
	}
	panic(fmt.Sprintf("quant: GQBlock of %s", t))
}

// QuantConfig is a checkpoint's quantization_config (config.json), or its
// quantize_config.json (AutoGPTQ) or quant_config.json (AutoAWQ), checked.
type QuantConfig struct {
	Method    string // "gptq" or "awq"
	Bits      int    // 4, or 8 for GPTQ
	GroupSize int    // input columns per group; -1: one group per output channel
	DescAct   bool   // GPTQ act-order: g_idx permutes columns into groups
	Sym       bool
	// ZeroOffset is added to every stored zero point: 1 for GPTQ's v1
	// checkpoint format (AutoGPTQ stores z − 1), 0 for gptq_v2 and AWQ.
	ZeroOffset int
	// Format is GPTQ's checkpoint_format ("gptq" or "gptq_v2") or AWQ's
	// version ("gemm").
	Format string
	LMHead bool // lm_head is quantized too
}

// rawQuantConfig is the JSON as the tools write it: AutoGPTQ/GPTQModel and
// transformers use bits/group_size, AutoAWQ's own file w_bit/q_group_size.
type rawQuantConfig struct {
	QuantMethod      *string `json:"quant_method"`
	Bits             *int    `json:"bits"`
	WBit             *int    `json:"w_bit"`
	GroupSize        *int    `json:"group_size"`
	QGroupSize       *int    `json:"q_group_size"`
	DescAct          *bool   `json:"desc_act"`
	Sym              *bool   `json:"sym"`
	CheckpointFormat *string `json:"checkpoint_format"`
	Version          *string `json:"version"`
	ZeroPoint        *bool   `json:"zero_point"`
	LMHead           *bool   `json:"lm_head"`
	IsMarlinFormat   *bool   `json:"is_marlin_format"`
}

// ParseQuantConfig parses a quantization_config object. method is the
// method to assume when the object names none ("gptq" for
// quantize_config.json, "awq" for quant_config.json, "" to require one).
// Unsupported methods, bit widths, group sizes and formats are errors.
func ParseQuantConfig(b []byte, method string) (*QuantConfig, error) {
	var r rawQuantConfig
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	if r.QuantMethod != nil {
		method = strings.ToLower(*r.QuantMethod)
	}
	c := &QuantConfig{Method: method, Sym: true}
	bits, gs := r.Bits, r.GroupSize
	if bits == nil {
		bits = r.WBit
	}
	if gs == nil {
		gs = r.QGroupSize
	}
	if bits == nil {
		return nil, fmt.Errorf("quant_method %q: bits missing", method)
	}
	if gs == nil {
		return nil, fmt.Errorf("quant_method %q: group_size missing", method)
	}
	c.Bits, c.GroupSize = *bits, *gs
	if r.DescAct != nil {
		c.DescAct = *r.DescAct
	}
	if r.Sym != nil {
		c.Sym = *r.Sym
	}
	if r.LMHead != nil {
		c.LMHead = *r.LMHead
	}
	if c.GroupSize != -1 && (c.GroupSize <= 0 || c.GroupSize%32 != 0) {
		return nil, fmt.Errorf("quant_method %q: group_size %d not supported (a positive multiple of 32, or -1 for per-channel)", method, c.GroupSize)
	}
	switch method {
	case "gptq":
		if c.Bits != 4 && c.Bits != 8 {
			return nil, fmt.Errorf("quant_method \"gptq\": %d bits not supported (4 or 8)", c.Bits)
		}
		c.Format = "gptq"
		if r.CheckpointFormat != nil {
			c.Format = strings.ToLower(*r.CheckpointFormat)
		}
		if r.IsMarlinFormat != nil && *r.IsMarlinFormat {
			return nil, fmt.Errorf("quant_method \"gptq\": is_marlin_format (Marlin's repacked layout) not supported")
		}
		switch c.Format {
		case "gptq":
			c.ZeroOffset = 1
		case "gptq_v2":
		default:
			return nil, fmt.Errorf("quant_method \"gptq\": checkpoint_format %q not supported (gptq, gptq_v2)", c.Format)
		}
	case "awq":
		if c.Bits != 4 {
			return nil, fmt.Errorf("quant_method \"awq\": %d bits not supported (4)", c.Bits)
		}
		if c.GroupSize == -1 {
			return nil, fmt.Errorf("quant_method \"awq\": group_size -1 not supported")
		}
		c.Format = "gemm"
		if r.Version != nil {
			c.Format = strings.ToLower(*r.Version)
		}
		if c.Format != "gemm" {
			return nil, fmt.Errorf("quant_method \"awq\": version %q not supported (gemm)", c.Format)
		}
		if r.ZeroPoint != nil && !*r.ZeroPoint {
			return nil, fmt.Errorf("quant_method \"awq\": zero_point false not supported")
		}
		c.Sym, c.DescAct = false, false
	case "":
		return nil, fmt.Errorf("quant_method missing")
	default:
		return nil, fmt.Errorf("quant_method %q not supported (gptq, awq)", method)
	}
	return c, nil
}

// Type is the block type the layers repack into: GQ4 or GQ8.
func (c *QuantConfig) Type() Type {
	if c.Bits == 8 {
		return GQ8
	}
	return GQ4
}

// PackedTensor is one stored tensor of a quantized linear layer as the
// checkpoint holds it: safetensors dtype, PyTorch shape, little-endian
// bytes. Name is used in errors.
type PackedTensor struct {
	Name  string
	DType string
	Shape []int64
	Data  []byte
}

// Repacked is a quantized linear layer in Pagoda's layout: Rows output rows
// of Cols/32 blocks of Type. When Perm is not nil (GPTQ act-order), stored
// column j is input column Perm[j].
type Repacked struct {
	Type       Type
	Rows, Cols int
	Data       []byte
	Perm       []int32
}

// Linear holds the tensors of one quantized layer; GIdx may be nil.
type Linear struct {
	QWeight, QZeros, Scales, GIdx *PackedTensor
}

func (t *PackedTensor) check(dtype string, shape ...int) error {
	if t.DType != dtype {
		return fmt.Errorf("tensor %q: dtype %s, want %s", t.Name, t.DType, dtype)
	}
	ok := len(t.Shape) == len(shape)
	n := 1
	for i := 0; ok && i < len(shape); i++ {
		ok = t.Shape[i] == int64(shape[i])
		n *= shape[i]
	}
	if !ok {
		return fmt.Errorf("tensor %q: shape %v, want %v", t.Name, t.Shape, shape)
	}
	size := n * 4
	if dtype == "F16" {
		size = n * 2
	}
	if len(t.Data) < size {
		return fmt.Errorf("tensor %q: %d bytes, want %d", t.Name, len(t.Data), size)
	}
	return nil
}

func (t *PackedTensor) u32(i int) uint32 { return binary.LittleEndian.Uint32(t.Data[4*i:]) }

// Repack checks one layer's tensors against the config and the layer's
// shape (out×in, as the model declares it) and repacks them. Errors name
// the offending tensor.
func (c *QuantConfig) Repack(l Linear, out, in int) (*Repacked, error) {
	pl, err := c.plan(l, out, in)
	if err != nil {
		return nil, err
	}
	q, zero, perm, bg := pl.q, pl.zero, pl.perm, pl.bg
	blocks := in / 32
	r := &Repacked{Type: c.Type(), Rows: out, Cols: in, Perm: pl.perm}
	if perm == nil {
		perm = make([]int32, in)
		for k := range perm {
			perm[k] = int32(k)
		}
	}
	ts := r.Type.TypeSize()
	rb := blocks * ts
	r.Data = make([]byte, out*rb)
	for n := 0; n < out; n++ {
		row := r.Data[n*rb : (n+1)*rb]
		for b := 0; b < blocks; b++ {
			g := bg[b]
			blk := row[b*ts : (b+1)*ts]
			copy(blk, l.Scales.Data[2*(g*out+n):2*(g*out+n)+2])
			z := zero(g, n)
			cols := perm[32*b : 32*b+32]
			if r.Type == GQ4 {
				blk[2] = uint8(z)
				for j := 0; j < 16; j++ {
					blk[4+j] = q(int(cols[j]), n) | q(int(cols[j+16]), n)<<4
				}
			} else {
				binary.LittleEndian.PutUint16(blk[2:], uint16(z))
				for j := 0; j < 32; j++ {
					blk[4+j] = q(int(cols[j]), n)
				}
			}
		}
	}
	return r, nil
}

// LayerInfo is what a layer repacks to without repacking it: its column
// permutation (nil unless act-order reorders columns) and, when every
// group of every output shares one zero point, that zero (else -1).
type LayerInfo struct {
	Perm []int32
	Zero int
}

// Describe checks a layer as Repack does and reads only its zeros and
// g_idx.
func (c *QuantConfig) Describe(l Linear, out, in int) (LayerInfo, error) {
	pl, err := c.plan(l, out, in)
	if err != nil {
		return LayerInfo{}, err
	}
	info := LayerInfo{Perm: pl.perm, Zero: pl.zero(0, 0)}
	for g := 0; g < pl.ng && info.Zero >= 0; g++ {
		for n := 0; n < out; n++ {
			if pl.zero(g, n) != info.Zero {
				info.Zero = -1
				break
			}
		}
	}
	return info, nil
}

// layerPlan is a checked layer: code and zero accessors, the column
// permutation (nil for the identity) and each 32-column block's group.
type layerPlan struct {
	q    func(k, n int) uint8
	zero func(g, n int) int
	perm []int32
	bg   []int
	ng   int
}

func (c *QuantConfig) plan(l Linear, out, in int) (*layerPlan, error) {
	if l.QWeight == nil || l.QZeros == nil || l.Scales == nil {
		var miss []string
		for _, p := range []struct {
			n string
			t *PackedTensor
		}{{"qweight", l.QWeight}, {"qzeros", l.QZeros}, {"scales", l.Scales}} {
			if p.t == nil {
				miss = append(miss, p.n)
			}
		}
		return nil, fmt.Errorf("%s layer: %s missing", c.Method, strings.Join(miss, ", "))
	}
	if in <= 0 || out <= 0 || in%32 != 0 {
		return nil, fmt.Errorf("tensor %q: %d input columns, want a positive multiple of 32", l.QWeight.Name, in)
	}
	gs := c.GroupSize
	if gs == -1 {
		gs = in
	}
	if in%gs != 0 {
		return nil, fmt.Errorf("tensor %q: %d input columns do not split into groups of %d", l.QWeight.Name, in, gs)
	}
	ng := in / gs
	per := 32 / c.Bits
	mask := uint32(1)<<c.Bits - 1
	if out%per != 0 {
		return nil, fmt.Errorf("tensor %q: %d output rows, want a multiple of %d", l.QZeros.Name, out, per)
	}
	if err := l.Scales.check("F16", ng, out); err != nil {
		return nil, err
	}
	if err := l.QZeros.check("I32", ng, out/per); err != nil {
		return nil, err
	}
	for i := 0; i < ng*out; i++ {
		if binary.LittleEndian.Uint16(l.Scales.Data[2*i:])&0x7c00 == 0x7c00 {
			return nil, fmt.Errorf("tensor %q holds non-finite scales (at [%d, %d])", l.Scales.Name, i/out, i%out)
		}
	}
	// q(k, n) and zero(g, n): the code of input column k for output n.
	var q func(k, n int) uint8
	var zero func(g, n int) int
	if c.Method == "awq" {
		// AutoAWQ GEMM: both packed along the output dimension, 8 nibbles
		// a word in the order [0 2 4 6 1 3 5 7]: output column 8c+j is
		// nibble awqNibble[j] of word c.
		if err := l.QWeight.check("I32", in, out/8); err != nil {
			return nil, err
		}
		q = func(k, n int) uint8 {
			return uint8(l.QWeight.u32(k*(out/8)+n/8) >> (4 * awqNibble[n%8]) & 0xf)
		}
		zero = func(g, n int) int {
			return int(l.QZeros.u32(g*(out/8)+n/8) >> (4 * awqNibble[n%8]) & 0xf)
		}
	} else {
		// GPTQ: codes packed along the input dimension (word k/per of
		// column n, bits·(k%per) up), zeros along the output one.
		if err := l.QWeight.check("I32", in/per, out); err != nil {
			return nil, err
		}
		q = func(k, n int) uint8 {
			return uint8(l.QWeight.u32(k/per*out+n) >> (c.Bits * (k % per)) & mask)
		}
		zero = func(g, n int) int {
			return int(l.QZeros.u32(g*(out/per)+n/per)>>(c.Bits*(n%per))&mask) + c.ZeroOffset
		}
	}
	// group[k] is input column k's group; perm sorts columns by group.
	group := make([]int32, in)
	for k := range group {
		group[k] = int32(k / gs)
	}
	if l.GIdx != nil && c.Method == "gptq" {
		if err := l.GIdx.check("I32", in); err != nil {
			return nil, err
		}
		for k := range group {
			g := int32(l.GIdx.u32(k))
			if g < 0 || int(g) >= ng {
				return nil, fmt.Errorf("tensor %q: g_idx[%d] = %d outside the %d groups", l.GIdx.Name, k, g, ng)
			}
			group[k] = g
		}
	} else if c.DescAct && c.Method == "gptq" {
		return nil, fmt.Errorf("tensor %q: desc_act is set but g_idx is missing", l.QWeight.Name)
	}
	gidxName := l.QWeight.Name
	if l.GIdx != nil {
		gidxName = l.GIdx.Name
	}
	perm := make([]int32, in)
	for k := range perm {
		perm[k] = int32(k)
	}
	sort.SliceStable(perm, func(a, b int) bool { return group[perm[a]] < group[perm[b]] })
	identity := true
	for j, k := range perm {
		identity = identity && int(k) == j
	}
	blocks := in / 32
	bg := make([]int, blocks) // each block's group
	for b := range bg {
		g0, g1 := group[perm[32*b]], group[perm[32*b+31]]
		if g0 != g1 {
			return nil, fmt.Errorf("tensor %q: g_idx groups are not whole blocks of 32 columns (columns of groups %d and %d share block %d)", gidxName, g0, g1, b)
		}
		bg[b] = int(g0)
	}
	pl := &layerPlan{q: q, zero: zero, bg: bg, ng: ng}
	if !identity {
		pl.perm = perm
	}
	return pl, nil
}

// awqNibble[j] is the nibble of a packed AWQ word that holds output column
// 8c+j (the inverse of AutoAWQ's pack order [0 2 4 6 1 3 5 7]).
var awqNibble = [8]int{0, 4, 1, 5, 2, 6, 3, 7}
